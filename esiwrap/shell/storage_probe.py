"""How fast the checkpoint's storage takes writes, measured before the first save.

Two measurements, each run off the supervisor's loop (a thread of `StorageProber`) and never on
the trainer's step path:

* a write probe: a temporary file in the checkpoint directory, written in chunks of random bytes
  (compressing filesystems must not flatter it) with an fdatasync after each, until PROBE_MAX_BYTES
  (or the checkpoint's own size, when that is smaller), PROBE_MAX_S or a hundredth of the free
  space, whichever comes first; then removed. Durable
  bytes over the time they took is the bandwidth a save can count on (a save that lands in the
  page cache is faster: the prior errs on the safe side).
* the previous checkpoint, when a trainer resumed from one: its files' total size, and how fast
  they were written: the bytes of every file but the first to finish, over the time from the
  first file's modification to the last one's (only when those hold most of the bytes: one big
  file and a small index say nothing of the speed).

`policy.prior_save_s` turns bytes and bandwidth into the first save's estimate.
"""

from __future__ import annotations

import contextlib
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PROBE_MAX_BYTES = 1 << 30
PROBE_MIN_BYTES = 64 << 10  # a checkpoint smaller than this: write this much at least
PROBE_CHUNK_BYTES = 8 << 20  # one write + fdatasync
PROBE_MAX_S = 2.0  # stop after the chunk that crosses this
PROBE_FREE_SHARE = 0.01  # never more than this share of the free space
MAX_CHECKPOINT_FILES = 100_000  # a previous checkpoint's walk stops here
MIN_SPANNED_SHARE = 0.5  # the files' times tell a speed only when most bytes fall inside their span


@dataclass(frozen=True)
class Measurement:
    """One figure for the controller (`controller.StorageProbed`)."""

    path: str
    source: str  # "probe" or "previous checkpoint"
    bandwidth_bps: float | None
    written_bytes: float = 0.0
    seconds: float = 0.0
    error: str = ""


def probe_bandwidth(directory: str, max_bytes: int = PROBE_MAX_BYTES, max_s: float = PROBE_MAX_S,
                    clock: Callable[[], float] = time.monotonic) -> Measurement:
    """A bounded, fdatasync'd write in `directory`; never raises (a failure is the error)."""
    try:
        return _probe(directory, max_bytes, max_s, clock)
    except OSError as exc:
        return Measurement(directory, "probe", None, error=f"{exc.strerror or exc} ({directory})")


def _probe(directory: str, max_bytes: int, max_s: float, clock: Callable[[], float]) -> Measurement:
    directory = existing_ancestor(directory)  # a checkpoint directory is often made by the first save
    stats = os.statvfs(directory)
    budget = min(max_bytes, int(stats.f_bavail * stats.f_frsize * PROBE_FREE_SHARE))
    chunk_size = min(PROBE_CHUNK_BYTES, budget)
    if chunk_size < PROBE_MIN_BYTES:
        free_mb = stats.f_bavail * stats.f_frsize / 1e6
        return Measurement(directory, "probe", None,
                           error=f"only {free_mb:.0f} MB free in {directory}: not probed")
    chunk = os.urandom(chunk_size)
    fd, path = tempfile.mkstemp(prefix=".esiwrap-probe-", dir=directory)
    written = 0
    try:
        started = clock()
        while written < budget:
            view = memoryview(chunk)[: min(chunk_size, budget - written)]
            while view:
                n = os.write(fd, view)
                view, written = view[n:], written + n
            os.fdatasync(fd)
            if clock() - started >= max_s:
                break
        seconds = max(clock() - started, 1e-6)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return Measurement(directory, "probe", written / seconds, float(written), seconds)


def existing_ancestor(path: str) -> str:
    """`path`, or the nearest directory above it that exists (same filesystem, most likely)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def measure_checkpoint(path: str) -> Measurement:
    """What the checkpoint at `path` (a file or a directory) holds and how fast it was written;
    never raises."""
    source = "previous checkpoint"
    try:
        files = _files(path)
    except OSError as exc:
        return Measurement(path, source, None, error=f"{exc.strerror or exc} ({path})")
    total = sum(size for size, _ in files)
    if total <= 0:
        return Measurement(path, source, None, error=f"no checkpoint files in {path}")
    files.sort(key=lambda f: f[1])
    first_bytes, first_mtime = files[0]
    span = files[-1][1] - first_mtime
    later = total - first_bytes  # written between the first file's end and the last one's
    if len(files) < 2 or span <= 0 or later < MIN_SPANNED_SHARE * total:
        return Measurement(path, source, None, float(total),
                           error="its files' times do not tell how long it took to write")
    bandwidth = later / span
    return Measurement(path, source, bandwidth, float(total), total / bandwidth)


def _files(path: str) -> list[tuple[int, float]]:
    """(size, mtime) of every regular file at or under `path`."""
    top = os.stat(path)
    if not os.path.isdir(path):
        return [(top.st_size, top.st_mtime)]
    out: list[tuple[int, float]] = []
    for root, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(root, name), follow_symlinks=False)
                if os.path.isfile(os.path.join(root, name)):
                    out.append((st.st_size, st.st_mtime))
            if len(out) >= MAX_CHECKPOINT_FILES:
                return out
    return out


class StorageProber:
    """Runs measurements on a thread of its own, one job at a time, and wakes the loop when a
    result is ready (a byte on `wake`, as the deadline watcher does)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._jobs: queue.SimpleQueue[tuple[str | None, str | None, int] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[Measurement] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, directory: str | None, previous: str | None, max_bytes: int | None = None) -> None:
        """Probe `directory` (at most `max_bytes`, within the module's bounds) and measure the
        checkpoint `previous`; either may be None."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="esiwrap-storage-probe", daemon=True)
            self._thread.start()
        size = PROBE_MAX_BYTES if max_bytes is None else max(PROBE_MIN_BYTES, min(max_bytes, PROBE_MAX_BYTES))
        self._jobs.put((directory, previous, size))

    def drain(self) -> list[Measurement]:
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            directory, previous, max_bytes = job
            if previous:  # a directory walk: quick, and the better figure
                self._results.put(measure_checkpoint(previous))
                self._wake()
            if directory:
                self._results.put(probe_bandwidth(directory, max_bytes))
                self._wake()
