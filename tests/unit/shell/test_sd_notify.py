"""sd_notify against real AF_UNIX datagram sockets bound here, and SIGTERM as systemd's stop sends it."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, TINY_TRAINER
from snapshots import snapshot

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.shell.log import capture_logs
from esiwrap.shell.systemd import notify
from esiwrap.shell.systemd.notify import STATUS_REFRESH_S, Notifier, watchdog_interval_s
from esiwrap.shell.systemd.status_line import human_duration, status_parts
from esiwrap.shell.systemd.unit import shipped_template


class NotifySocket:
    """What systemd listens on: a datagram socket at a path or in the abstract namespace, read
    all the time by a thread (as systemd does: the kernel queues only a few datagrams)."""

    def __init__(self, tmp_path: Path, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"esiwrap-test-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.env_value = "@" + name
        else:
            path = tmp_path / "notify.sock"
            self.sock.bind(str(path))
            self.env_value = str(path)
        self.received: list[str] = []
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                return
            if not data:  # shut down (esiwrap never sends an empty datagram)
                return
            with self._arrived:
                self.received.append(data.decode())
                self._arrived.notify_all()

    def next(self, timeout: float = 5.0) -> str:
        """The first datagram not returned by an earlier call."""
        with self._arrived:
            wanted = self._taken = getattr(self, "_taken", 0) + 1
            assert self._arrived.wait_for(lambda: len(self.received) >= wanted, timeout), "no datagram"
            return self.received[wanted - 1]

    def close(self) -> list[str]:
        """Stop reading; everything that arrived."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(timeout=5)
        return list(self.received)


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path, abstract=request.param == "abstract")
    yield sock
    sock.close()


def test_notifier_datagrams(listener: NotifySocket) -> None:
    """One datagram per message; STATUS only on a change (volatile parts at most every
    STATUS_REFRESH_S); STOPPING once; EXTEND_TIMEOUT_USEC only while stopping, in microseconds."""
    n = Notifier.from_environ({"NOTIFY_SOCKET": listener.env_value})
    assert n.enabled
    n.ready("deadline A", "5m left", mono=100.0)
    assert listener.next() == "READY=1\nSTATUS=deadline A; 5m left"
    n.status("deadline A", "5m left", mono=101.0)  # unchanged: nothing
    n.status("deadline A", "4m left", mono=102.0)  # volatile change too soon: nothing
    n.extend_stop(3.0)  # not stopping: nothing
    n.status("deadline B", "4m left", mono=103.0)  # stable change: at once
    assert listener.next() == "STATUS=deadline B; 4m left"
    n.status("deadline B", "3m left", mono=103.0 + STATUS_REFRESH_S)
    assert listener.next() == "STATUS=deadline B; 3m left"
    n.stopping()
    n.stopping()
    n.extend_stop(1.5)
    n.status("deadline C", "", mono=200.0)
    assert [listener.next() for _ in range(3)] == [
        "STOPPING=1", "EXTEND_TIMEOUT_USEC=1500000", "STATUS=deadline C"]


def test_watchdog_pings_at_half_the_interval(listener: NotifySocket) -> None:
    """WATCHDOG_USEC=2 s: the loop timer says 1 s, and a due ping sends WATCHDOG=1."""
    env = {"NOTIFY_SOCKET": listener.env_value, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    n = Notifier.from_environ(env)
    n.ready("s", "", mono=10.0)
    listener.next()
    assert n.ping_in(10.0) == 1.0 and n.ping_in(10.5) == 0.5
    n.ping_if_due(10.5)  # not yet
    n.ping_if_due(11.0)
    assert listener.next() == "WATCHDOG=1"
    assert n.ping_in(11.0) == 1.0


def test_watchdog_belongs_to_its_pid() -> None:
    """WATCHDOG_PID naming another process (a leaked variable) or a bad value: no watchdog."""
    assert watchdog_interval_s({"WATCHDOG_USEC": "3000000"}, pid=42) == 1.5
    assert watchdog_interval_s({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "42"}, pid=42) == 1.5
    assert watchdog_interval_s({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "7"}, pid=42) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "soon"}, pid=42) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}, pid=42) is None
    assert Notifier.from_environ({"WATCHDOG_USEC": "3000000"}).ping_in(0.0) == float("inf")


def test_outside_systemd_or_with_a_gone_socket_nothing_breaks(tmp_path: Path) -> None:
    """No NOTIFY_SOCKET: nothing is sent. A socket that went away: one warning, never an exception."""
    quiet = Notifier.from_environ({})
    assert not quiet.enabled
    quiet.ready("s", "v", 0.0)
    quiet.stopping()
    gone = NotifySocket(tmp_path, abstract=False)
    gone.close()
    os.unlink(gone.env_value)
    with capture_logs() as logs:
        n = Notifier.from_environ({"NOTIFY_SOCKET": gone.env_value})
        n.ready("s", "v", 0.0)
        n.stopping()
        n.extend_stop(1.0)
    assert [e["event"] for e in logs] == ["systemd_notify_failed"]
    assert notify.socket_address("vsock:2:1234") is None


def test_status_line_parts() -> None:
    """The stable half names deadline, source and the planned save; the volatile half counts down."""
    facts = snapshot(1000.0, "running", deadline_at=4600.0, deadline_source="env:MLP",
                     next_save_kind="insurance", next_save_at=4300.0, last_step=12, step_estimate_s=1.5,
                     last_checkpoint_step=10)
    assert status_parts(facts) == (
        "deadline 1970-01-01T01:16:40Z (env:MLP), insurance save at 1970-01-01T01:11:40Z, "
        "checkpoint at step 10",
        "60m left, save in 55m, step 12 (~1.5s/step)",
    )
    saving = snapshot(1000.0, "draining", requested_save_kind="sigterm", saving_step=13)
    assert status_parts(saving) == (
        "no deadline known, stop requested, waiting for the checkpoint, "
        "writing sigterm checkpoint of step 13", "")
    assert [human_duration(s) for s in (5, 119, 2520, 18180, 190800, -3)] == [
        "5s", "119s", "42m", "5h03m", "2d05h", "overdue 3s"]


def _unit_stop_timeout_s() -> float:
    match = re.search(r"^TimeoutStopSec=(\d+)min$", shipped_template(), re.MULTILINE)
    assert match is not None
    return int(match.group(1)) * 60.0


def test_child_environment_has_no_notify_or_watchdog(esiwrap, tmp_path: Path) -> None:
    """The command never sees NOTIFY_SOCKET/WATCHDOG_*: they are esiwrap's (READY=1 still comes)."""
    listener = NotifySocket(tmp_path, abstract=True)
    env = {"NOTIFY_SOCKET": listener.env_value, "WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}
    show = 'echo "notify=${NOTIFY_SOCKET-unset} usec=${WATCHDOG_USEC-unset} pid=${WATCHDOG_PID-unset}"'
    run = esiwrap("--", "sh", "-c", show, env=env)
    assert run.finish(timeout=30) == 0
    assert run.stdout.decode().strip() == "notify=unset usec=unset pid=unset"
    assert listener.next().startswith("READY=1\nSTATUS=")
    listener.close()


def test_systemd_stop_checkpoints_within_the_stop_timeout(esiwrap, tmp_path: Path) -> None:
    """SIGTERM mid-run, as `systemctl stop` sends it: save requested, written (longer than
    --stop-grace, so the wait is extended), acknowledged, child stopped, exit 75, well within
    TimeoutStopSec. The datagrams say READY, STATUS changes, STOPPING once, EXTEND_TIMEOUT_USEC
    while the checkpoint runs, WATCHDOG."""
    listener = NotifySocket(tmp_path, abstract=False)
    env = {"NOTIFY_SOCKET": listener.env_value, "WATCHDOG_USEC": "1000000"}
    run = esiwrap("--deadline", "+10m", "--save-duration", "2", "--stop-grace", "2", "--",
                  PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(tmp_path / "ckpt"),
                  "--step-seconds", "0.3", "--save-seconds", "4", env=env)
    resolved = run.wait_event("deadline_resolved", timeout=30)
    run.wait_event("trainer_attached", timeout=60)
    sent = time.monotonic()
    os.kill(run.pid, signal.SIGTERM)
    run.wait_event("save_requested", timeout=10, reason="sigterm")
    run.wait_event("stop_extended", timeout=10)
    completed = run.wait_event("save_completed", timeout=20)
    run.wait_event("child_stopping", timeout=10)
    assert run.finish(timeout=30) == EXIT_CHECKPOINTED
    elapsed = time.monotonic() - sent
    assert run.first("child_exited")["signal"] == "SIGTERM"
    assert elapsed < _unit_stop_timeout_s()  # systemd's SIGKILL comes after TimeoutStopSec (5 min)
    assert completed["duration_s"] >= 4

    got = listener.close()
    kinds = [d.split("=", 1)[0] for d in got]
    assert set(kinds) == {"READY", "STATUS", "STOPPING", "EXTEND_TIMEOUT_USEC", "WATCHDOG"}
    # --deadline is known before the child starts: the very first status line already says it
    assert got[0].startswith("READY=1\nSTATUS=deadline ") and "(cli)" in got[0].split("\n")[1]
    assert all(d.count("\n") == 0 for d in got[1:])
    statuses = [d[len("STATUS="):] for d in got if d.startswith("STATUS=")]
    deadline_text = f"deadline {resolved['deadline'][:19]}Z (cli), insurance save at "
    assert statuses[0].startswith(deadline_text)
    stopping = kinds.index("STOPPING")
    assert kinds.count("STOPPING") == 1 and kinds.count("WATCHDOG") >= 3
    extends = [int(d.split("=")[1]) for d in got if d.startswith("EXTEND_TIMEOUT_USEC=")]
    assert kinds.index("EXTEND_TIMEOUT_USEC") > stopping and len(extends) == 3  # SIGTERM, extension, stop
    # SIGTERM: the wait plus the stop (~14 s); a save being written: up to 3x the unmeasured save
    # estimate (2 s x 6) plus the stop (~48 s); the stop itself (~12 s): all far below the unit's 5 min
    assert all(11_000_000 <= usec <= 60_000_000 for usec in extends)
    after = [d[len("STATUS="):] for d in got[stopping:] if d.startswith("STATUS=")]
    step = completed["step"]
    assert any("stop requested, waiting for the checkpoint" in s for s in after)
    assert any(f"writing sigterm checkpoint of step {step}" in s for s in after)
    assert after[-1].startswith(f"{deadline_text[:-len(', insurance save at ')]}, stopping: "
                                f"checkpoint complete after sigterm, checkpoint at step {step}")
