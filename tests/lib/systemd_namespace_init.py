"""PID 1 of the test namespace until it execs systemd (see systemd_namespace.py for the why).

    python -I systemd_namespace_init.py TEST_DIR SYSTEMD TARGET

Runs in fresh PID, mount, UTS, IPC, network and cgroup namespaces (mount propagation private):
makes the host's mounts read-only here (all but TEST_DIR), mounts a fresh /proc, /sys, /dev and
/run, then execs systemd with `container=`, a curated unit path and a reduced bounding set.
Any failure ends this process, and with it the namespace, with a message on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys

PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9),
           ("tty", 5, 0))
DROPPED_CAPABILITIES = "-sys_module,-sys_time,-sys_boot"


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def read_only(path: str) -> None:
    """This namespace's view of one mount point read-only (a bind remount: the host keeps rw)."""
    mount("-o", "remount,bind,ro", path)


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    # mountinfo escapes space, tab, newline and backslash as octal
    return [p.encode().decode("unicode_escape") if "\\" in p else p for p in points]


def host_read_only(test_dir: str) -> None:
    mount("--bind", test_dir, test_dir)  # its own mount: stays writable
    for point in sorted(set(mount_points()), key=len, reverse=True):
        if point != test_dir:
            read_only(point)


def fresh_proc() -> None:
    mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", "/proc")
    for name in PROC_READ_ONLY:
        path = f"/proc/{name}"
        if os.path.exists(path):
            mount("--bind", path, path)
            read_only(path)


def fresh_sys() -> None:
    mount("-t", "sysfs", "-o", "ro,nosuid,nodev,noexec", "sysfs", "/sys")
    mount("-t", "tmpfs", "-o", "mode=755,nosuid,nodev,noexec", "tmpfs", "/sys/fs/cgroup")
    os.mkdir("/sys/fs/cgroup/systemd")
    os.mkdir("/sys/fs/cgroup/unified")
    # Through the cgroup namespace both are rooted at the sub-cgroups the launcher entered.
    mount("-t", "cgroup", "-o", "none,name=systemd,nosuid,nodev,noexec", "cgroup", "/sys/fs/cgroup/systemd")
    mount("-t", "cgroup2", "-o", "nosuid,nodev,noexec", "cgroup2", "/sys/fs/cgroup/unified")
    read_only("/sys/fs/cgroup")


def fresh_dev(kmsg_file: str) -> None:
    mount("-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", "/dev")
    for name, major, minor in DEVICES:
        os.mknod(f"/dev/{name}", 0o666 | 0o020000, os.makedev(major, minor))
        os.chmod(f"/dev/{name}", 0o666)
    os.mkdir("/dev/pts")
    os.mkdir("/dev/shm")
    mount("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", "/dev/pts")
    os.symlink("pts/ptmx", "/dev/ptmx")
    mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    for name, source in (("console", "/dev/null"), ("kmsg", kmsg_file)):
        open(f"/dev/{name}", "w").close()
        mount("--bind", source, f"/dev/{name}")


def main(test_dir: str, systemd: str, target: str) -> None:
    if os.getpid() != 1:
        sys.exit("systemd_namespace_init.py: must be PID 1 of a new PID namespace")
    host_read_only(test_dir)
    fresh_proc()
    fresh_sys()
    fresh_dev(os.path.join(test_dir, "manager-kmsg.log"))
    mount("-t", "tmpfs", "-o", "mode=755,nosuid,nodev", "tmpfs", "/run")
    empty = os.path.join(test_dir, "empty")
    env = {"container": "esiwrap-test", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           "SYSTEMD_UNIT_PATH": os.path.join(test_dir, "units"),
           "SYSTEMD_GENERATOR_PATH": empty, "SYSTEMD_ENVIRONMENT_GENERATOR_PATH": empty}
    argv = ["setpriv", f"--bounding-set={DROPPED_CAPABILITIES}", "--", systemd, "--system",
            f"--unit={target}", "--log-target=kmsg", "--log-level=info", "--show-status=no"]
    os.execvpe("setpriv", argv, env)


if __name__ == "__main__":
    main(*sys.argv[1:4])
