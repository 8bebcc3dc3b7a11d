"""Writes the supervisor's loop never waits for: files on a disk that checkpoints keep busy.

A training node writes checkpoints of many gigabytes; while it does, any write to the same disk
(a file's data, a rename over an old file, an fsync) can wait in the kernel for seconds behind
the checkpoint's own writeback. A loop that wrote its status file, its metrics file or the job's
state file itself would sit out that wait in the middle of a save, and hear the save's
acknowledgement (or the deadline) late. So the loop only hands each file's newest text to one
thread, which writes it (atomically: temporary file, rename), and never waits for it:

    writer = FileWriter()
    writer.replace(path, text, write, done=on_done)          # returns at once; write(path, text)
    writer.remove(path)
    writer.close(timeout_s)                                  # on the way out: what is queued, bounded

A newer text for a path replaces one not yet written (only the latest state is worth writing);
different paths are written in the order they were first queued. `done(path, error)` is called
from the writer's thread after each write (error None on success), so it must only do what is
safe there (log a line, set a flag).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Done = Callable[[str, "OSError | None"], None]
Write = Callable[[str, str], None]


@dataclass
class _Job:
    text: str | None  # None: remove the file
    write: Write
    done: Done | None


class FileWriter:
    """One thread writing files for the loop (see the module docstring)."""

    def __init__(self, name: str = "esiwrap-files") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._pending: dict[str, _Job] = {}  # insertion order: the order paths were queued
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None

    def replace(self, path: str, text: str, write: Write, done: Done | None = None) -> None:
        """Queue `path` to hold `text`; `write(path, text)` does the writing, atomically (e.g.
        `esiwrap.shell.files.write_atomic`)."""
        self._queue(path, _Job(text, write, done))

    def remove(self, path: str) -> None:
        """Queue the removal of `path` (a text queued for it is dropped)."""
        self._queue(path, _Job(None, _unlink, None))

    def _queue(self, path: str, job: _Job) -> None:
        with self._cond:
            if self._closing:
                return
            self._pending.pop(path, None)  # re-queued at the end: its newest text
            self._pending[path] = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued is written, at most `timeout_s`; True if it was."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float) -> bool:
        """Write what is queued (at most `timeout_s`), then stop taking more."""
        flushed = self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        return flushed

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                path = next(iter(self._pending))
                job = self._pending.pop(path)
                self._busy = True
            error: OSError | None = None
            try:
                if job.text is None:
                    job.write(path, "")
                else:
                    job.write(path, job.text)
            except OSError as exc:
                error = exc
            if job.done is not None:
                with contextlib.suppress(Exception):  # a callback's bug must not stop the writes
                    job.done(path, error)
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def _unlink(path: str, _: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
