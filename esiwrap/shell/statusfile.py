"""Where a running esiwrap keeps its status file, unless `--status-file` pins it:

1. `$XDG_RUNTIME_DIR/esiwrap/<pid>.json` when `XDG_RUNTIME_DIR` is set (a login session);
2. `/run/esiwrap/<pid>.json` when running as root (a system service, most containers);
3. `/tmp/esiwrap-<uid>/<pid>.json` otherwise (a directory only that user may enter).

The first directory that can be used wins. Separate from `esiwrap.tools.status` (the command that
reads these files) because every run needs this and nothing else of it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping


def candidate_dirs(environ: Mapping[str, str], uid: int) -> list[str]:
    """Where status files go, in order of preference (see the module docstring)."""
    dirs = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        dirs.append(os.path.join(runtime, "esiwrap"))
    if uid == 0:
        dirs.append("/run/esiwrap")
    dirs.append(f"/tmp/esiwrap-{uid}")
    return dirs


def default_status_file(environ: Mapping[str, str], pid: int, uid: int) -> str | None:
    """`<dir>/<pid>.json` in the first directory that is ours or can be made ours; None if none."""
    for directory in candidate_dirs(environ, uid):
        if _private_dir(directory, uid):
            return os.path.join(directory, f"{pid}.json")
    return None


def _private_dir(path: str, uid: int) -> bool:
    """The directory exists (made here if need be), is not a symlink, and belongs to `uid`:
    under /tmp, anyone could have made it first to catch what we write."""
    try:
        os.makedirs(path, mode=0o700 if path.startswith("/tmp/") else 0o755, exist_ok=True)
    except OSError:  # read-only, not allowed, or a file (or a dangling symlink) of that name
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid and os.access(path, os.W_OK)
