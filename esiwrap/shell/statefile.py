"""The job's state file on disk (`--state-file`): read it, and replace it atomically. What it holds
is the core's (`esiwrap.core.state`).
"""

from __future__ import annotations

import contextlib
import os

from esiwrap.core.state import JobState, StateIgnored, parse

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
