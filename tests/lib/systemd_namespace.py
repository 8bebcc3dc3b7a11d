"""A real systemd (the installed one, 252 here) as PID 1 of a private namespace, for tests.

Nothing of it may act on the host. What it takes, measured on this kind of machine (root, no
Docker, a hybrid cgroup layout: `name=systemd` v1 at /sys/fs/cgroup/systemd, cgroup2 at
/sys/fs/cgroup/unified), and why each step is there:

* its own sub-cgroups (one in the `name=systemd` hierarchy, one in the unified one), entered by
  the launcher before `unshare --cgroup`: at start systemd moves every process of its root
  cgroup into `init.scope`; in the host's root cgroup those would be the host's processes;
* PID, mount, UTS, IPC, network and cgroup namespaces (`unshare`), PID 1 killed with the
  launcher (`--kill-child`, and the launcher dies with the test process: PR_SET_PDEATHSIG);
* `container=esiwrap-test` in PID 1's environment, and CAP_SYS_MODULE, CAP_SYS_TIME and
  CAP_SYS_BOOT dropped from its bounding set: otherwise it sets the clock, loads modules and
  policies, and detaches devices at shutdown;
* in the mount namespace (`systemd_namespace_init.py`, run as PID 1 before it execs systemd):
  every mount of the host read-only except the test's directory; a fresh procfs with /proc/sys
  (and sysrq-trigger, irq, bus, fs) read-only; a fresh read-only sysfs whose /sys/fs/cgroup is a
  tmpfs holding a `name=systemd` v1 mount and a cgroup2 mount at `unified` (both rooted at the
  sub-cgroups, through the cgroup namespace); a private /dev (null, zero, full, random, urandom,
  tty, a new devpts, shm; /dev/console bound to /dev/null, since PID 1 makes it its stdio, and
  /dev/kmsg bound to a file of the test, where PID 1 logs); a private /run;
* a curated `SYSTEMD_UNIT_PATH` (and empty generator paths) holding only what the tests need:
  stub targets, journald, poweroff, and the units under test. With the default path, default
  dependencies pulled in the host's `systemd-tmpfiles-setup`, which tried to empty /tmp;
* teardown: SIGRTMIN+4 to PID 1 (poweroff: the jobs are stopped as at a real shutdown), then
  the sub-cgroups are removed.

Only `name=systemd` and a cgroup2 without controllers are there: no memory or CPU accounting.
The manager is driven with `nsenter -t <pid 1> -m -p systemctl ...`; it reaches `running` in a
fraction of a second. A unit that stopped successfully is unloaded at once (`show` then reports
zeros): the test target has `After=` on the units a test reads after their stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
INIT_SCRIPT = HERE / "systemd_namespace_init.py"
SYSTEMD = Path("/lib/systemd/systemd")
CGROUP_V1 = Path("/sys/fs/cgroup/systemd")
CGROUP_V2 = Path("/sys/fs/cgroup/unified")
TARGET = "esiwrap-test.target"
PR_SET_PDEATHSIG = 1

STUB_TARGETS = ("sysinit", "basic", "sockets", "network-online", "network", "shutdown", "final",
                "slices", "multi-user", "local-fs", "swap", "umount")
UNITS = {
    "systemd-journald.socket": """\
[Unit]
Description=Journal Socket
DefaultDependencies=no
Before=sockets.target

[Socket]
ListenStream=/run/systemd/journal/stdout
ListenDatagram=/run/systemd/journal/socket
SocketMode=0666
PassCredentials=yes
PassSecurity=yes
ReceiveBuffer=8M
Service=systemd-journald.service
""",
    "systemd-journald.service": """\
[Unit]
Description=Journal Service
DefaultDependencies=no
Requires=systemd-journald.socket
After=systemd-journald.socket

[Service]
Type=notify
Sockets=systemd-journald.socket
ExecStart=/lib/systemd/systemd-journald
FileDescriptorStoreMax=4224
Restart=always
""",
    "poweroff.target": """\
[Unit]
Description=Power-Off
DefaultDependencies=no
Requires=systemd-poweroff.service
After=systemd-poweroff.service
AllowIsolate=yes
""",
    "systemd-poweroff.service": """\
[Unit]
Description=Power-Off
DefaultDependencies=no
Requires=shutdown.target final.target
After=shutdown.target final.target
SuccessAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/bin/true
""",
}


class NamespaceError(RuntimeError):
    """The manager did not come up (or go down) as it should; the message holds its own log."""


class SystemdNamespace:
    """One systemd manager in its own namespaces, with units in `root / "units"`."""

    def __init__(self, root: Path, keep_loaded: Iterable[str] = ()) -> None:
        self.root = root
        self.units = root / "units"
        self.kmsg = root / "manager-kmsg.log"
        self.output = root / "manager-output.log"
        self.cgroup_name = f"esiwrap-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.keep_loaded = list(keep_loaded)
        self.launcher: subprocess.Popen[bytes] | None = None
        self.pid1: int | None = None
        self.started_s: float | None = None

    # ------------------------------------------------------------------ units
    def write_unit(self, name: str, text: str) -> Path:
        path = self.units / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _write_base_units(self) -> None:
        for name in STUB_TARGETS:
            self.write_unit(f"{name}.target", f"[Unit]\nDescription={name} (stub)\nDefaultDependencies=no\n")
        for name, text in UNITS.items():
            self.write_unit(name, text)
        after = " ".join(self.keep_loaded)
        self.write_unit(TARGET, "[Unit]\nDescription=esiwrap tests\nDefaultDependencies=no\n"
                        "Wants=systemd-journald.service\n" + (f"After={after}\n" if after else ""))

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 30.0) -> None:
        _check_host()
        remove_stale_cgroups()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "empty").mkdir(exist_ok=True)
        self.kmsg.touch()
        self._write_base_units()
        v1, v2 = CGROUP_V1 / self.cgroup_name, CGROUP_V2 / self.cgroup_name
        v1.mkdir()
        v2.mkdir()
        # The launcher moves itself (only itself) into the sub-cgroups, then unshares.
        script = (f'echo $$ > "{v1}/cgroup.procs" && echo $$ > "{v2}/cgroup.procs" && exec unshare '
                  "--pid --fork --mount --uts --ipc --net --cgroup --propagation private "
                  f'--kill-child=SIGKILL -- "{sys.executable}" -I "{INIT_SCRIPT}" "{self.root}" '
                  f'"{SYSTEMD}" "{TARGET}"')
        started = time.monotonic()
        with open(self.output, "wb") as output:
            self.launcher = subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL,
                                             stdout=output, stderr=subprocess.STDOUT,
                                             preexec_fn=_die_with_parent)
        self.pid1 = self._wait_for_pid1(started + timeout_s)
        self._wait_running(started + timeout_s)
        self.started_s = time.monotonic() - started

    def _wait_for_pid1(self, until: float) -> int:
        """The host pid of the namespace's PID 1 once it is systemd (after the init script's exec)."""
        assert self.launcher is not None
        while time.monotonic() < until:
            if self.launcher.poll() is not None:
                raise NamespaceError(f"the namespace ended at once (exit {self.launcher.returncode})"
                                     + self.diagnostics())
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(self.launcher.pid).children():
                    if child.exe() == str(SYSTEMD.resolve()):
                        return int(child.pid)
            time.sleep(0.02)
        raise NamespaceError("systemd did not start as PID 1 in time" + self.diagnostics())

    def _wait_running(self, until: float) -> None:
        """`systemctl is-system-running --wait`, once the private socket answers."""
        state = ""
        while time.monotonic() < until:
            done = self.systemctl("is-system-running", "--wait", check=False,
                                  timeout=max(1.0, until - time.monotonic()))
            state = done.stdout.strip()
            if state in ("running", "degraded"):
                if state == "degraded":
                    failed = self.systemctl("list-units", "--failed", "--no-legend", check=False).stdout
                    raise NamespaceError(f"the manager is degraded: {failed}" + self.diagnostics())
                return
            time.sleep(0.05)  # the private socket is not there yet
        raise NamespaceError(f"the manager is not running in time ({state!r})" + self.diagnostics())

    def stop(self, timeout_s: float = 60.0) -> None:
        """Power off (the jobs stop as at a real shutdown), then remove the sub-cgroups."""
        try:
            if self.launcher is not None and self.launcher.poll() is None and self.pid1 is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid1, signal.SIGRTMIN + 4)
                try:
                    self.launcher.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid1, signal.SIGKILL)  # the whole namespace goes with it
                    self.launcher.wait(10)
                    raise NamespaceError("poweroff did not finish in time" + self.diagnostics()) from None
        finally:
            self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        for hierarchy in (CGROUP_V1, CGROUP_V2):
            _remove_cgroup_tree(hierarchy / self.cgroup_name)

    # ------------------------------------------------------------------ driving it
    def run(self, *argv: str, check: bool = True, timeout: float = 60.0,
            pid_namespace: bool = True) -> subprocess.CompletedProcess[str]:
        """A command inside the namespace (mount and PID namespaces of PID 1)."""
        assert self.pid1 is not None
        spaces = ["-m", "-p"] if pid_namespace else ["-m"]
        done = subprocess.run(["nsenter", "-t", str(self.pid1), *spaces, "--", *argv],
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise NamespaceError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}"
                                 + self.diagnostics())
        return done

    def systemctl(self, *args: str, check: bool = True,
                  timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout)

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        out = self.systemctl("show", unit, "-p", ",".join(properties)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, invocation: str | None = None, **fields: str) -> list[str]:
        """The messages of `unit` in the journal (of one invocation, with these fields), oldest first."""
        out = self.run("journalctl", "--no-pager", "-o", "json", "-u", unit, pid_namespace=False).stdout
        return [m for m in (_message(line, invocation, fields) for line in out.splitlines()) if m is not None]

    def wait_journal(self, predicate: Callable[[str], bool], unit: str, invocation: str | None = None,
                     timeout: float = 60.0, what: str = "") -> str:
        """Read `unit`'s journal, from where the last read ended, until a message satisfies
        `predicate`; bounded. (`journalctl -f` never saw new entries in this namespace: measured,
        so the journal is read again every 0.1 s from its cursor.)"""
        until = time.monotonic() + timeout
        cursor: str | None = None
        seen: list[str] = []
        while True:
            after = [f"--after-cursor={cursor}"] if cursor else []
            out = self.run("journalctl", "--no-pager", "-o", "json", "-u", unit, *after,
                           pid_namespace=False).stdout
            for line in out.splitlines():
                cursor = _cursor(line) or cursor
                message = _message(line, invocation, {})
                if message is None:
                    continue
                seen.append(message)
                if predicate(message):
                    return message
            if time.monotonic() > until:
                raise AssertionError(f"no {what or 'matching journal line'} within {timeout}s ({unit}, "
                                     f"invocation {invocation}): {seen[-15:]}" + self.diagnostics())
            time.sleep(0.1)

    def wait_state(self, unit: str, predicate: Callable[[dict[str, str]], bool], *properties: str,
                   timeout: float = 30.0) -> dict[str, str]:
        """Poll `systemctl show` (the manager's own state; no event to wait on) until it matches."""
        until = time.monotonic() + timeout
        while True:
            shown = self.show(unit, *properties)
            if predicate(shown) or time.monotonic() > until:
                return shown
            time.sleep(0.1)

    def diagnostics(self) -> str:
        """The manager's own log and output, for a failure message."""
        parts = []
        for label, path in (("manager log (/dev/kmsg)", self.kmsg), ("launcher output", self.output)):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").strip()
                if text:
                    parts.append(f"\n--- {label}, last lines ---\n" + "\n".join(text.splitlines()[-40:]))
        return "".join(parts)


def _check_host() -> None:
    """Say exactly what is missing instead of failing somewhere inside."""
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (namespaces, mounts, cgroups)")
    for tool in ("unshare", "nsenter", "setpriv", "mount", "systemctl", "journalctl"):
        if not any((Path(d) / tool).exists() for d in os.environ.get("PATH", os.defpath).split(":")):
            problems.append(f"{tool} not on PATH")
    if not SYSTEMD.exists() or not (SYSTEMD.parent / "systemd-journald").exists():
        problems.append(f"{SYSTEMD} or systemd-journald missing (apt-get install systemd)")
    if not (CGROUP_V1 / "cgroup.procs").exists() or not (CGROUP_V2 / "cgroup.procs").exists():
        problems.append(f"the host has no hybrid cgroup layout ({CGROUP_V1} name=systemd and "
                        f"{CGROUP_V2} cgroup2), which this harness was written for")
    if problems:
        raise NamespaceError("cannot run systemd in a namespace here: " + "; ".join(problems))


def _die_with_parent() -> None:
    """The launcher (then unshare, which takes PID 1 with it) dies with the test process."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def remove_stale_cgroups() -> None:
    """Sub-cgroups left by an earlier run that was killed: empty, and their test process is gone."""
    for hierarchy in (CGROUP_V1, CGROUP_V2):
        for top in hierarchy.glob("esiwrap-test-*"):
            owner = top.name.split("-")[2]
            if owner.isdigit() and not psutil.pid_exists(int(owner)):
                with contextlib.suppress(OSError):
                    _remove_cgroup_tree(top, timeout_s=0.0)


def _remove_cgroup_tree(top: Path, timeout_s: float = 10.0) -> None:
    """Depth first; a cgroup may stay busy for a moment after its last process is reaped."""
    if not top.exists():
        return
    for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _rmdir_when_empty(directory, timeout_s)
    _rmdir_when_empty(top, timeout_s)


def _rmdir_when_empty(directory: Path, timeout_s: float = 10.0) -> None:
    until = time.monotonic() + timeout_s
    while True:
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > until:
                raise
            time.sleep(0.05)


def _message(line: str, invocation: str | None, fields: dict[str, str]) -> str | None:
    """The MESSAGE of a `journalctl -o json` line when it matches; None otherwise."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if invocation is not None and entry.get("_SYSTEMD_INVOCATION_ID") != invocation:
        return None
    if any(entry.get(key) != value for key, value in fields.items()):
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald stores non-UTF-8 messages as byte arrays
        message = bytes(message).decode("utf-8", "replace")
    return message if isinstance(message, str) else None


def _cursor(line: str) -> str | None:
    try:
        cursor = json.loads(line).get("__CURSOR")
    except (ValueError, AttributeError):
        return None
    return cursor if isinstance(cursor, str) else None
