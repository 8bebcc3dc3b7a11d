"""Files other processes read while esiwrap runs (the metrics file, the status file).

A reader must never see half a file: each version is written to a temporary file in the same
directory and renamed over the old one, which is what node_exporter's textfile collector asks
for; with `durable`, the temporary file is also flushed to disk first (fsync), so a crash leaves
the old version or the new one. A file is rewritten only when its text changed.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esiwrap.shell.writer import Done, FileWriter


def write_atomic(path: str, text: str, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `text` in one step: temporary file, fsync, rename (OSError on failure)."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            data = text.encode("utf-8")
            while data:
                data = data[os.write(fd, data):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class MirroredFile:
    """One file kept equal to the latest text it was given: written here, or, with a `writer`,
    by the writer's thread (the caller never waits on the disk; `done` hears how it went)."""

    def __init__(self, path: str, mode: int = 0o644, durable: bool = True,
                 writer: FileWriter | None = None, done: Done | None = None) -> None:
        self.path = path
        self.mode = mode
        self.durable = durable
        self._writer = writer
        self._done = done
        self._written: str | None = None

    def write(self, text: str) -> bool:
        """Write when the text changed; True when the file was written or queued. How it went,
        failures included, goes to `done` (without one, a failure here raises OSError)."""
        if text == self._written:
            return False
        self._written = text
        if self._writer is not None:
            self._writer.replace(self.path, text, self._write_now, done=self._written_by)
            return True
        try:
            write_atomic(self.path, text, self.mode, self.durable)
        except OSError as exc:
            self._written_by(self.path, exc)
            if self._done is None:
                raise
            return True
        self._written_by(self.path, None)
        return True

    def _write_now(self, path: str, text: str) -> None:
        write_atomic(path, text, self.mode, self.durable)

    def _written_by(self, path: str, error: OSError | None) -> None:
        """The writer's thread wrote the file, or could not (then the next text is tried again)."""
        if error is not None:
            self._written = None
        if self._done is not None:
            self._done(path, error)

    def remove(self) -> None:
        """Take the file away (esiwrap is leaving: what it said is no longer true)."""
        if self._written is not None:
            if self._writer is not None:
                self._writer.remove(self.path)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            self._written = None
