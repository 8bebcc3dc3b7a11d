"""Files other processes read while esiwrap runs (the metrics file, the status file).

A reader must never see half a file: each version is written to a temporary file in the same
directory and renamed over the old one, which is what node_exporter's textfile collector asks
for; with `durable`, the temporary file is also flushed to disk first (fsync), so a crash leaves
the old version or the new one. A file is rewritten only when its text changed.
"""

from __future__ import annotations

import contextlib
import os


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
    """One file kept equal to the latest text it was given."""

    def __init__(self, path: str, mode: int = 0o644, durable: bool = True) -> None:
        self.path = path
        self.mode = mode
        self.durable = durable
        self._written: str | None = None

    def write(self, text: str) -> bool:
        """Write when the text changed; True when the file was written (OSError on failure)."""
        if text == self._written:
            return False
        write_atomic(self.path, text, self.mode, self.durable)
        self._written = text
        return True

    def remove(self) -> None:
        """Take the file away (esiwrap is leaving: what it said is no longer true)."""
        if self._written is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self._written = None
