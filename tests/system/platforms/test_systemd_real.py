"""The shipped template unit under a real systemd manager (systemd_namespace.py: PID 1 of a
private namespace, never acting on the host), checked from systemd's own view: `systemctl show`
and the journal.

Jobs are installed the way a user installs them (`esiwrap systemd-unit --install JOB ...`), with
one test drop-in for the template (TMPDIR: the host's /tmp is read-only in the namespace) and,
where a test needs it, one for its job (a short TimeoutStopSec, a long RestartSec).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, ROOT, TINY_TRAINER
from systemd_namespace import CGROUP_V1, SystemdNamespace

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_USAGE
from esiwrap.times import iso_epoch

pytestmark = pytest.mark.system

ESIWRAP = Path(PYTHON).parent / "esiwrap"
JOBS = ("train", "slow", "bad", "crash")
SLOW_SAVE_S = 4.0
SHORT_STOP_TIMEOUT_S = 2
STATE = ("ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode", "NRestarts",
         "StatusText", "InvocationID", "ActiveEnterTimestampMonotonic", "ActiveExitTimestampMonotonic",
         "InactiveEnterTimestampMonotonic", "TimeoutStopUSec", "ExecMainPID",
         "ExecMainStartTimestampMonotonic")


def unit(job: str) -> str:
    return f"esiwrap@{job}.service"


def install(root: Path, job: str, command: list[str], *settings: str) -> None:
    """`esiwrap systemd-unit --install JOB -- COMMAND` into the namespace's unit path."""
    setenv = [arg for pair in settings for arg in ("--setenv", pair)]
    done = subprocess.run(
        [PYTHON, "-m", "esiwrap", "systemd-unit", "--install", job, "--unit-dir", str(root / "units"),
         "--env-dir", str(root / "env"), "--esiwrap-path", str(ESIWRAP), "--workdir", str(root / "work"),
         "--force", *setenv, "--", *command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def trainer(root: Path, job: str, *extra: str) -> list[str]:
    return [PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(root / "work" / job), "--step-seconds", "0.2",
            *extra]


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdNamespace]:
    root = tmp_path_factory.mktemp("systemd")
    for sub in ("env", "work", "tmp"):
        (root / sub).mkdir()
    install(root, "train", trainer(root, "train"), "ESIWRAP_DEADLINE=+1h")
    install(root, "slow", trainer(root, "slow", "--save-seconds", str(SLOW_SAVE_S)), "ESIWRAP_DEADLINE=+1h")
    install(root, "bad", ["/bin/true"])
    with open(root / "env" / "bad.env", "a") as env:  # what a typo in the job's file looks like
        env.write('ESIWRAP_STOP_GRACE="soon"\n')
    install(root, "crash", ["/bin/sh", "-c", "exit 1"])
    namespace = SystemdNamespace(root, keep_loaded=[unit(job) for job in JOBS])
    namespace.write_unit("esiwrap@.service.d/20-test.conf",
                         f"[Service]\nEnvironment=TMPDIR={root / 'tmp'}\n")
    namespace.write_unit(f"{unit('slow')}.d/30-short-stop.conf",
                         f"[Service]\nTimeoutStopSec={SHORT_STOP_TIMEOUT_S}s\n")
    namespace.write_unit(f"{unit('crash')}.d/30-restart-later.conf", "[Service]\nRestartSec=1h\n")
    namespace.start()
    try:
        yield namespace
    finally:
        namespace.stop()


def events(lines: list[str]) -> list[dict[str, object]]:
    found = []
    for line in lines:
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def esiwrap_event(name: str):  # type: ignore[no-untyped-def]
    return lambda line: line.startswith("{") and f'"event":"{name}"' in line


def test_manager_is_confined(manager: SystemdNamespace) -> None:
    """The manager knows it is in a container, lives in its own sub-cgroup, lacks the
    capabilities that act on the host, and sees the host read-only (only the test's directory
    is writable); it came up in well under a few seconds."""
    assert manager.show("init.scope", "ActiveState") == {"ActiveState": "active"}
    virtualization = manager.systemctl("show", "-p", "Virtualization").stdout.strip()
    assert virtualization == "Virtualization=container-other"
    assert manager.pid1 is not None
    host_view = Path(f"/proc/{manager.pid1}/cgroup").read_text()
    assert f"name=systemd:/{manager.cgroup_name}/init.scope" in host_view
    assert (CGROUP_V1 / "cgroup.procs").read_text().split().count(str(manager.pid1)) == 0
    bounding = int(next(line for line in Path(f"/proc/{manager.pid1}/status").read_text().splitlines()
                        if line.startswith("CapBnd:")).split()[1], 16)
    for capability in (16, 25, 22):  # CAP_SYS_MODULE, CAP_SYS_TIME, CAP_SYS_BOOT
        assert not bounding & (1 << capability)
    probes = ["mkdir /etc/esiwrap-test-probe", "mkdir /sys/esiwrap-test-probe",
              f"mkdir {ROOT / 'esiwrap-test-probe'}",  # the checkout and its venv
              # a sysctl written with the value it has: a no-op even if the probe were wrong
              "v=$(cat /proc/sys/kernel/printk_ratelimit); echo $v > /proc/sys/kernel/printk_ratelimit"]
    for probe in probes:
        refused = manager.run("sh", "-c", probe, check=False)
        assert "Read-only file system" in refused.stderr, (probe, refused.stderr)
    manager.run("sh", "-c", f"echo x > {manager.root / 'work' / 'probe'}")
    assert manager.started_s is not None and manager.started_s < 10


def test_start_ready_status_stop_checkpoint_and_resume(manager: SystemdNamespace) -> None:
    """`systemctl start` returns once esiwrap said READY=1 (its STATUS is there already); the
    STATUS shows the deadline; `systemctl stop` is a checkpoint, exit 75, Result=success; the
    next start resumes from that checkpoint."""
    started_at = time.time()
    manager.systemctl("start", unit("train"))  # Type=notify: waits for READY=1
    state = manager.show(unit("train"), *STATE)
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state
    assert state["StatusText"], state  # esiwrap's STATUS= travels with its READY=1, in one datagram
    ready_after_s = (int(state["ActiveEnterTimestampMonotonic"])
                     - int(state["ExecMainStartTimestampMonotonic"])) / 1e6
    assert ready_after_s > 0.05, state  # active once esiwrap ran the command, not at exec
    status = manager.wait_state(unit("train"), lambda s: s["StatusText"].startswith("deadline "),
                                "StatusText")["StatusText"]
    shown = re.match(r"deadline (\S+) \(cli\)", status)
    assert shown is not None, status
    deadline = iso_epoch(shown.group(1))
    assert abs(deadline - (started_at + 3600)) < 30
    first = state["InvocationID"]
    manager.wait_journal(lambda line: line.startswith("tiny_trainer: starting at step 0"), unit("train"),
                         first, what="the trainer's first line")
    manager.wait_journal(esiwrap_event("trainer_attached"), unit("train"), first, what="trainer_attached")

    manager.systemctl("stop", unit("train"))
    state = manager.show(unit("train"), *STATE)
    assert (state["ActiveState"], state["Result"]) == ("inactive", "success"), state
    assert state["ExecMainStatus"] == str(EXIT_CHECKPOINTED), state
    logged = events(manager.journal(unit("train"), first))
    saved = next(e for e in logged if e["event"] == "save_completed")
    assert saved["requested"] is True and saved["kind"] == "sigterm"
    assert logged[-1]["event"] == "supervisor_exit" and logged[-1]["code"] == EXIT_CHECKPOINTED
    assert (manager.root / "work" / "train" / "latest.pt").exists()

    manager.systemctl("start", unit("train"))
    second = manager.show(unit("train"), "InvocationID")["InvocationID"]
    assert second != first
    resumed = manager.wait_journal(lambda line: line.startswith("tiny_trainer: starting at step"),
                                   unit("train"), second, what="the resumed trainer")
    assert resumed == f"tiny_trainer: starting at step {saved['step']}"
    manager.wait_journal(esiwrap_event("trainer_attached"), unit("train"), second)
    manager.systemctl("stop", unit("train"))
    again = manager.show(unit("train"), *STATE)
    assert (again["Result"], again["ExecMainStatus"]) == ("success", str(EXIT_CHECKPOINTED)), again


def test_a_long_save_outlives_timeout_stop_sec(manager: SystemdNamespace) -> None:
    """TimeoutStopSec=2s (a drop-in), a save that takes 4 s: EXTEND_TIMEOUT_USEC keeps systemd
    from killing it; the stop ends in the checkpoint, exit 75, Result=success (not timeout)."""
    manager.systemctl("start", unit("slow"))
    invocation = manager.show(unit("slow"), "InvocationID")["InvocationID"]
    manager.wait_journal(esiwrap_event("trainer_attached"), unit("slow"), invocation, what="trainer_attached")
    manager.systemctl("stop", unit("slow"))
    state = manager.show(unit("slow"), *STATE)
    assert state["TimeoutStopUSec"] == f"{SHORT_STOP_TIMEOUT_S}s", state
    assert (state["Result"], state["ExecMainStatus"]) == ("success", str(EXIT_CHECKPOINTED)), state
    stopping_s = (int(state["InactiveEnterTimestampMonotonic"])
                  - int(state["ActiveExitTimestampMonotonic"])) / 1e6
    assert stopping_s > SLOW_SAVE_S > SHORT_STOP_TIMEOUT_S, state
    logged = events(manager.journal(unit("slow"), invocation))
    saved = next(e for e in logged if e["event"] == "save_completed")
    assert float(saved["duration_s"]) >= SLOW_SAVE_S  # type: ignore[arg-type]
    manager_lines = manager.journal(unit("slow"), _PID="1")
    assert not any("timed out" in line.lower() for line in manager_lines), manager_lines


def test_bad_configuration_is_not_restarted(manager: SystemdNamespace) -> None:
    """A typo in the job's file: esiwrap says so in one line and exits 2 before READY, so the
    unit never became active, and systemd does not restart it (RestartPreventExitStatus=2). A
    crash of the command (exit 1), by contrast, waits for its restart (auto-restart)."""
    failed = manager.systemctl("start", unit("bad"), check=False)
    assert failed.returncode != 0
    state = manager.wait_state(unit("bad"), lambda s: s["ActiveState"] == "failed", *STATE)
    assert (state["ActiveState"], state["SubState"], state["Result"]) == ("failed", "failed", "exit-code"), \
        state
    assert state["ExecMainStatus"] == str(EXIT_USAGE) and state["NRestarts"] == "0", state
    assert state["ActiveEnterTimestampMonotonic"] == "0", state  # never active: no READY=1
    said = [line for line in manager.journal(unit("bad"), SYSLOG_IDENTIFIER="esiwrap")
            if line.startswith("esiwrap:")]
    assert said == ["esiwrap: ESIWRAP_STOP_GRACE 'soon': not a number of seconds; e.g. --stop-grace 30"]

    manager.systemctl("start", unit("crash"), check=False)
    crash = manager.wait_state(unit("crash"), lambda s: s["SubState"] == "auto-restart", *STATE)
    assert (crash["SubState"], crash["ExecMainStatus"]) == ("auto-restart", "1"), crash
    bad_again = manager.show(unit("bad"), "SubState", "NRestarts")
    assert bad_again == {"SubState": "failed", "NRestarts": "0"}
