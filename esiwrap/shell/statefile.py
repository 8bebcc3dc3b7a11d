"""The job's state file on disk (`--state-file`): read it, and replace it atomically. What it holds
is the core's (`esiwrap.core.state`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from esiwrap.core.history import STALE_AFTER_S
from esiwrap.core.state import JobState, StateIgnored, merged, parse, render
from esiwrap.errors import UsageError
from esiwrap.shell.process import pid_exists
from esiwrap.times import iso_utc

MAX_BYTES = 1 << 20


def load(path: str, now: float) -> JobState | None:
    """The file's state; None when there is no file yet (the job's first run); StateIgnored when
    it cannot be used."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"unreadable: {exc.strerror or exc}"
        raise StateIgnored(msg) from None
    if len(data) > MAX_BYTES:
        msg = f"corrupt: larger than {MAX_BYTES} bytes"
        raise StateIgnored(msg)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        msg = "corrupt: not UTF-8 text"
        raise StateIgnored(msg) from None
    return parse(text, now)


def write_merged(path: str, text: str, run_id: str) -> None:
    """Write the state `text` (this run's), read-modify-write: the records of other runs that the
    file holds now (written meanwhile, by a writer without the lock: an older esiwrap) are kept."""
    now = time.time()
    try:
        found = load(path, now)
    except StateIgnored:
        found = None  # nothing there worth keeping
    if found is not None:
        text = render(merged(found, parse(text, now), run_id))
    write_atomic(path, text)


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` all at once: readers see the old file or the new one, never half."""
    import tempfile  # only when a state file is written: it is not needed to start a run

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".esiwrap-state-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------- one live run
LOCK_SUFFIX = ".lock"


@dataclass(frozen=True)
class Holder:
    """Who holds a state file's lock: written into the lock file, refreshed with the state."""

    host: str
    pid: int
    run_id: str
    started_at: float
    refreshed_at: float
    boot_id: str = ""  # the kernel's boot: a holder gone on a machine that did not reboot was killed

    def describe(self) -> str:
        run = f", run {self.run_id[:8]}…" if self.run_id else ""
        return f"pid {self.pid} on {self.host or 'an unknown host'}{run}"

    def fields(self) -> dict[str, Any]:
        return {"holder_pid": self.pid, "holder_host": self.host, "holder_run_id": self.run_id or None,
                "holder_started_at": iso_utc(self.started_at),
                "holder_refreshed_at": iso_utc(self.refreshed_at)}

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "run_id": self.run_id,
                           "started_at": round(self.started_at, 3),
                           "refreshed_at": round(self.refreshed_at, 3), "boot_id": self.boot_id}) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Holder | None:
        try:
            obj = json.loads(text)
            return cls(str(obj["host"]), int(obj["pid"]), str(obj.get("run_id", "")),
                       float(obj["started_at"]), float(obj["refreshed_at"]), str(obj.get("boot_id", "")))
        except (ValueError, KeyError, TypeError):
            return None


class StateLocked(UsageError):
    """Another live run holds the state file: this one must not start (exit 2)."""

    def __init__(self, path: str, holder: Holder | None) -> None:
        who = f"another esiwrap ({holder.describe()})" if holder is not None else "another esiwrap"
        super().__init__(f"--state-file {path}: {who} holds this state file: give each job its own "
                         "--state-file (or wait for that run to end)")
        self.holder = holder


@dataclass(frozen=True)
class TakenOver:
    """A lock left behind by a run that is gone, and why it counts as gone."""

    holder: Holder
    why: str
    killed: bool  # gone on this very machine, which lived on: esiwrap was killed, not its capacity


class StateLock:
    """One live run per state file: an `fcntl` lock (POSIX record locks, which NFS honours) on a
    sidecar file next to it (`<state file>.lock`), held for the run's whole life, with its holder
    written in it (host, pid, run id, start, last refresh, boot id).

    A lock whose holder is gone is taken over: on a local filesystem the kernel released it when
    its process died (the record it left says who that was); on a network filesystem it may outlive
    a machine that vanished, and it is broken when its record was not refreshed for `STALE_AFTER_S`
    (the holder refreshes it with every state write, at least every `HEARTBEAT_S`)."""

    def __init__(self, path: str, fd: int, me: Holder) -> None:
        self.path = path  # the lock file
        self._fd = fd
        self.me = me

    @classmethod
    def take(cls, state_path: str, me: Holder, now: float) -> tuple[StateLock, TakenOver | None]:
        """The lock, and what it took over (None: nobody had it). `StateLocked` when a live run
        holds it; OSError when the lock file cannot be made (the caller goes on without it)."""
        path = state_path + LOCK_SUFFIX
        fd = _open_locked(path)
        holder = _read_holder(fd if fd >= 0 else None, path)
        taken: TakenOver | None = None
        if fd < 0:  # held: by a live run, or by one gone whose lock outlived it (network filesystems)
            why = _gone(holder, me, now) if holder is not None else None
            if holder is None or why is None:
                raise StateLocked(state_path, holder)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # break it: its holder's lock stays on the old file, which is gone
            fd = _open_locked(path)
            if fd < 0:
                raise StateLocked(state_path, holder)
            taken = TakenOver(holder, why, killed=False)
        elif holder is not None and (holder.host, holder.pid, holder.run_id) != (me.host, me.pid, me.run_id):
            killed = bool(me.boot_id) and holder.boot_id == me.boot_id and holder.host == me.host
            why = "its process is gone (killed: the machine lived on)" if killed else "its process is gone"
            taken = TakenOver(holder, why, killed)
        lock = cls(path, fd, me)
        lock.refresh(now)
        return lock, taken

    def refresh(self, now: float) -> None:
        """Write this run into the lock file again, alive until `now` (in place: the lock is the
        file's, a rename would drop it)."""
        self.me = replace(self.me, refreshed_at=now)
        data = self.me.to_json().encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.fsync(self._fd)

    def release(self) -> None:
        """The run is over: no holder in the file, the lock given back."""
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        with contextlib.suppress(OSError):
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _open_locked(path: str) -> int:
    """The lock file, opened and locked; -1 when another process holds its lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return -1
        raise
    return fd


def _read_holder(fd: int | None, path: str) -> Holder | None:
    try:
        if fd is not None:
            data = os.pread(fd, 4096, 0)
        else:
            with open(path, "rb") as handle:
                data = handle.read(4096)
    except OSError:
        return None
    return Holder.from_json(data.decode("utf-8", "replace")) if data.strip() else None


def _gone(holder: Holder, me: Holder, now: float) -> str | None:
    """Why a holder whose lock is still held counts as gone, or None (it is alive)."""
    if holder.host == me.host:
        return None if pid_exists(holder.pid) else f"pid {holder.pid} is gone"
    quiet_s = now - holder.refreshed_at
    if quiet_s > STALE_AFTER_S:
        return f"{holder.host} has not refreshed its lock for {quiet_s:.0f}s"
    return None


def boot_id() -> str:
    """This machine's boot (Linux); "" where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""
