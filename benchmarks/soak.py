"""Soak: a real trainer under the real CLI, many times, on a starved node (issue 24).

    python benchmarks/soak.py                              # every load, 50 runs each (about 95 min)
    python benchmarks/soak.py --loads busy4,test76 --runs 20 --json soak.json --keep-logs soak-logs
    python benchmarks/soak.py --loads test76 --busy-per-core 4 --parallel 6     # harder than the test
    python benchmarks/soak.py --quick --loads idle         # a smoke run: 2 runs

Each run is `esiwrap` (the console script next to this Python) supervising a trainer, with an
absolute deadline taken before esiwrap is launched (a platform's deadline does not wait for
esiwrap to start), `--log-level debug` and `--log-file`. Every figure is read from that JSON log:

* the exit code, and for an exit 76 `save_missed` (its reason, and what never came);
* how late each save signal went out against its plan (`save_requested.late_s`);
* how late each step report reached esiwrap (`step_observed.delivery_s`);
* how late esiwrap's loop woke for its timers (`supervisor_exit.lateness.timers`: each run's p99
  and max);
* the final save's margin: the deadline (`deadline_resolved`) minus the last `save_completed`;
* how long the trainer took to attach (`trainer_attached`, from the launch): a trainer that
  attaches after its save was due is one way to miss.

The loads (`--loads`, comma-separated):

* idle, busy2, busy4: 0, 2 or 4 busy loops per core beside the runs, at plain priority;
* quota: a container at its CPU limit: a child cgroup (v2 `cpu.max`, else v1
  `cpu.cfs_quota_us`) of one core, holding two busy loops and the runs;
* memory: a container at its memory limit: a child cgroup (v2 `memory.max`, else v1
  `memory.limit_in_bytes`) holding the runs and a hog, with MEMORY_HEADROOM_MB a run left beside
  the hog: the hog keeps MEMORY_HOG_MB of its own memory touched and streams a dataset
  (DATASET_MB, read in a loop at DATASET_MB_S, as data loaders do) through the page cache, so the
  cgroup stays at its limit and every page a run asks for is reclaimed from something else;
* slowfs: the checkpoints on tests/lib/slowfs.py's FUSE filesystem (one a run slot) at SLOWFS_MB_S,
  with a checkpoint of SLOWFS_CHECKPOINT_MB (a save of about 2 s);
* test76: the conditions of `tests/unit/benchmarks/test_simulate.py::
  test_the_simulated_supervisor_saves_where_the_real_one_did`, where a loaded full-suite run
  once exited 76: its trainer (0.6 s steps, 0.3 s saves, no torch), its flags and its 16 s
  deadline, launched as the test harness does (`python -m esiwrap`, stderr read through a pipe),
  three at once (the suite's three workers) beside 2 busy loops per core;
* stalldisk: the same runs, with their status and state files on tests/lib/slowfs.py's filesystem
  with FILES_LATENCY_S added to every write, rename and fsync: a disk so busy (another job's
  checkpoint in its writeback) that a small file's write waits. esiwrap before issue 24 wrote
  them from its loop: this is the load under which it exited 76 (BENCHMARKS.md).

And one not in the default set (it keeps the shared disk busy): disk, another checkpoint of
DISK_WRITE_MB written and fsync'd in a loop beside the torch runs.

The trainer of every load but test76 is `examples/tiny_trainer.py`, the PyTorch demo: a real
CPU training step and a real checkpoint (torch.save to a temporary file, fsync, rename, fsync of
the directory), and a real torch start-up, which on a starved node eats seconds of the deadline
as it does for a user. Needs root for the cgroups and the FUSE mount (loads that cannot be set up
say why and are skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from esiwrap.core.policy import quantile
from esiwrap.envvars import PREFIX
from esiwrap.errors import EXIT_SAVE_MISSED
from esiwrap.times import iso_epoch

ROOT = Path(__file__).resolve().parent.parent
TINY_TRAINER = ROOT / "examples" / "tiny_trainer.py"
SLEEP_TRAINER = ROOT / "tests" / "lib" / "children" / "sleep_trainer.py"
SLOWFS = ROOT / "tests" / "lib" / "slowfs.py"
BUSY_LOOP = "while True: pass"
QUOTA_CORES = 1.0
# The quota's cgroup weighs as much as this many plain processes: to the scheduler a cgroup is one
# entity, and with the default weight a whole container would get one process's share of a shared
# machine, well below its quota, which would then never bind (a container runtime sets the weight
# from the container's CPU request).
QUOTA_WEIGHT_PROCESSES = 8
MEMORY_HOG_MB = 2048
DATASET_MB, DATASET_MB_S = 1024, 64
DISK_WRITE_MB = 1024
FILES_LATENCY_S = 2.0
# A run's share of the limit beside the hog: the torch trainer's anonymous memory (about 220 MB)
# and esiwrap's (13 MB), and a little for the files they read and write (their page cache).
MEMORY_HEADROOM_MB = 280
SLOWFS_MB_S = 20.0
SLOWFS_CHECKPOINT_MB = 40.0
TIMER_SLACK_S = 0.01  # a signal this much later than the loop's worst wake-up was not the timer's
RUN_TIMEOUT_EXTRA_S = 120.0  # a run still going this long after its deadline is killed and counted
CGROUP_ROOT = Path("/sys/fs/cgroup")

# The memory load's hog: MB of its own memory, every page written again twice a second (nothing
# of it goes cold), and a dataset read through the page cache in a loop at a bounded rate. The
# dataset is a sparse file: its pages are cached (and charged to the cgroup) without disk reads.
HOG = """\
import os, sys, time
size, dataset, rate = int(sys.argv[1]) << 20, sys.argv[2], float(sys.argv[3]) * 2**20
block = bytearray(size)
chunk = 1 << 20
fd = os.open(dataset, os.O_RDONLY)
tick, touched = 0, 0.0
while True:
    if time.monotonic() - touched >= 0.5:
        tick, touched = (tick + 1) % 251, time.monotonic()
        block[::4096] = bytes([tick]) * len(range(0, size, 4096))
    if not os.read(fd, chunk):
        os.lseek(fd, 0, os.SEEK_SET)
    time.sleep(chunk / rate)
"""


# The disk load's writer: another job's checkpoint, written and fsync'd again and again on the disk
# that holds /run, /tmp and the logs (a disk this busy holds up even a small file's write).
DISK_WRITER = """\
import os, sys
path, size = sys.argv[1], int(sys.argv[2]) << 20
chunk = b"\\0" * (1 << 20)
while True:
    with open(path, "wb") as out:
        for _ in range(size >> 20):
            out.write(chunk)
        os.fsync(out.fileno())
    os.unlink(path)
"""


# ---------------------------------------------------------------------------------- what runs
@dataclass(frozen=True)
class Workload:
    """A trainer, esiwrap's flags for it, and its deadline (seconds after the launch)."""

    name: str
    deadline_s: float
    flags: tuple[str, ...]
    harness: bool = False  # launched as the test harness does: `python -m esiwrap`, stderr piped

    def trainer(self, ckpt_dir: Path, checkpoint_mb: float) -> list[str]:
        if self.name == "test76":
            return [sys.executable, str(SLEEP_TRAINER), "0.6", "0.3"]
        frozen = ["--frozen-mb", f"{checkpoint_mb:g}"] if checkpoint_mb else []
        return [sys.executable, str(TINY_TRAINER), "--ckpt-dir", str(ckpt_dir), "--step-seconds", "0.5",
                *frozen]


WORKLOADS = {
    # 0.5 s steps; the insurance save planned from the checkpoint's size and the probed storage,
    # then a final save 1 s from the deadline at the closest
    "torch": Workload("torch", 40.0, ("--redundant-time", "4", "--save-duration", "1", "--final-margin", "1",
                                      "--local-checkpoints-survive")),
    # tests/unit/benchmarks/test_simulate.py::
    # test_the_simulated_supervisor_saves_where_the_real_one_did, as it is
    "test76": Workload("test76", 16.0, ("--redundant-time", "2", "--save-duration", "0.4",
                                        "--final-margin", "0.4"), harness=True),
}


@dataclass(frozen=True)
class Load:
    name: str
    what: str  # for the table; {busy} is the busy loops per core it ran with
    workload: str
    parallel: int  # runs at once
    busy_per_core: int = 0
    cpu_quota_cores: float | None = None  # a child cgroup with this quota holds the runs...
    quota_busy: int = 0  # ...and this many busy loops
    memory: bool = False  # a memory-limited child cgroup holds the runs and a hog
    slowfs: bool = False  # checkpoints on the paced FUSE filesystem
    deadline_s: float | None = None  # instead of the workload's
    disk_writer: bool = False  # a process keeps the disk that holds /run and /tmp busy writing
    files_latency_s: float | None = None  # status and state files on a FUSE disk this slow per write


LOADS = {
    "idle": Load("idle", "{busy} busy loops per core", "torch", 3),
    "busy2": Load("busy2", "{busy} busy loops per core", "torch", 3, busy_per_core=2),
    "busy4": Load("busy4", "{busy} busy loops per core", "torch", 3, busy_per_core=4),
    "quota": Load("quota", f"CPU quota of {QUOTA_CORES:g} core, 2 busy loops inside", "torch", 2,
                  cpu_quota_cores=QUOTA_CORES, quota_busy=2),
    "memory": Load("memory", f"memory limit: a {MEMORY_HOG_MB} MB hog streaming a dataset + "
                   f"{MEMORY_HEADROOM_MB} MB a run",
                   "torch", 3, memory=True),
    "slowfs": Load("slowfs", f"checkpoints ({SLOWFS_CHECKPOINT_MB:g} MB) on FUSE at {SLOWFS_MB_S:g} MB/s",
                   "torch", 3, slowfs=True),
    "test76": Load("test76", "the exit-76 test's conditions, {busy} busy loops per core", "test76", 3,
                   busy_per_core=2),
    "stalldisk": Load("stalldisk", f"the exit-76 test's runs, status and state files on a disk holding "
                      f"each write, rename and fsync {FILES_LATENCY_S:g} s", "test76", 3,
                      files_latency_s=FILES_LATENCY_S),
    "disk": Load("disk", f"a checkpoint written beside, {DISK_WRITE_MB} MB fsync'd in a loop", "torch", 3,
                 disk_writer=True),
}

DEFAULT_LOADS = [name for name in LOADS if name != "disk"]


@dataclass
class RunResult:
    load: str
    index: int
    code: int | None  # None: still running RUN_TIMEOUT_EXTRA_S after its deadline (killed)
    log: str
    attached_s: float | None = None  # from the launch to trainer_attached
    signal_late_s: list[float] = field(default_factory=list)  # save_requested.late_s, deadline saves
    delivery_s: list[float] = field(default_factory=list)  # step_observed.delivery_s
    timer_p99_s: float | None = None
    timer_max_s: float | None = None
    final_margin_s: float | None = None  # deadline - the last save_completed
    saves: int = 0
    exit_reason: str = ""
    missed: dict[str, Any] | None = None  # save_missed, for an exit 76


# ---------------------------------------------------------------------------------- one run
def esiwrap_command(harness: bool) -> list[str]:
    """The console script next to this Python (what a user runs), or `python -m esiwrap` as the
    test harness launches it."""
    script = Path(sys.executable).parent / "esiwrap"
    if harness or not script.exists():
        return [sys.executable, "-m", "esiwrap"]
    return [str(script)]


def run_environment(harness: bool) -> dict[str, str]:
    """The harness passes the tests' environment as it is; a user's install keeps bytecode caches
    (PYTHONDONTWRITEBYTECODE, set on some machines, would compile esiwrap at every start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    if harness:
        env.setdefault("PYTHONUNBUFFERED", "1")
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def in_cgroups(command: list[str], procs_files: Sequence[Path]) -> list[str]:
    """`command`, started by a shell that first moves itself into these cgroups (so everything
    it execs, and all their children, start inside)."""
    if not procs_files:
        return command
    moves = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in procs_files)
    return ["sh", "-c", f'{moves} && exec "$@"', "sh", *command]


class Processes:
    """Every process the soak started, each in its own session: killed (group) when it ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self, command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(command, start_new_session=True, **kwargs)
        with self._lock:
            self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)

    def stop_all(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            self.stop(proc)


def run_once(load: Load, workload: Workload, index: int, run_dir: Path, ckpt_dir: Path,
             cgroups: Sequence[Path], processes: Processes, checkpoint_mb: float,
             files_dir: Path | None = None) -> RunResult:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "esiwrap.jsonl"
    files = [] if files_dir is None else ["--status-file", str(files_dir / f"{run_dir.name}-status.json"),
                                          "--state-file", str(files_dir / f"{run_dir.name}-state.json")]
    launched = time.time()
    deadline = launched + workload.deadline_s
    command = [*esiwrap_command(workload.harness), "--deadline", f"{deadline:.3f}", *workload.flags, *files,
               "--log-level", "debug", "--log-file", str(log), "--",
               *workload.trainer(ckpt_dir, checkpoint_mb)]
    env = run_environment(workload.harness)
    with open(run_dir / "stderr.txt", "wb") as err:
        if workload.harness:  # the harness reads esiwrap's stderr through a pipe as it comes
            proc = processes.start(in_cgroups(command, cgroups), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env)
            code = _read_pipes(proc, deadline + RUN_TIMEOUT_EXTRA_S)
        else:
            proc = processes.start(in_cgroups(command, cgroups), stdout=subprocess.DEVNULL, stderr=err,
                                   env=env)
            try:
                code = proc.wait(timeout=deadline + RUN_TIMEOUT_EXTRA_S - time.time())
            except subprocess.TimeoutExpired:
                code = None
    processes.stop(proc)  # whatever is left of its tree
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return read_log(load.name, index, code, log, launched)


def _read_pipes(proc: subprocess.Popen[bytes], until: float) -> int | None:
    """Read stdout and stderr as they come (a thread each), as tests/lib/esiwrap_harness.py does."""
    def drain(stream: Any) -> None:
        while os.read(stream.fileno(), 65536):
            pass

    readers = [threading.Thread(target=drain, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    try:
        return proc.wait(timeout=max(0.1, until - time.time()))
    except subprocess.TimeoutExpired:
        return None
    finally:
        for reader in readers:
            reader.join(timeout=5)


def read_log(load: str, index: int, code: int | None, log: Path, launched: float) -> RunResult:
    """The run's figures, from esiwrap's JSON log alone."""
    result = RunResult(load, index, code, str(log))
    events = []
    with contextlib.suppress(OSError):
        for line in log.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    deadline: float | None = None
    completed: list[float] = []
    for event in events:
        name = event.get("event")
        if name == "deadline_resolved":
            deadline = iso_epoch(event["deadline"])
        elif name == "deadline_changed":
            deadline = iso_epoch(event["new"])
        elif name == "trainer_attached" and result.attached_s is None:
            result.attached_s = iso_epoch(event["timestamp"]) - launched
        elif name == "save_requested" and "late_s" in event and event["late_s"] is not None:
            result.signal_late_s.append(float(event["late_s"]))
        elif name == "step_observed" and event.get("delivery_s") is not None:
            result.delivery_s.append(float(event["delivery_s"]))
        elif name == "save_completed":
            completed.append(iso_epoch(event["timestamp"]))
        elif name == "save_missed":
            result.missed = {k: v for k, v in event.items() if k not in ("timestamp", "level", "run_id")}
        elif name == "supervisor_exit":
            timers = (event.get("lateness") or {}).get("timers") or {}
            result.timer_p99_s, result.timer_max_s = timers.get("p99_s"), timers.get("max_s")
            result.exit_reason = str(event.get("reason", ""))
    result.saves = len(completed)
    if deadline is not None and completed:
        result.final_margin_s = deadline - completed[-1]
    return result


# ---------------------------------------------------------------------------------- the loads
@contextlib.contextmanager
def busy_loops(count: int, processes: Processes, cgroups: Sequence[Path] = ()) -> Iterator[None]:
    """`count` processes spinning at plain priority (each its own interpreter, so no GIL is shared)."""
    started = [processes.start(in_cgroups([sys.executable, "-c", BUSY_LOOP], cgroups),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(count)]
    try:
        yield
    finally:
        for proc in started:
            processes.stop(proc)


class Cgroup:
    """A child cgroup of this process's own, for one controller; removed when the load ends."""

    def __init__(self, controller: str, name: str) -> None:
        self.controller = controller
        self.v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        if self.v2:
            available = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
            if controller not in available:
                msg = f"cgroup v2 has no {controller} controller here"
                raise OSError(msg)
            # under the root: it is exempt from "no processes in a cgroup whose children have controllers"
            (CGROUP_ROOT / "cgroup.subtree_control").write_text(f"+{controller}")
            self.path = CGROUP_ROOT / name
        else:
            mount = _v1_mount(controller)
            self.path = mount / _own_v1_path(controller).lstrip("/") / name
        self.path.mkdir()

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def read(self, name: str) -> str:
        try:
            return (self.path / name).read_text()
        except OSError:
            return ""

    def remove(self) -> None:
        """rmdir once the processes have left (a killed process leaves as it is reaped); a cgroup
        still busy after 30 s is left, and said so."""
        end = time.monotonic() + 30
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > end:
                    print(f"soak: {self.path} left in place: {exc}", file=sys.stderr)
                    return
                time.sleep(0.2)


def _v1_mount(controller: str) -> Path:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            _, where, kind, options, *_ = line.split()
            if kind == "cgroup" and controller in options.split(","):
                return Path(where)
    msg = f"no cgroup v1 hierarchy with the {controller} controller is mounted"
    raise OSError(msg)


def _own_v1_path(controller: str) -> str:
    with open("/proc/self/cgroup", encoding="utf-8") as own:
        for line in own:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return path
    return "/"


@dataclass
class Setting:
    """What a load put in place for its runs: cgroups to start them in, checkpoint directories (one
    a slot), and how to tell what the load did (throttling, memory failures)."""

    cgroups: list[Path] = field(default_factory=list)
    ckpt_roots: list[Path] = field(default_factory=list)
    files_roots: list[Path] = field(default_factory=list)  # where each slot's status and state files go
    checkpoint_mb: float = 0.0
    report: Callable[[], str] = lambda: ""


@contextlib.contextmanager
def load_in_place(load: Load, parallel: int, busy_per_core: int, scratch: Path,
                  processes: Processes) -> Iterator[Setting]:
    cores = os.cpu_count() or 1
    setting = Setting(ckpt_roots=[scratch / f"ckpt-{slot}" for slot in range(parallel)])
    with contextlib.ExitStack() as stack:
        stack.enter_context(busy_loops(busy_per_core * cores, processes))
        if load.cpu_quota_cores is not None:
            group = Cgroup("cpu", f"esiwrap-soak-{os.getpid()}-cpu")
            stack.callback(group.remove)
            period = 100_000
            quota = int(load.cpu_quota_cores * period)
            if group.v2:
                group.write("cpu.max", f"{quota} {period}")
                group.write("cpu.weight", str(100 * QUOTA_WEIGHT_PROCESSES))
            else:
                group.write("cpu.cfs_period_us", str(period))
                group.write("cpu.cfs_quota_us", str(quota))
                group.write("cpu.shares", str(1024 * QUOTA_WEIGHT_PROCESSES))
            setting.cgroups.append(group.procs)
            stack.enter_context(busy_loops(load.quota_busy, processes, [group.procs]))
            setting.report = lambda: _throttling(group)
        if load.memory:
            group = Cgroup("memory", f"esiwrap-soak-{os.getpid()}-memory")
            stack.callback(group.remove)
            limit = (MEMORY_HOG_MB + MEMORY_HEADROOM_MB * parallel) << 20
            group.write("memory.max" if group.v2 else "memory.limit_in_bytes", str(limit))
            setting.cgroups.append(group.procs)
            dataset = scratch / "dataset"
            dataset.parent.mkdir(parents=True, exist_ok=True)
            with open(dataset, "wb") as sparse:
                sparse.truncate(DATASET_MB << 20)
            hog_command = [sys.executable, "-c", HOG, str(MEMORY_HOG_MB), str(dataset), str(DATASET_MB_S)]
            hog = processes.start(in_cgroups(hog_command, [group.procs]), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            stack.callback(processes.stop, hog)
            setting.report = lambda: _memory_pressure(group)
        if load.disk_writer:
            target = scratch / "checkpoint-beside"
            target.parent.mkdir(parents=True, exist_ok=True)
            writer = processes.start([sys.executable, "-c", DISK_WRITER, str(target), str(DISK_WRITE_MB)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            stack.callback(processes.stop, writer)
        if load.slowfs or load.files_latency_s is not None:
            sys.path.insert(0, str(SLOWFS.parent))
            import slowfs  # type: ignore[import-not-found]  # tests/lib/slowfs.py

            def mounts(name: str, bytes_per_s: float, latency_s: float = 0.0) -> list[Path]:
                return [stack.enter_context(slowfs.mounted(scratch / f"{name}-{slot}", bytes_per_s,
                                                           latency_s)) for slot in range(parallel)]

            if load.slowfs:
                setting.ckpt_roots = mounts("slowfs", SLOWFS_MB_S * 1e6)
                setting.checkpoint_mb = SLOWFS_CHECKPOINT_MB
            if load.files_latency_s is not None:
                setting.files_roots = mounts("stalldisk", 50e6, load.files_latency_s)
        yield setting


def _throttling(group: Cgroup) -> str:
    stat = dict(line.split() for line in group.read("cpu.stat").splitlines() if line.strip())
    periods, throttled = int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))
    return f"throttled in {throttled:,} of {periods:,} periods"


def _memory_pressure(group: Cgroup) -> str:
    if group.v2:
        events = dict(line.split() for line in group.read("memory.events").splitlines() if line.strip())
        return (f"limit reached {events.get('max', '?')} times, OOM kills {events.get('oom_kill', '?')}, "
                f"peak {int(group.read('memory.peak').strip() or 0) >> 20} MB")
    failcnt = group.read("memory.failcnt").strip() or "?"
    peak = int(group.read("memory.max_usage_in_bytes").strip() or 0) >> 20
    oom = dict(line.split() for line in group.read("memory.oom_control").splitlines() if line.strip())
    return f"limit reached {failcnt} times, OOM kills {oom.get('oom_kill', '?')}, peak {peak} MB"


# ---------------------------------------------------------------------------------- a load's runs
@dataclass
class LoadResult:
    load: Load
    parallel: int
    busy_per_core: int
    workload: str
    deadline_s: float
    runs: list[RunResult]
    seconds: float
    load_average: float  # the 1-minute load average as the load ended
    note: str = ""
    skipped: str = ""


def run_load(load: Load, workload: Workload, runs: int, parallel: int, busy_per_core: int, scratch: Path,
             processes: Processes, progress: Callable[[str], None]) -> LoadResult:
    started = time.monotonic()
    results: list[RunResult] = []
    base = LoadResult(load, parallel, busy_per_core, workload.name, workload.deadline_s, results, 0.0, 0.0)
    try:
        with load_in_place(load, parallel, busy_per_core, scratch, processes) as setting:
            def slot(k: int) -> None:
                # the slots start out of step, as the test suite's workers are
                time.sleep(k * workload.deadline_s / parallel)
                for index in range(k, runs, parallel):
                    result = run_once(load, workload, index, scratch / f"run-{index:03d}",
                                      setting.ckpt_roots[k] / f"run-{index:03d}", setting.cgroups, processes,
                                      setting.checkpoint_mb,
                                      setting.files_roots[k] if setting.files_roots else None)
                    results.append(result)
                    progress(f"{load.name} {len(results)}/{runs}: exit {result.code}"
                             + (f" ({result.exit_reason})" if result.code != 75 else ""))

            with ThreadPoolExecutor(max_workers=parallel) as pool:
                for done in [pool.submit(slot, k) for k in range(parallel)]:
                    done.result()
            base.note = setting.report()
    except OSError as exc:
        base.skipped = f"cannot set up: {exc}"
    base.runs.sort(key=lambda r: r.index)
    base.seconds = time.monotonic() - started
    base.load_average = os.getloadavg()[0]
    return base


# ---------------------------------------------------------------------------------- the table
def _q(values: Sequence[float], q: float) -> float | None:
    return quantile(values, q) if values else None


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _three(values: Sequence[float]) -> str:
    if not values:
        return "–"
    return f"{_f(_q(values, 0.5))} / {_f(_q(values, 0.99))} / {_f(max(values))}"


def timer_signals(run: RunResult) -> tuple[list[float], list[float]]:
    """The run's save signals split in two by how late they came against their plan: those within
    the loop's worst lateness of the run (their timer fired, at most that late), and those later
    still, which no late wake-up explains: the plan's moment had passed when the plan was made
    (a probe or a step report moved it earlier, or the trainer attached after it)."""
    bound = (run.timer_max_s or 0.0) + TIMER_SLACK_S
    return ([x for x in run.signal_late_s if x <= bound], [x for x in run.signal_late_s if x > bound])


def summary(result: LoadResult) -> dict[str, Any]:
    runs = result.runs
    codes = Counter("hung" if r.code is None else str(r.code) for r in runs)
    late = [x for r in runs for x in timer_signals(r)[0]]
    passed = [x for r in runs for x in timer_signals(r)[1]]
    delivery = [x for r in runs for x in r.delivery_s]
    margins = [r.final_margin_s for r in runs if r.final_margin_s is not None]
    attached = [r.attached_s for r in runs if r.attached_s is not None]
    timer_p99 = [r.timer_p99_s for r in runs if r.timer_p99_s is not None]
    timer_max = [r.timer_max_s for r in runs if r.timer_max_s is not None]
    return {
        "load": result.load.name, "what": result.load.what.format(busy=result.busy_per_core),
        "parallel": result.parallel,
        "busy_per_core": result.busy_per_core, "workload": result.workload, "deadline_s": result.deadline_s,
        "runs": len(runs), "misses": sum(r.code == EXIT_SAVE_MISSED for r in runs),
        "codes": dict(sorted(codes.items())), "signals": len(late) + len(passed),
        "step_reports": len(delivery),
        "signal_late_s": _spread(late), "plan_passed": {"n": len(passed), "max_s": max(passed, default=None)},
        "delivery_s": _spread(delivery),
        "timer_late_p99_s_median_run": statistics.median(timer_p99) if timer_p99 else None,
        "timer_late_max_s": max(timer_max) if timer_max else None,
        "final_margin_s": {"min": min(margins) if margins else None, "p50": _q(margins, 0.5)},
        "attached_s": {"p50": _q(attached, 0.5), "max": max(attached) if attached else None},
        "minutes": round(result.seconds / 60, 1), "load_average_end": round(result.load_average, 2),
        "note": result.note, "skipped": result.skipped,
    }


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": _q(values, 0.5), "p99": _q(values, 0.99), "max": max(values) if values else None}


HEADER = ("| load | at once | runs | misses | exit codes | signal late p50 / p99 / max (s) "
          "| plan past: n (max s) "
          "| step report delay p50 / p99 / max (s) | timer late: run p99 (median) / max (s) "
          "| final save margin min / p50 (s) | trainer attached p50 / max (s) |")


def table(results: Sequence[LoadResult]) -> str:
    """The Markdown table, a line of notes per load, and a line per run that did not exit 75."""
    lines = [HEADER, "|" + "---|" * (HEADER.count(" | ") + 1)]
    notes = []
    for result in results:
        s = summary(result)
        if result.skipped:
            notes.append(f"- {s['load']}: skipped, {result.skipped}")
            continue
        late = [x for r in result.runs for x in timer_signals(r)[0]]
        delivery = [x for r in result.runs for x in r.delivery_s]
        codes = ", ".join(f"{code} × {n}" for code, n in s["codes"].items()) or "–"
        passed = f"{s['plan_passed']['n']} ({_f(s['plan_passed']['max_s'])})"
        timers = f"{_f(s['timer_late_p99_s_median_run'], 3)} / {_f(s['timer_late_max_s'], 3)}"
        margin = f"{_f(s['final_margin_s']['min'])} / {_f(s['final_margin_s']['p50'])}"
        attached = f"{_f(s['attached_s']['p50'], 1)} / {_f(s['attached_s']['max'], 1)}"
        lines.append(f"| {s['load']}: {s['what']} | {s['parallel']} | {s['runs']} | **{s['misses']}** "
                     f"| {codes} | {_three(late)} | {passed} | {_three(delivery)} | {timers} | {margin} "
                     f"| {attached} |")
        extra = f"; {result.note}" if result.note else ""
        notes.append(f"- {s['load']}: the {s['workload']} trainer, deadline {s['deadline_s']:g} s after the "
                     f"launch, {s['busy_per_core']} busy loops per core; {s['signals']} save signals, "
                     f"{len(delivery)} step reports; {s['minutes']} min, load average "
                     f"{s['load_average_end']} at the end{extra}")
        for run in result.runs:
            if run.code != 75:
                never = f"; never came: {run.missed.get('never_came')}" if run.missed else ""
                notes.append(f"  - run {run.index}: exit {run.code}: "
                             f"{run.exit_reason or 'no supervisor_exit'}{never}")
    return "\n".join([*lines, "", *notes])


def machine() -> str:
    cores = os.cpu_count()
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cgroups = "v2" if (CGROUP_ROOT / "cgroup.controllers").exists() else "v1"
    return (f"{cores} cores, {mem_gb:.1f} GB, Linux {platform.release()}, cgroup {cgroups}, "
            f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the start")


# ---------------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", default=",".join(DEFAULT_LOADS),
                        help=f"comma-separated, of: {', '.join(LOADS)} (default: all but disk)")
    parser.add_argument("--runs", type=int, help="runs per load (default 50; 2 with --quick)")
    parser.add_argument("--parallel", type=int, help="runs at once (default: each load's own)")
    parser.add_argument("--busy-per-core", type=int, help="busy loops per core (default: each load's own)")
    parser.add_argument("--workload", choices=list(WORKLOADS), help="trainer and flags (default: the load's)")
    parser.add_argument("--deadline-s", type=float, help="seconds from the launch to the deadline")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 runs per load")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--keep-logs", type=Path, help="keep each run's log under this directory")
    return parser


def usage_error(message: str) -> NoReturn:
    print(f"soak.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_loads(text: str) -> list[Load]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOADS]
    if unknown or not names:
        usage_error(f"--loads {text!r}: unknown {', '.join(unknown) or 'nothing'}; use some of "
                    f"{','.join(LOADS)}")
    return [LOADS[n] for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    loads = parse_loads(ns.loads)
    runs = ns.runs or (2 if ns.quick else 50)
    for name, value, least in (("--runs", runs, 1), ("--parallel", ns.parallel, 1),
                               ("--busy-per-core", ns.busy_per_core, 0), ("--deadline-s", ns.deadline_s, 1)):
        if value is not None and value < least:
            usage_error(f"{name} {value}: must be at least {least}")
    print(f"Machine: {machine()}.", flush=True)
    processes = Processes()
    scratch = Path(tempfile.mkdtemp(prefix="esiwrap-soak-"))
    results: list[LoadResult] = []
    try:
        for load in loads:
            workload = WORKLOADS[ns.workload or load.workload]
            deadline_s = ns.deadline_s or load.deadline_s
            if deadline_s is not None:
                workload = replace(workload, deadline_s=deadline_s)
            parallel = min(runs, ns.parallel or load.parallel)
            busy = load.busy_per_core if ns.busy_per_core is None else ns.busy_per_core
            results.append(run_load(load, workload, runs, parallel, busy, scratch / load.name, processes,
                                    lambda text: print(text, file=sys.stderr, flush=True)))
    finally:
        processes.stop_all()
        if ns.keep_logs is not None:
            ns.keep_logs.mkdir(parents=True, exist_ok=True)
            for path in scratch.rglob("esiwrap.jsonl"):
                target = ns.keep_logs / path.relative_to(scratch)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        shutil.rmtree(scratch, ignore_errors=True)
    if ns.json is not None:
        document = {"machine": machine(), "loads": [summary(r) for r in results],
                    "runs": [asdict(run) for r in results for run in r.runs]}
        ns.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
