"""What holds a checkpoint: a local disk that goes with the instance, or storage that outlives it.

Looked up once, at the first completed save, from `/proc/self/mountinfo`: the mount whose device
(major:minor) is the path's `st_dev` (bind mounts share a device: the one with the longest mount
point above the path wins), else the mount with the longest mount point above the path. Its
filesystem type is classified:

    network  nfs, nfs4, cifs, smb3, smbfs, afs, 9p, ncpfs, davfs, sshfs …: a server's storage
    cluster  lustre, gpfs, beegfs, ceph, glusterfs, gfs2, ocfs2, orangefs, wekafs, … : shared storage
    fuse     fuse.* (s3fs, gcsfuse, goofys, rclone, juicefs, blobfuse2, mountpoint-s3, …): mostly
             object stores and remote services (fuseblk, FUSE on a local block device, is local)
    memory   tmpfs, ramfs: no disk at all
    local    a filesystem on a block device of this machine: ext2/3/4, xfs, btrfs, f2fs, zfs,
             bcachefs, vfat, exfat, ntfs, fuseblk …, overlay and aufs (container layers on the
             host's disk), and any type whose mount source is a /dev/ device
    unknown  anything else, or the look-up failed

Only `local` is a checkpoint that esiwrap knows dies with the instance (`checkpoint_not_durable`).
The look-up stats the path, which can hang on a dead network mount: the supervisor runs it on a
thread of its own, never in the loop or on the trainer's path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
NETWORK = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "afs", "coda", "9p", "ncpfs", "davfs", "sshfs", "ftpfs",
    "curlftpfs",
})
CLUSTER = frozenset({
    "lustre", "gpfs", "beegfs", "ceph", "cephfs", "glusterfs", "gfs2", "ocfs2", "orangefs", "pvfs2",
    "panfs", "wekafs", "quobyte", "moosefs", "lizardfs", "cvmfs", "ibrix", "vxfs", "stornext", "cvfs",
})
MEMORY = frozenset({"tmpfs", "ramfs", "hugetlbfs", "devtmpfs"})
LOCAL = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs", "jfs", "reiserfs", "nilfs2",
    "vfat", "msdos", "exfat", "ntfs", "ntfs3", "hfs", "hfsplus", "udf", "iso9660", "squashfs", "erofs",
    "fuseblk", "overlay", "aufs",
})


@dataclass(frozen=True)
class Mount:
    device: str  # "major:minor"
    mount_point: str
    fstype: str
    source: str


@dataclass(frozen=True)
class Filesystem:
    """What holds a path: its kind (see the module docstring), type, mount point and source."""

    kind: str
    fstype: str
    mount_point: str = ""
    source: str = ""


def classify(fstype: str, source: str = "") -> str:
    """The kind of a filesystem type (and mount source): local, memory, network, cluster, fuse or
    unknown."""
    name = fstype.lower()
    base = name.split(".", 1)[1] if name.startswith("fuse.") else name
    if name in LOCAL:
        return "local"
    if base in CLUSTER or name.startswith("fuse.glusterfs"):
        return "cluster"
    if name in NETWORK or base in NETWORK:
        return "network"
    if name.startswith("fuse.") or name == "fuse":
        return "fuse"
    if name in MEMORY:
        return "memory"
    if source.startswith("/dev/") and not source.startswith("/dev/fuse"):
        return "local"  # a filesystem on one of this machine's block devices
    return "unknown"


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of `/proc/PID/mountinfo` (proc(5)); malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        mounts.append(Mount(device=fields[2], mount_point=_unescape(fields[4]), fstype=rest[0],
                            source=_unescape(rest[1])))
    return mounts


def find_mount(mounts: list[Mount], path: str, device: str | None) -> Mount | None:
    """The mount that holds `path` (absolute, symlinks resolved): the one on the path's device
    with the longest mount point above it, else the longest mount point above it of any."""
    above = [m for m in mounts if _is_under(path, m.mount_point)]
    on_device = [m for m in above if device is not None and m.device == device]
    candidates = on_device or above
    if not candidates:
        candidates = [m for m in mounts if device is not None and m.device == device]
    return max(candidates, key=lambda m: len(m.mount_point), default=None)


def filesystem_of(path: str, mountinfo: str = MOUNTINFO) -> Filesystem:
    """What holds `path` (or, when it is gone, its nearest existing parent). Never raises."""
    try:
        real = os.path.realpath(_existing(os.path.abspath(path)))
        st_dev = os.stat(real).st_dev
        device = f"{os.major(st_dev)}:{os.minor(st_dev)}"
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            mounts = parse_mountinfo(handle.read())
    except OSError:
        return Filesystem("unknown", "unknown")
    mount = find_mount(mounts, real, device)
    if mount is None:
        return Filesystem("unknown", "unknown")
    return Filesystem(classify(mount.fstype, mount.source), mount.fstype, mount.mount_point, mount.source)


def _existing(path: str) -> str:
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _is_under(path: str, mount_point: str) -> bool:
    return mount_point == "/" or path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 …)."""
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        chunk = text[i + 1:i + 4]
        if text[i] == "\\" and len(chunk) == 3 and all(c in "01234567" for c in chunk):
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
