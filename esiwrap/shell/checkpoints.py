"""The checkpoint's files, off the supervisor's loop: its verification, its manifest, the manifests
that come back, the place a restore writes to.

Each function here may stat, read or write on the checkpoint's storage, which can hang on a
network mount that stopped answering: the supervisor calls them on a thread of their own and
hears the answer through its wake-up socket. Nothing here decides; `esiwrap.core` says what to
check, what to write and which manifest to restore from.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import TYPE_CHECKING

from esiwrap.core import manifest as manifests
from esiwrap.core.controller import WriteManifest
from esiwrap.shell import files

if TYPE_CHECKING:
    from esiwrap.shell.verify import Verdict

SETTLE_S = 0.5  # a file of a format esiwrap does not know: its size must hold still this long
MANIFEST_MAX_FILES = 10_000  # a directory of manifests: this many files looked at, at most


def check(path: str, step: int, builtin: bool) -> Verdict:
    """The built-in check of the checkpoint at `path` (`esiwrap.shell.verify`), or, with it off
    (`--verify-builtin none`) or no path, only what is there (its size, for the log)."""
    from esiwrap.shell.verify import Verdict, verify  # at the first save: not at esiwrap's start

    if builtin and path:
        return verify(path, step, settle_s=SETTLE_S)
    started = time.monotonic()
    size = files_and_bytes(path) if path else (0, 0)
    checked = "the built-in check is off (--verify-builtin none)" if builtin is False else \
        "nothing: the trainer reported no path"
    return Verdict(ok=True, format="", checked=checked, bytes=size[1], files=size[0],
                   seconds=time.monotonic() - started, path=path)


def files_and_bytes(path: str) -> tuple[int, int]:
    """How many regular files, and bytes, are at or under `path` (0s when nothing is there)."""
    try:
        if not os.path.isdir(path):
            return 1, os.stat(path).st_size
    except OSError:
        return 0, 0
    count = total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
                count += 1
    return count, total


def previous_gone(previous: str, files_then: int | None = None) -> bool:
    """The newest valid checkpoint (at `previous`) is no longer there, or files were deleted from it
    since it was verified with `files_then` (verl's rotation deletes an old step's `actor/` and
    leaves its directory)."""
    if not previous:
        return False
    if not os.path.lexists(previous):
        return True
    return files_then is not None and files_and_bytes(previous)[0] < files_then


def present(path: str) -> bool:
    return os.path.exists(path)


# ---------------------------------------------------------------------------------- manifests
def manifest_path(checkpoint_path: str) -> str:
    """Where a checkpoint's manifest goes: beside it (`esiwrap.core.manifest.file_name`)."""
    parent = os.path.dirname(os.path.normpath(checkpoint_path)) or "."
    return os.path.join(parent, manifests.file_name(checkpoint_path))


def write_manifest(action: WriteManifest) -> tuple[str, str]:
    """Write the manifest beside its checkpoint; where that fails (a directory esiwrap may not write),
    in a local directory of esiwrap's own. Returns the file written and the error beside it ("")."""
    text = manifests.render(action.step, action.path, action.written_at, run_id=action.run_id,
                            host=socket.gethostname(), bytes_=action.bytes, files=action.files,
                            verified=action.format, state=action.state)
    beside = manifest_path(action.path) if action.path else ""
    error = "the trainer reported no path" if not beside else ""
    if beside:
        try:
            files.write_atomic(beside, text)
            return beside, ""
        except OSError as exc:
            error = exc.strerror or str(exc)
    local = os.path.join(_local_dir(), f"{action.run_id or 'run'}-{manifests.file_name(action.path)}")
    files.write_atomic(local, text)
    return local, error


def remove_stale_manifests(written: dict[str, str]) -> list[str]:
    """Delete the manifests written beside checkpoints that are gone (a trainer's rotation removed
    them): their uploads are done or skipped, and a manifest left beside nothing only misleads.
    `written`: checkpoint path -> its manifest; returns the checkpoint paths whose manifest went."""
    gone = [path for path in written if path and not os.path.lexists(path)]
    for path in gone:
        with contextlib.suppress(OSError):
            os.unlink(written[path])
    return gone


def _local_dir() -> str:
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"esiwrap-manifests-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def read_manifests(directory: str, now: float) -> tuple[list[manifests.Manifest], list[tuple[str, str]]]:
    """Every complete manifest under `directory` (what `--restore-manifests` copied there), and the
    files that looked like manifests and were not, with why."""
    found: list[manifests.Manifest] = []
    rejected: list[tuple[str, str]] = []
    seen = 0
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            if not name.endswith(".json"):
                continue
            seen += 1
            if seen > MANIFEST_MAX_FILES:
                return found, rejected
            path = os.path.join(root, name)
            label = os.path.relpath(path, directory)
            try:
                with open(path, "rb") as handle:
                    data = handle.read(manifests.MAX_BYTES + 1)
                if len(data) > manifests.MAX_BYTES:
                    rejected.append((label, "larger than a manifest"))
                    continue
                found.append(manifests.parse(data.decode("utf-8", "replace"), now, label))
            except OSError as exc:
                rejected.append((label, f"unreadable: {exc.strerror or exc}"))
            except manifests.ManifestRejected as exc:
                rejected.append((label, str(exc)))
    return found, rejected


def empty_dir() -> str:
    """A new, empty, private directory for `--restore-manifests` to copy into."""
    import tempfile

    return tempfile.mkdtemp(prefix="esiwrap-manifests-")


def remove_dir(directory: str) -> None:
    import shutil  # only where manifests were fetched

    shutil.rmtree(directory, ignore_errors=True)


def prepare_restore(path: str) -> None:
    """The directory the checkpoint goes back into exists (the command need not make it). On a
    thread: it may be on a mount that hangs."""
    parent = os.path.dirname(os.path.normpath(path)) if path else ""
    if parent:
        with contextlib.suppress(OSError):
            os.makedirs(parent, exist_ok=True)
