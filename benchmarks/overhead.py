"""What esiwrap costs: supervisor memory and CPU, start-up, the trainer-side calls, signal latency,
and how soon after exec a signal can no longer kill it (beside tini and a bare Python).

tini, for the side-by-side figures, is Debian's: `apt-get install tini` (left out when absent).

    python benchmarks/overhead.py                 # the full run (about two minutes)
    python benchmarks/overhead.py --quick         # a few seconds per measurement
    python benchmarks/overhead.py --json out.json --bare-python /tmp/bare/bin/python

Every measurement runs the real thing: `esiwrap` as a process (the console script next to this
Python), `esiwrap.trainer` inside a child that a live esiwrap supervises, real signals. Figures
are medians with their spread (p10-p90, or p99 where the tail matters); the machine is described
at the top, with its load average, because a shared machine makes every timing noisier.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from esiwrap.core.policy import quantile
from esiwrap.envvars import PREFIX, SOCKET_ENV

HEAVY_MODULES = ("torch", "verl", "ray", "transformers", "numpy", "volcenginesdkcore", "volcenginesdkecs")
IMPORT_TARGETS = ("esiwrap", "esiwrap.cli", "esiwrap.trainer", "esiwrap.shell.supervisor")
PIN_ENV = "OVERHEAD_PIN_CPU"  # the trainer child pins itself to this core


# ---------------------------------------------------------------------------------- helpers
def child_env() -> dict[str, str]:
    """Ours, without any ESIWRAP_* setting (a surrounding esiwrap's socket, option defaults), and
    with bytecode caching on: a user's install has .pyc files, while PYTHONDONTWRITEBYTECODE (set
    on some machines, this one included) would recompile esiwrap at every start."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(PREFIX) and k != "PYTHONDONTWRITEBYTECODE"}


def warm_up(python: str) -> None:
    """Write the bytecode caches and page the files in before anything is timed."""
    code = "import esiwrap.cli, esiwrap.shell.log, esiwrap.shell.supervisor, esiwrap.trainer"
    subprocess.run([python, "-c", code], env=child_env(), check=True)
    subprocess.run([*esiwrap_command(python), "--sources", "cli,env", "--", "true"], env=child_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def esiwrap_command(python: str = sys.executable) -> list[str]:
    """The console script installed next to `python`, else `python -m esiwrap`."""
    script = Path(python).parent / "esiwrap"
    return [str(script)] if script.exists() else [python, "-m", "esiwrap"]


def spread(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """Median, nearest-rank p10/p90/p99 (`policy.quantile`: values that occurred), min and max."""
    ordered = sorted(v * scale for v in values)
    return {"n": len(ordered), "median": statistics.median(ordered), "p10": quantile(ordered, 0.10),
            "p90": quantile(ordered, 0.90), "p99": quantile(ordered, 0.99), "min": ordered[0],
            "max": ordered[-1]}


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model, "logical_cores": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "kernel": platform.release(), "load_average": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------------- 1. idle supervisor
def idle_supervisor(seconds: float, metrics: bool = False) -> dict[str, Any]:
    """esiwrap supervising `sleep` with a deadline hours away: CPU over the window, RSS at its end.
    With `metrics`, the metrics file, the metrics endpoint and the status file are on, and the
    endpoint is scraped once a second (as Prometheus would, if much more often)."""
    settle = min(2.0, seconds / 4)
    extra: list[str] = []
    url = None
    if metrics:
        scratch, port = tempfile.mkdtemp(prefix="esiwrap-overhead-"), _free_port()
        extra = ["--metrics-file", os.path.join(scratch, "esiwrap.prom"), "--metrics-port", str(port),
                 "--status-file", os.path.join(scratch, "status.json")]
        url = f"http://127.0.0.1:{port}/metrics"
    cmd = [*esiwrap_command(), "--deadline", "+2h", "--on-sigterm", "forward", *extra, "--", "sleep", "3600"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env())
    try:
        sup = psutil.Process(proc.pid)
        time.sleep(settle)  # start-up is measured separately; this is the idle loop alone
        cpu0, wall0 = sup.cpu_times(), time.monotonic()
        startup_cpu = cpu0.user + cpu0.system
        scrapes = 0
        while time.monotonic() - wall0 < seconds:
            if url is not None:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    answer.read()
                scrapes += 1
            time.sleep(1.0 if url is not None else seconds)
        cpu1, wall1 = sup.cpu_times(), time.monotonic()
        memory = sup.memory_full_info()
    finally:
        proc.send_signal(signal.SIGTERM)  # forwarded to sleep; esiwrap exits with it
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "window_s": round(wall1 - wall0, 3), "cpu_s": round(used, 4),
        "cpu_percent": round(100.0 * used / (wall1 - wall0), 4),
        "startup_cpu_s": round(startup_cpu, 3),
        "rss_mb": round(memory.rss / 2**20, 1), "uss_mb": round(memory.uss / 2**20, 1),
        "scrapes": scrapes,
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ---------------------------------------------------------------------------------- 2. esiwrap -- true
def wrap_overhead(repeat: int) -> dict[str, Any]:
    """Wall time of `esiwrap -- true`, of `true` and of a bare `python -c pass`, interleaved so
    load drifts hit all alike; and, from esiwrap's own log, how much of it is supervision."""
    true = shutil.which("true") or "/bin/true"
    # Local sources only: a cloud metadata source would reach for an endpoint (never off this
    # machine in a benchmark), and with --deadline, cli is the only one asked anyway.
    commands = {"esiwrap": [*esiwrap_command(), "--sources", "cli,env", "--", true], "true": [true],
                "python": [sys.executable, "-c", "pass"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}  # user + system, less load-sensitive
    for _ in range(repeat):
        for name, cmd in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                           check=True)
            times[name].append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    added = [w - b for w, b in zip(times["esiwrap"], times["true"], strict=True)]
    supervised = []
    for _ in range(min(repeat, 10)):
        result = subprocess.run(commands["esiwrap"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=child_env(), check=True)
        supervised.append(_log_span_s(result.stderr, "child_started", "supervisor_exit"))
    ratio = statistics.median(times["esiwrap"]) / statistics.median(times["python"])
    return {"esiwrap_true_ms": spread(times["esiwrap"], 1000), "true_ms": spread(times["true"], 1000),
            "python_pass_ms": spread(times["python"], 1000), "added_ms": spread(added, 1000),
            "ratio_to_python": round(ratio, 2),
            "child_started_to_exit_ms": spread(supervised, 1000),
            "cpu_ms": {name: spread(values, 1000) for name, values in cpu.items()}}


def _log_span_s(log: str, first: str, last: str) -> float:
    """Seconds between two events of a JSON-lines log (timestamps have millisecond resolution)."""
    from esiwrap.times import iso_epoch

    stamps: dict[str, float] = {}
    for line in log.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") in (first, last):
            stamps[event["event"]] = iso_epoch(event["timestamp"])
    return stamps[last] - stamps[first]


# ---------------------------------------------------------------------------------- 3. trainer calls
def trainer_loop_child(calls: int, pace_s: float, with_torch: bool) -> None:
    """Runs in the child: time `save_requested()` + `step_done()` per step; print the samples' spread."""
    if os.environ.get(PIN_ENV):
        os.sched_setaffinity(0, {int(os.environ[PIN_ENV])})
    if with_torch:
        import torch  # noqa: F401  (a real trainer has it; save_requested then asks torch.distributed)
    import esiwrap.trainer as esi

    esi.install()
    samples = []
    clock = time.perf_counter_ns
    for step in range(calls):
        started = clock()
        esi.save_requested()
        esi.step_done(step)
        samples.append(clock() - started)
        if pace_s:
            time.sleep(pace_s)  # not timed: as between real steps, caches go cold, the socket drains
    esi.uninstall()
    print(json.dumps({"us": spread(samples, 1e-3), "connected": bool(os.environ.get(SOCKET_ENV))}))


TRAINER_VARIANTS = (
    # name, under a live esiwrap, torch imported, paced
    ("no esiwrap, back to back", False, False, False),
    ("no esiwrap, paced", False, False, True),
    ("live esiwrap, back to back", True, False, False),
    ("live esiwrap, paced", True, False, True),
    ("live esiwrap, paced, torch imported", True, True, True),
)


def trainer_cost(calls: int, pace_s: float) -> dict[str, Any]:
    """Back to back: warm caches, and a socket that fills (sends then fail at once, as designed).
    Paced: a pause between calls, closer to a real loop whose steps take seconds.

    With two or more cores, esiwrap and the trainer are pinned to different ones, as on a training
    node with dozens: on a shared core, each datagram's wake-up of the supervisor can preempt the
    trainer inside the timed call, and the figure would be the supervisor's work, not the call's.
    """
    me = [sys.executable, os.path.abspath(__file__)]
    out: dict[str, Any] = {}
    env = child_env()
    cores = sorted(os.sched_getaffinity(0))
    pinned = len(cores) >= 2
    if pinned:
        env[PIN_ENV] = str(cores[-1])
    for name, live, with_torch, paced in TRAINER_VARIANTS:
        if with_torch and not _has("torch"):
            continue
        child = [*me, "_trainer-loop", str(calls), str(pace_s if paced else 0.0), "1" if with_torch else "0"]
        received = None
        if live:
            with tempfile.NamedTemporaryFile(prefix="esiwrap-overhead-", suffix=".jsonl") as log:
                cmd = [*esiwrap_command(), "--deadline", "+2h", "--log-level", "debug", "--log-format",
                       "json", "--", *child]
                supervisor = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
                if pinned:
                    os.sched_setaffinity(supervisor.pid, {cores[0]})
                stdout, _ = supervisor.communicate()
                received = _count_events(log.name, "step_observed")
        else:
            stdout = subprocess.run(child, stdout=subprocess.PIPE, env=env, check=True).stdout
        row = json.loads(stdout.decode().strip().splitlines()[-1])
        row["steps_received_by_supervisor"] = received
        row["pinned_apart"] = pinned and live
        out[name] = row
    return out


def _count_events(path: str, name: str) -> int:
    count = 0
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if f'"event": "{name}"' in line or f'"event":"{name}"' in line:
                count += 1
    return count


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------------------------- 4. signal -> flag
def signal_target_child(count: int) -> None:
    """Runs in the child: a handler chained after esiwrap's stamps when the flag has been set."""
    import esiwrap.trainer as esi

    stamps: list[int] = []
    def stamp(signum: int, frame: object) -> None:
        stamps.append(time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    signal.signal(signal.SIGUSR1, stamp)
    esi.install(signal.SIGUSR1)  # its handler sets the flag, then calls ours
    for _ in range(count):
        print("ready", flush=True)
        while not esi.save_requested():
            pass
        esi.clear()
        print(stamps[-1], flush=True)


def signal_latency(count: int) -> dict[str, Any]:
    env = child_env()
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_signal-target", str(count)],
                             stdout=subprocess.PIPE, env=env, text=True)
    assert child.stdout is not None
    latencies = []
    try:
        for _ in range(count):
            if child.stdout.readline().strip() != "ready":
                break
            sent = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            os.kill(child.pid, signal.SIGUSR1)
            latencies.append(int(child.stdout.readline()) - sent)
    finally:
        child.wait(timeout=30)
    return {"us": spread(latencies, 1e-3)}


# ---------------------------------------------------------------------------------- 4b. signal-ready
BARE_HANDLER = ("import signal, time\nsignal.signal(signal.SIGHUP, lambda *_: None)\n"
                "time.sleep(30)")


def signal_ready(repeat: int) -> dict[str, Any]:
    """Milliseconds from exec to the moment a signal can no longer kill the process, read from
    /proc/PID/status polled without pause: esiwrap's handled signals all in SigCgt; tini's in
    SigBlk (it waits for them with sigtimedwait); a bare `python -c` whose first statement
    installs a SIGHUP handler, in SigCgt. "exec" is when Popen returns (the new program runs).
    Interleaved with start-up (`esiwrap -- true`, `tini -s -- true`, `python -c pass`), so the
    same load hits all."""
    from esiwrap.signals import HANDLED

    # A SIGINT this benchmark inherited as ignored (a background job) stays ignored in esiwrap.
    inherited_ignored = {signal.SIGINT} if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else set()
    handled = sum(1 << (s - 1) for s in HANDLED if s not in inherited_ignored)
    tini = shutil.which("tini")
    readiness: dict[str, tuple[list[str], str, int]] = {
        "esiwrap": ([*esiwrap_command(), "--sources", "cli,env", "--", "sleep", "30"], "SigCgt", handled),
        "python": ([sys.executable, "-c", BARE_HANDLER], "SigCgt", 1 << (signal.SIGHUP - 1)),
    }
    startup: dict[str, list[str]] = {"esiwrap": [*esiwrap_command(), "--sources", "cli,env", "--", "true"],
                                     "python": [sys.executable, "-c", "pass"]}
    if tini is not None:
        wanted = sum(1 << (s - 1) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1))
        readiness["tini"] = ([tini, "-s", "--", "sleep", "30"], "SigBlk", wanted)
        startup["tini"] = [tini, "-s", "--", "true"]
    ready: dict[str, list[float]] = {name: [] for name in readiness}
    wall: dict[str, list[float]] = {name: [] for name in startup}
    for _ in range(repeat):
        for name, (cmd, field, mask) in readiness.items():
            took = _ready_after_exec_s(cmd, field, mask)
            if took is not None:
                ready[name].append(took)
        for name, cmd in startup.items():
            started = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                           check=True)
            wall[name].append(time.perf_counter() - started)
    return {"ready_ms": {n: spread(v, 1000) for n, v in ready.items() if v},
            "startup_ms": {n: spread(v, 1000) for n, v in wall.items()}, "tini": tini}


def _in_sigtimedwait(pid: int) -> bool:
    """tini waits in sigtimedwait, during which the kernel shows the waited signals unblocked."""
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii") as wchan:
            return "sigtimedwait" in wchan.read()
    except OSError:
        return False


def _ready_after_exec_s(cmd: Sequence[str], field: str, mask: int) -> float | None:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                            start_new_session=True)
    execed = time.perf_counter()
    prefix = field + ":"
    try:
        while proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/status", encoding="ascii") as status:
                    line = next(ln for ln in status if ln.startswith(prefix))
            except (OSError, StopIteration):  # gone meanwhile
                continue
            if int(line.split()[1], 16) & mask == mask or _in_sigtimedwait(proc.pid):
                return time.perf_counter() - execed
        return None  # it ended before it was ready: not counted
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---------------------------------------------------------------------------------- 5. imports
def import_times(python: str, repeat: int) -> dict[str, Any]:
    """`-X importtime` per module (what `import X` adds to `pass`), and what --help loads."""
    out: dict[str, Any] = {"python": python}

    def total_us(statement: str) -> float:
        result = subprocess.run([python, "-X", "importtime", "-c", statement], env=child_env(),
                                stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, check=True)
        return _top_level_total_us(result.stderr)

    for target in IMPORT_TARGETS:
        totals = [total_us(f"import {target}") - total_us("pass") for _ in range(repeat)]
        out[target] = {"ms": spread(totals, 1e-3)}
    probe = (
        "import sys, json\n"
        "from esiwrap.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {list(HEAVY_MODULES)!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    result = subprocess.run([python, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=child_env(), check=True)
    out["help_heavy_modules"] = json.loads(result.stderr.strip().splitlines()[-1])
    walls = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([*esiwrap_command(python), "--help"], stdout=subprocess.DEVNULL, env=child_env(),
                       check=True)
        walls.append(time.perf_counter() - started)
    out["help_wall_ms"] = spread(walls, 1000)
    out["extras"] = {m: _installed_in(python, m) for m in ("torch", "volcenginesdkcore", "verl")}
    return out


_IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def _top_level_total_us(stderr: str) -> float:
    total = 0
    for line in stderr.splitlines():
        match = _IMPORTTIME.match(line)
        if match and len(match.group(3)) == 1:  # one space: imported by the statement itself
            total += int(match.group(2))
    return float(total)


def _installed_in(python: str, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([python, "-c", code], env=child_env(), check=False).returncode == 0


# ---------------------------------------------------------------------------------- report
def _fmt(s: dict[str, float], digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} (p10 {s['p10']:.{digits}f}, p90 {s['p90']:.{digits}f})"


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['logical_cores']} logical cores ({m['physical_cores']} physical), "
        f"{m['memory_gb']} GB; Python {m['python']} ({m['implementation']}), Linux {m['kernel']}; "
        f"load average {m['load_average']} at start, {r['load_average_end']} at end.",
        "",
        "| measurement | result | target |",
        "|---|---|---|",
    ]
    idle = r.get("idle")
    if idle:
        lines += [
            f"| supervisor CPU while idle ({idle['window_s']:.0f} s supervising `sleep`) | "
            f"{idle['cpu_percent']:.3f} % ({idle['cpu_s']:.3f} s CPU) | ≤ 0.1 % |",
            f"| supervisor RSS (USS) | {idle['rss_mb']} MB ({idle['uss_mb']} MB) | ≤ 40 MB |",
            f"| supervisor start-up CPU | {idle['startup_cpu_s']:.2f} s | |",
        ]
    metered = r.get("idle_metrics")
    if metered:
        lines += [
            f"| supervisor CPU while idle, metrics file + endpoint + status file on, scraped every second "
            f"({metered['scrapes']} scrapes in {metered['window_s']:.0f} s) | {metered['cpu_percent']:.3f} % "
            f"({metered['cpu_s']:.3f} s CPU) | ≤ 0.1 % |",
            f"| supervisor RSS (USS), metrics on | {metered['rss_mb']} MB ({metered['uss_mb']} MB) "
            "| ≤ 40 MB |",
        ]
    wrap = r.get("wrap")
    if wrap:
        lines += [
            f"| `esiwrap -- true`, ms, median (p10, p90) of {wrap['added_ms']['n']} | "
            f"{_fmt(wrap['esiwrap_true_ms'])} | |",
            f"| `esiwrap -- true` ÷ `python -c pass` (medians, same run) | {wrap['ratio_to_python']:.2f}× "
            f"({wrap['esiwrap_true_ms']['median']:.1f} ms ÷ {wrap['python_pass_ms']['median']:.1f} ms) | "
            f"≤ 80 ms |",
            f"| `true`, ms | {_fmt(wrap['true_ms'])} | |",
            f"| CPU time (user + system) of `esiwrap -- true`, ms; of `python -c pass` | "
            f"{_fmt(wrap['cpu_ms']['esiwrap'])}; {_fmt(wrap['cpu_ms']['python'])} | |",
            f"| added by esiwrap, ms | {_fmt(wrap['added_ms'])} | ≤ 150 ms |",
            f"| of which Python start-up (`python -c pass`), ms | {_fmt(wrap['python_pass_ms'])} | |",
            f"| of which supervision (log: `child_started` → `supervisor_exit`), ms | "
            f"{_fmt(wrap['child_started_to_exit_ms'])} | |",
        ]
    for name, row in (r.get("trainer") or {}).items():
        us = row["us"]
        got = row.get("steps_received_by_supervisor")
        note = f"; supervisor received {got} of {us['n']}" if got is not None else ""
        note += "; separate cores" if row.get("pinned_apart") else ""
        lines.append(f"| `save_requested()` + `step_done()`, µs, {name} | median {us['median']:.1f}, "
                     f"p99 {us['p99']:.1f} (n {us['n']}{note}) | ≤ 50 µs |")
    sig = r.get("signal")
    if sig:
        us = sig["us"]
        lines.append(f"| SIGUSR1 → flag set, µs | median {us['median']:.0f}, p10 {us['p10']:.0f}, "
                     f"p90 {us['p90']:.0f}, p99 {us['p99']:.0f} (n {us['n']}) | |")
    ready = r.get("ready")
    if ready:
        names = [n for n in ("esiwrap", "tini", "python") if n in ready["ready_ms"]]
        for name in names:
            what = {"esiwrap": "`esiwrap -- …` (every handled signal caught)",
                    "tini": "`tini -s -- …` (signals blocked)",
                    "python": "`python -c` whose first statement installs a handler"}[name]
            lines.append(f"| exec → signal-ready, ms, {what} | {_fmt(ready['ready_ms'][name])} | |")
        commands = {"esiwrap": "esiwrap -- true", "tini": "tini -s -- true", "python": "python -c pass"}
        for name, cmd in commands.items():
            if name in ready["startup_ms"]:
                figure = _fmt(ready["startup_ms"][name])
                lines.append(f"| start-up, `{cmd}`, wall ms (same run) | {figure} | |")
    for label, imp in r.get("imports", {}).items():
        extras = ", ".join(k for k, v in imp["extras"].items() if v) or "none"
        for target in IMPORT_TARGETS:
            lines.append(f"| `import {target}`, ms ({label}; extras present: {extras}) | "
                         f"{_fmt(imp[target]['ms'])} | |")
        heavy = ", ".join(imp["help_heavy_modules"]) or "none"
        lines.append(f"| `esiwrap --help` wall ms ({label}); heavy modules loaded | "
                     f"{_fmt(imp['help_wall_ms'])}; {heavy} | none |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run in seconds")
    p.add_argument("--idle", type=float, help="seconds of idle supervision (60; quick 5)")
    p.add_argument("--repeat", type=int, help="runs of `esiwrap -- true` and of each import (30; quick 5)")
    p.add_argument("--calls", type=int, help="trainer calls per variant (100000; quick 5000)")
    p.add_argument("--pace-us", type=float, default=200.0,
                   help="pause between paced trainer calls, not timed (200)")
    p.add_argument("--signals", type=int, help="signals for the latency figure (1000; quick 100)")
    p.add_argument("--bare-python", help="also time imports with this interpreter (esiwrap without extras)")
    p.add_argument("--only", help="comma-separated subset: idle,wrap,trainer,signal,ready,imports")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "_trainer-loop":
        trainer_loop_child(int(args[1]), float(args[2]), args[3] == "1")
        return 0
    if args and args[0] == "_signal-target":
        signal_target_child(int(args[1]))
        return 0
    ns = build_parser().parse_args(args)
    quick = ns.quick
    idle_s = ns.idle if ns.idle is not None else (5.0 if quick else 60.0)
    repeat = ns.repeat or (5 if quick else 30)
    calls = ns.calls or (5000 if quick else 100_000)
    signals = ns.signals or (100 if quick else 1000)
    only = set((ns.only or "idle,wrap,trainer,signal,ready,imports").split(","))
    report: dict[str, Any] = {"machine": machine()}
    warm_up(sys.executable)
    if ns.bare_python:
        warm_up(ns.bare_python)
    if "idle" in only:
        report["idle"] = idle_supervisor(idle_s)
        report["idle_metrics"] = idle_supervisor(idle_s, metrics=True)
    if "wrap" in only:
        report["wrap"] = wrap_overhead(repeat)
    if "trainer" in only:
        report["trainer"] = trainer_cost(calls, ns.pace_us / 1e6)
    if "signal" in only:
        report["signal"] = signal_latency(signals)
    if "ready" in only:
        report["ready"] = signal_ready(repeat * 2)
    if "imports" in only:
        report["imports"] = {"this venv": import_times(sys.executable, repeat)}
        if ns.bare_python:
            report["imports"]["core only"] = import_times(ns.bare_python, repeat)
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
