"""A real FUSE filesystem whose writes are held to a bandwidth, like network storage.

    python tests/lib/slowfs.py BACKING_DIR MOUNTPOINT BYTES_PER_SECOND [LATENCY_S]

It passes every operation through to BACKING_DIR and paces writes (a token bucket shared by all
writers), so a checkpoint written to MOUNTPOINT takes its size over the bandwidth, for the trainer
and for esiwrap's storage probe alike. LATENCY_S (default 0) is added to every write, rename and
fsync: a disk so busy (a checkpoint's writeback) that even a small file's write waits. Tests
mount it with `mounted()`; it needs /dev/fuse, root (or fusermount), libfuse2 and the fusepy
package (scripts/test.sh installs them).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STAT_KEYS = ("st_mode", "st_size", "st_uid", "st_gid", "st_nlink", "st_atime", "st_mtime", "st_ctime")
STATVFS_KEYS = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                "f_frsize", "f_namemax")


def make_operations(root: str, bytes_per_s: float, latency_s: float = 0.0) -> Any:
    from fuse import Operations  # fusepy turns an OSError into the errno the kernel sees

    class Paced(Operations):  # type: ignore[misc]
        def __init__(self) -> None:
            # not `self.lock`: that is FUSE's POSIX-lock operation, which fusepy calls at every
            # close (a lock object there failed each call with a traceback on the daemon's stderr)
            self.bucket_lock = threading.Lock()
            self.free_at = time.monotonic()  # when the bucket has room for the next write

        def _path(self, path: str) -> str:
            return os.path.join(root, path.lstrip("/"))

        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            st = os.lstat(self._path(path))
            return {key: getattr(st, key) for key in STAT_KEYS}

        def readdir(self, path: str, fh: Any) -> list[str]:
            return [".", "..", *os.listdir(self._path(path))]

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return os.open(self._path(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

        def open(self, path: str, flags: int) -> int:
            return os.open(self._path(path), flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self.bucket_lock:
                now = time.monotonic()
                self.free_at = max(self.free_at, now) + len(data) / bytes_per_s
                wait = self.free_at - now
            time.sleep(max(0.0, wait) + latency_s)
            return os.pwrite(fh, data, offset)

        def truncate(self, path: str, length: int, fh: Any = None) -> None:
            os.truncate(self._path(path), length)

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            time.sleep(latency_s)
            os.fsync(fh)
            return 0

        def unlink(self, path: str) -> None:
            os.unlink(self._path(path))

        def mkdir(self, path: str, mode: int) -> None:
            os.mkdir(self._path(path), mode)

        def rmdir(self, path: str) -> None:
            os.rmdir(self._path(path))

        def rename(self, old: str, new: str) -> None:
            time.sleep(latency_s)
            os.rename(self._path(old), self._path(new))

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(self._path(path))
            return {key: getattr(st, key) for key in STATVFS_KEYS}

        def utimens(self, path: str, times: Any = None) -> None:
            os.utime(self._path(path), times)

        def chmod(self, path: str, mode: int) -> None:
            os.chmod(self._path(path), mode)

    return Paced()


@contextlib.contextmanager
def mounted(base: Path, bytes_per_s: float, latency_s: float = 0.0) -> Iterator[Path]:
    """A paced FUSE filesystem at `base/mnt` over `base/back`, unmounted (and its process gone)
    when the block ends. The daemon's stderr goes to `base/slowfs.err`: a pipe nobody reads
    would fill, and a daemon thread blocked writing to it leaves its request unanswered (the
    process waiting on it cannot even exit)."""
    back, mnt = base / "back", base / "mnt"
    back.mkdir(parents=True, exist_ok=True)
    mnt.mkdir(parents=True, exist_ok=True)
    errors = base / "slowfs.err"
    command = [sys.executable, __file__, str(back), str(mnt), str(bytes_per_s), str(latency_s)]
    with open(errors, "wb") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 20.0
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                said = errors.read_text(errors="replace").strip()
                msg = f"slowfs did not mount at {mnt}: {said or 'timed out'}"
                raise RuntimeError(msg)
            time.sleep(0.05)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str]) -> int:
    from fuse import FUSE

    back, mnt, bps, *latency = argv
    operations = make_operations(back, float(bps), float(latency[0]) if latency else 0.0)
    FUSE(operations, mnt, foreground=True, nothreads=False, big_writes=True, max_write=1 << 20)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
