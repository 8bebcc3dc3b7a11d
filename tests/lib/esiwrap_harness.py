"""Run esiwrap as a real process and wait on its JSON log events (bounded waits, no sleeps)."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from esiwrap.times import iso_epoch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TINY_TRAINER = EXAMPLES / "tiny_trainer.py"
CHILDREN = Path(__file__).resolve().parent / "children"
SIGNAL_ECHO = CHILDREN / "signal_echo.py"
PLAIN_TRAINER = CHILDREN / "plain_trainer.py"
FINISHING_TRAINER = CHILDREN / "finishing_trainer.py"
PYTHON = sys.executable

Event = dict[str, Any]
STARTED: list[EsiwrapRun] = []  # the current test's runs: a failed test's report shows their events


class EsiwrapRun:
    """An `esiwrap` process whose stderr (JSON lines) is read as it comes."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None,
                 launcher: Sequence[str] = (PYTHON, "-m", "esiwrap")) -> None:
        full_env = dict(os.environ)
        full_env.pop("ESIWRAP_SOCKET", None)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.args = list(args)
        self.proc = subprocess.Popen(
            [*launcher, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=full_env, cwd=cwd, start_new_session=True,
        )
        self.events: list[Event] = []
        self.other_lines: list[str] = []
        self.stdout = b""
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        assert self.proc.stderr is not None and self.proc.stdout is not None
        os.set_blocking(self.proc.stderr.fileno(), False)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._selector.register(self.proc.stderr, selectors.EVENT_READ, "stderr")
        self._selector.register(self.proc.stdout, selectors.EVENT_READ, "stdout")
        self._open = 2
        STARTED.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self, timeout: float) -> bool:
        """Read what is there within `timeout`; False when both streams are closed."""
        if self._open == 0:
            return False
        for key, _ in self._selector.select(timeout):
            data = os.read(key.fd, 65536)
            if not data:
                self._selector.unregister(key.fileobj)
                self._open -= 1
                continue
            if key.data == "stdout":
                self.stdout += data
            else:
                self._take(data)
        return True

    def _take(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            try:
                obj = json.loads(text)
            except ValueError:
                self.other_lines.append(text)
                continue
            if isinstance(obj, dict) and "event" in obj:
                self.events.append(obj)
            else:
                self.other_lines.append(text)

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float, what: str = "") -> Event:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if predicate(event):
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            streams_open = left > 0 and self._pump(min(left, 0.5))
            if not streams_open and seen == len(self.events):
                raise AssertionError(
                    f"no {what or 'matching event'} within {timeout}s; events: "
                    + json.dumps([e.get("event") for e in self.events])
                    + f"; other output: {self.other_lines[-20:]}; {self.where()}"
                )

    def wait_stdout(self, text: str, timeout: float = 30.0, count: int = 1) -> str:
        """Wait until the child's stdout (passed through by esiwrap) contains `text` (`count` times)."""
        deadline = time.monotonic() + timeout
        wanted = text.encode()
        while self.stdout.count(wanted) < count:
            left = deadline - time.monotonic()
            if left <= 0 or (not self._pump(min(left, 0.5)) and self.stdout.count(wanted) < count):
                raise AssertionError(f"stdout has no {text!r} (x{count}) within {timeout}s: "
                                     f"{self.stdout[-500:]!r}")
        return self.stdout.decode("utf-8", "replace")

    def child_pid(self, timeout: float = 30.0) -> int:
        return int(self.wait_event("child_started", timeout)["pid"])

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait_event(self, name: str, timeout: float = 60.0, **fields: Any) -> Event:
        def match(event: Event) -> bool:
            return event.get("event") == name and all(event.get(k) == v for k, v in fields.items())

        return self.wait_for(match, timeout, what=f"'{name}' {fields or ''}")

    def finish(self, timeout: float = 60.0) -> int:
        """Wait for exit, reading everything; returns the exit code."""
        deadline = time.monotonic() + timeout
        while self._open and time.monotonic() < deadline:
            self._pump(0.5)
        try:
            code = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"esiwrap did not exit within {timeout}s; {self.where()}") from None
        while self._pump(0):
            pass
        return code

    def where(self) -> str:
        """Where esiwrap and its tree are in the kernel (a failed wait says whether esiwrap was
        stopped, blocked on a lock or on I/O, or waiting in its loop): state and wchan per thread."""
        parts = []
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error, OSError):
                    threads = []
                    for task in sorted(Path(f"/proc/{proc.pid}/task").iterdir(), key=lambda t: int(t.name)):
                        stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
                        wchan = (task / "wchan").read_text() if (task / "wchan").exists() else "?"
                        threads.append(f"{task.name}:{stat[0]}:{wchan}")
                    parts.append(f"{proc.pid} {' '.join(proc.cmdline()[:3])} [{', '.join(threads)}]")
        return "processes: " + ("; ".join(parts) or "none left")

    def story(self, limit: int = 400) -> str:
        """Every event read so far, one line each (a run of one event's repeats: its first and last
        line and the count), then what else esiwrap wrote: what a failed test's report shows."""
        with contextlib.suppress(OSError, ValueError):
            while self._pump(0):
                pass
        lines: list[str] = []
        groups: list[list[Event]] = []
        for event in self.events:
            if groups and groups[-1][0].get("event") == event.get("event"):
                groups[-1].append(event)
            else:
                groups.append([event])
        for group in groups:
            shown = group if len(group) <= 2 else [group[0], group[-1]]
            for i, event in enumerate(shown):
                fields = {k: v for k, v in event.items() if k not in ("timestamp", "event", "run_id")}
                more = f" (x{len(group)})" if len(group) > 2 and i else ""
                lines.append(f"{event.get('timestamp', '')} {event.get('event')}{more} {json.dumps(fields)}")
        lines += [f"other: {line}" for line in self.other_lines[-20:]]
        return "\n".join(lines[-limit:]) or "no events"

    def names(self) -> list[str]:
        return [str(e.get("event")) for e in self.events]

    def first(self, name: str) -> Event:
        for event in self.events:
            if event.get("event") == name:
                return event
        raise AssertionError(f"no '{name}' event; got {self.names()}")

    def kill(self) -> None:
        """Test cleanup: nothing of this run survives the test. The tree is listed before
        esiwrap is killed: its child runs in a session of its own, and once esiwrap is gone it is
        nobody's descendant any more."""
        tree = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in [*tree, *descendants(self.proc.pid)]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self._selector.close()


def sources_only_args(ckpt: Path, sources: str, *extra: str) -> list[str]:
    """esiwrap with these deadline sources only, over the tiny trainer (0.2 s steps, one 1 s save
    guess, no final save): the cloud end-to-end tests' run."""
    return [
        "--sources", sources, "--refresh", "1", "--redundant-time", "6", "--save-duration", "1",
        "--no-final-save", *extra, "--",
        PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(ckpt), "--step-seconds", "0.2",
    ]


@dataclass
class Finished:
    """What a run left once it ended: its events, its exit code and what else it wrote (for tests
    that start several runs and check them afterwards)."""

    events: list[dict[str, Any]]
    code: int
    output: str = ""

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def index(self, name: str) -> int:
        return next(i for i, e in enumerate(self.events) if e["event"] == name)

    @property
    def exit(self) -> dict[str, Any]:
        return self.named("supervisor_exit")[0]

    @property
    def deadline(self) -> float:
        return iso_epoch(self.named("deadline_resolved")[0]["deadline"])


def event_time(event: Event) -> float:
    """A log event's timestamp as epoch seconds."""
    return iso_epoch(str(event["timestamp"]))


def requested_saves(run: EsiwrapRun) -> list[Event]:
    """The saves esiwrap asked for that completed."""
    return [e for e in run.events if e["event"] == "save_completed" and e.get("requested")]


def descendants(root_pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return list(psutil.Process(root_pid).children(recursive=True))
    return []


def kill_leftovers(root_pid: int) -> None:
    for child in descendants(root_pid):
        with contextlib.suppress(psutil.Error):
            child.kill()


def processes_with_marker(marker: str, program: str | None = None) -> list[psutil.Process]:
    """Live processes whose command line contains `marker` (to prove nothing was left behind),
    optionally only those running `program` (the basename of argv[0])."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE or not cmdline:
                continue
            if program is not None and os.path.basename(cmdline[0]) != program:
                continue
            if any(marker in part for part in cmdline):
                found.append(proc)
    return found


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago (for a server the test starts next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def esiwrap_below(run: EsiwrapRun, timeout: float = 30.0) -> int:
    """esiwrap's own pid when a launcher stays in front of it (`unshare --fork`, a shell)."""
    found: list[int] = []

    def started() -> bool:
        with contextlib.suppress(psutil.Error):
            found[:] = [p.pid for p in psutil.Process(run.pid).children(recursive=True)
                        if "esiwrap" in " ".join(p.cmdline())]
        return bool(found)

    assert wait_until(started, timeout), "esiwrap did not start below its launcher"
    return found[0]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Bounded wait on an observable condition (process state), not a sleep used as sync."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def release(fifo: str | os.PathLike[str], alive: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Write the byte a process holding on `fifo` waits for (`children/finishing_trainer.py`): once
    it has opened the FIFO to read. False when it did not (it died first, or `timeout` passed)."""
    opened: list[int] = []

    def open_writer() -> bool:
        with contextlib.suppress(OSError):  # ENXIO: no reader yet
            opened.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        return bool(opened) or not alive()

    wait_until(open_writer, timeout)
    if not opened:
        return False
    os.write(opened[0], b"!")
    os.close(opened[0])
    return True


def send_until_gone(pidfd: int, signum: int, alive: Callable[[], bool] = lambda: True,
                    timeout: float = 30.0, at_most: int | None = None) -> int:
    """Send `signum` to the process of `pidfd` in a tight loop until it is gone (reaped: a pidfd never
    reaches another process that got the pid since), `alive()` says so, `at_most` signals went out,
    or `timeout` passed; how many went out."""
    sent = 0
    deadline = time.monotonic() + timeout
    while alive() and (at_most is None or sent < at_most) and time.monotonic() < deadline:
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except ProcessLookupError:
            break
        sent += 1
    return sent
