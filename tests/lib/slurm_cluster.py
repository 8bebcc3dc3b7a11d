"""A real Slurm for tests: Debian's munged, slurmctld and slurmd (22.05), started as plain
processes from a temporary directory and stopped by their PIDs.

No systemd and no cgroups: `ProctrackType=proctrack/linuxproc` follows a job's processes by
their parent links, `TaskPlugin=task/none`, and nothing is accounted. munged runs as the `munge`
user with its key, socket, pid and log in a directory of its own under /tmp (every directory
above its socket must be searchable by munge, which pytest's 0700 temporary directories are not;
its key directory private); slurmctld and slurmd run as root in the
foreground (`-D`). Every client needs `SLURM_CONF`: `env()` has it. Ports are picked free, so
the cluster never meets another on this machine.

`AuthInfo=cred_expire=10` lets a requeued job start again ~12 s after it ended (Slurm holds it
for the credential's lifetime + 1 s; 120 s by default), `KillWait=5` shortens the SIGTERM →
SIGKILL wait from 30 s, `MinJobAge=10` forgets finished jobs soon.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
from esiwrap_harness import free_port, wait_until

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def missing_programs() -> list[str]:
    """What scripts/test.sh installs (slurmctld slurmd slurm-client munge) and is not here."""
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]


class SlurmCluster:
    """One node (this host, 2 CPUs), one partition, started in `tmp`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.node = socket.gethostname().split(".")[0]
        self.conf = tmp / "slurm.conf"
        self.logs = tmp / "log"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._munge_root = Path(tempfile.mkdtemp(prefix="esiwrap-munge-"))
        self._munge_root.chmod(0o755)
        self._munge_dir = self._munge_root / "run"

    # ------------------------------------------------------------------ set-up
    def start(self) -> SlurmCluster:
        for sub in ("state", "spool", "log", "jobs"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)
        self._start_munged()
        self.conf.write_text(self._config(), encoding="utf-8")
        self._start("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        if not wait_until(self._node_idle, READY_TIMEOUT_S, interval=0.2):
            self.stop()
            msg = f"the Slurm node did not become idle within {READY_TIMEOUT_S:g}s:\n{self.log_tail()}"
            raise AssertionError(msg)
        return self

    def _start_munged(self) -> None:
        munge = pwd.getpwnam("munge")
        key_dir = self._munge_root / "key"
        for directory, mode in ((key_dir, 0o700), (self._munge_dir, 0o755)):
            directory.mkdir(parents=True, exist_ok=True)
            os.chown(directory, munge.pw_uid, munge.pw_gid)
            directory.chmod(mode)
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chown(key, munge.pw_uid, munge.pw_gid)
        key.chmod(0o400)
        self._start("munged", [
            "munged", "-F", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={self._munge_dir / 'munged.pid'}", f"--log-file={self._munge_dir / 'munged.log'}",
            f"--seed-file={self._munge_dir / 'munged.seed'}",
        ], user=munge.pw_uid, group=munge.pw_gid)
        if not wait_until(self.munge_socket.exists, 10.0):
            msg = f"munged did not create its socket within 10s:\n{self.log_tail()}"
            raise AssertionError(msg)

    @property
    def munge_socket(self) -> Path:
        return self._munge_dir / "munge.socket"

    def _config(self) -> str:
        t = self.tmp
        return "\n".join([
            "ClusterName=esiwraptest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerParameters=bf_interval=1,sched_interval=2",
            "KillWait=5",
            "MinJobAge=10",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "MpiDefault=none",
            f"StateSaveLocation={t / 'state'}",
            f"SlurmdSpoolDir={t / 'spool'}",
            f"SlurmctldPidFile={t / 'slurmctld.pid'}",
            f"SlurmdPidFile={t / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd.log'}",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
            f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def _start(self, name: str, argv: Sequence[str], user: int | None = None,
               group: int | None = None) -> None:
        out = open(self.logs / f"{name}.out", "wb")  # noqa: SIM115 - the daemon writes it while it runs
        try:
            self.procs[name] = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.env(), user=user, group=group, extra_groups=[] if user is not None else None,
                start_new_session=True,
            )
        finally:
            out.close()

    def _node_idle(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                msg = f"{name} exited with {proc.returncode}:\n{self.log_tail()}"
                raise AssertionError(msg)
        done = self.client("sinfo", "-h", "-n", self.node, "-o", "%T", check=False, timeout=10)
        return done.stdout.strip() == "idle"

    # ------------------------------------------------------------------ use
    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment with the cluster's SLURM_CONF, minus any Slurm job's
        variables (a test started inside a job must not look like one)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_"))}
        return {**env, "SLURM_CONF": str(self.conf), **extra}

    def client(self, *argv: str, check: bool = True,
               timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=check)

    def sbatch(self, script: Path, *options: str) -> str:
        """Submit `script`; the job id."""
        done = self.client("sbatch", "--parsable", *options, str(script))
        return done.stdout.strip().split(";")[0]

    def job_field(self, job: str, fmt: str) -> str:
        """One squeue field of `job` ('' once Slurm has forgotten it)."""
        done = self.client("squeue", "-h", "-j", job, "-o", fmt, check=False)
        return done.stdout.strip()

    def end_time(self, job: str) -> int:
        """The job's end time as Slurm enforces it, epoch seconds."""
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], env=self.env(SLURM_TIME_FORMAT="%s"),
                              capture_output=True, text=True, timeout=30, check=True)
        return int(done.stdout.strip())

    def log_tail(self, lines: int = 15) -> str:
        parts = []
        for path in sorted(self.logs.glob("*")):
            with contextlib.suppress(OSError):
                tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        with contextlib.suppress(OSError):
            tail = (self._munge_dir / "munged.log").read_text(errors="replace").splitlines()[-lines:]
            parts.append("--- munged.log\n" + "\n".join(tail))
        return "\n".join(parts)

    # ------------------------------------------------------------------ tear-down
    def stop(self) -> None:
        """Cancel every job, stop the three daemons by PID (SIGTERM, then SIGKILL), and kill any
        process a job left behind (linuxproc loses track of a process whose parent died)."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.client("scancel", "--full", "--signal=KILL", "--user=root", check=False, timeout=10)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for proc in self.leftovers():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        shutil.rmtree(self._munge_root, ignore_errors=True)

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this cluster still alive: slurmstepd and job processes, found by this
        cluster's directory in their command line or their SLURM_CONF."""
        marker = str(self.tmp)
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if any(marker in part for part in proc.info["cmdline"] or []) \
                        or proc.environ().get("SLURM_CONF") == str(self.conf):
                    found.append(proc)
        return found


@contextlib.contextmanager
def running_cluster(tmp: Path) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(tmp).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def wait_for_file_text(path: Path, text: str, timeout: float) -> str:
    """The file's content once it holds `text` (a job's output file), bounded."""
    def has_it() -> bool:
        with contextlib.suppress(OSError):
            return text in path.read_text(encoding="utf-8", errors="replace")
        return False

    if not wait_until(has_it, timeout, interval=0.2):
        content = path.read_text(encoding="utf-8", errors="replace") if path.exists() else "(no file)"
        msg = f"{path} has no {text!r} within {timeout:g}s:\n{content[-3000:]}"
        raise AssertionError(msg)
    return path.read_text(encoding="utf-8", errors="replace")
