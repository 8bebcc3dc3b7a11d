"""What the caller set up is kept (tini's standard): signals it ignored (`nohup`, a background job of
a shell) stay ignored for the child, a blocked mask is the child's too, and esiwrap unblocks for
itself the signals it handles; it catches them first thing at start, so a signal that comes while
it loads (or was pending when it started) is handled as documented once the loop runs.

Real launchers (`nohup`, `sh -c '… &'`) or tests/lib/children/caller_setup.py, which ignores, blocks
or leaves pending what it is told and execs esiwrap. What the child got is read from its
/proc/PID/status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from esiwrap_harness import CHILDREN, PYTHON, TINY_TRAINER, EsiwrapRun, esiwrap_below, wait_until

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.signals import HANDLED

pytestmark = pytest.mark.system

CALLER = (PYTHON, str(CHILDREN / "caller_setup.py"))
ESIWRAP = (PYTHON, "-m", "esiwrap")
RECORDER = str(CHILDREN / "signal_recorder.py")
AS_PID_1 = ("unshare", "--fork", "--pid", "--mount-proc")
CONSOLE_SCRIPT = Path(sys.executable).parent / "esiwrap"


def sigset(pid: int, field: str) -> set[int]:
    """The signals of a /proc/PID/status mask line (SigIgn, SigBlk, SigCgt, ShdPnd, SigPnd)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            bits = int(line.split()[1], 16)
            return {n for n in range(1, 65) if bits >> (n - 1) & 1}
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def caller(*setup: str) -> tuple[str, ...]:
    """caller_setup.py with these settings, then esiwrap: the launcher of an EsiwrapRun."""
    return (*CALLER, *setup, "--", *ESIWRAP)


def test_nohup_keeps_sighup_ignored_for_the_child(runs: list[EsiwrapRun]) -> None:
    """`nohup esiwrap -- …`, then `kill -HUP esiwrap` (a closed ssh session): the child starts with
    SIGHUP ignored, as the caller asked, so the forwarded SIGHUP does not kill it (it used to: 129);
    SIGTERM still stops the run as documented."""
    run = EsiwrapRun(["--", PYTHON, RECORDER, str(int(signal.SIGUSR2))], launcher=("nohup", *ESIWRAP))
    runs.append(run)
    run.wait_stdout("ready", 30)
    child = run.child_pid()
    assert signal.SIGHUP in sigset(child, "SigIgn")
    run.signal(signal.SIGHUP)
    run.signal(signal.SIGUSR2)  # forwarded after the SIGHUP: once it is there, so is the SIGHUP
    run.wait_stdout("got SIGUSR2\n", 30)
    assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE and run.proc.poll() is None
    run.signal(signal.SIGTERM)  # nothing attached to save: the plain stop
    assert run.finish(30) == 128 + signal.SIGTERM
    assert run.first("child_exited")["signal"] == "SIGTERM"


def test_a_background_job_of_a_shell_keeps_sigint_ignored(runs: list[EsiwrapRun]) -> None:
    """`sh -c 'esiwrap -- … & wait'`: the shell starts its background job with SIGINT ignored.
    esiwrap leaves it so, for itself and the child: neither a first nor a second SIGINT (which
    would kill the tree) ends the run; SIGTERM does."""
    run = EsiwrapRun(["--", PYTHON, RECORDER, str(int(signal.SIGUSR2))],
                     launcher=("sh", "-c", '"$@" & wait $!', "sh", *ESIWRAP))
    runs.append(run)
    run.wait_stdout("ready", 30)
    supervisor, child = esiwrap_below(run), run.child_pid()
    assert signal.SIGINT in sigset(supervisor, "SigIgn") and signal.SIGINT in sigset(child, "SigIgn")
    for signum in (signal.SIGINT, signal.SIGINT, signal.SIGUSR2):
        os.kill(supervisor, signum)
    run.wait_stdout("got SIGUSR2\n", 30)
    assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE
    os.kill(supervisor, signal.SIGTERM)
    assert run.finish(30) == 128 + signal.SIGTERM
    assert run.first("child_exited")["signal"] == "SIGTERM"


def test_a_blocked_sigterm_still_checkpoints_and_the_child_keeps_the_mask(runs: list[EsiwrapRun],
                                                                          tmp_path: Path) -> None:
    """Started with SIGTERM blocked (a launcher that forgot to unblock it), esiwrap unblocks it for
    itself: SIGTERM is a checkpoint, then the stop (exit 75). The trainer gets the mask esiwrap was
    given, so the stop's SIGTERM waits in it and SIGKILL follows after --stop-grace."""
    run = EsiwrapRun(["--log-level", "debug", "--stop-grace", "2", "--", PYTHON, str(TINY_TRAINER),
                      "--ckpt-dir", str(tmp_path), "--step-seconds", "0.1"],
                     launcher=caller("--block", "SIGTERM"))
    runs.append(run)
    run.wait_event("trainer_attached", 60)
    run.wait_event("step_observed", 30)
    assert signal.SIGTERM not in sigset(run.pid, "SigBlk")
    assert signal.SIGTERM in sigset(run.child_pid(), "SigBlk")
    run.signal(signal.SIGTERM)
    assert run.finish(60) == EXIT_CHECKPOINTED
    assert run.first("save_completed")["kind"] == "sigterm"
    assert run.first("child_killed")["signal"] == "SIGKILL"
    assert (tmp_path / "latest.pt").exists()


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["plain", "pid-1"])
def test_the_child_gets_the_callers_ignored_and_blocked_signals(as_pid_1: bool) -> None:
    """tini's signal configuration scenario: SIGTTOU and SIGINT ignored, SIGTTIN, SIGILL and
    SIGTERM blocked by the caller; the command under esiwrap sees exactly what it sees started
    by the same caller without esiwrap (SIGSEGV, also in tini's list, is left out: Linux 6 resets
    an ignored SIGSEGV at every exec, with or without esiwrap)."""
    setup = (*CALLER, "--ignore", "SIGTTOU,SIGINT", "--block", "SIGTTIN,SIGILL,SIGTERM", "--",
             *(AS_PID_1 if as_pid_1 else ()))
    report = ("cat", "/proc/self/status")

    def masks(command: tuple[str, ...]) -> dict[str, str]:
        done = subprocess.run([*setup, *command], capture_output=True, text=True, timeout=60, check=True)
        fields = dict(line.split(":\t", 1) for line in done.stdout.splitlines() if ":\t" in line)
        return {name: fields[name] for name in ("SigIgn", "SigBlk")}

    direct = masks(report)
    assert masks((*ESIWRAP, "--", *report)) == direct
    blocked = int(direct["SigBlk"], 16)
    assert all(blocked >> (s - 1) & 1 for s in (signal.SIGTTIN, signal.SIGILL, signal.SIGTERM))


def test_a_sigterm_pending_at_start_is_acted_on_once_the_loop_runs(runs: list[EsiwrapRun]) -> None:
    """A SIGTERM that came before esiwrap could act (here: pending and blocked when it started)
    waits for the loop and is handled as documented: nothing attached to save, so the child is
    stopped (it keeps the caller's mask: SIGKILL after --stop-grace). It used to sit blocked while
    the child ran on."""
    run = EsiwrapRun(["--stop-grace", "1", "--", "sleep", "60"], launcher=caller("--pending", "SIGTERM"))
    runs.append(run)
    assert run.finish(30) == 128 + signal.SIGKILL
    assert run.first("child_stopping")["signal"] == "SIGTERM"
    assert run.first("child_exited")["signal"] == "SIGKILL"


def test_a_sighup_pending_at_start_is_forwarded_to_the_child(runs: list[EsiwrapRun]) -> None:
    """A SIGHUP pending (blocked) when esiwrap starts is delivered once esiwrap has caught its
    signals (not before: it would kill it) and forwarded to the child, where it waits in turn,
    since the child has the caller's mask."""
    run = EsiwrapRun(["--", "sleep", "60"], launcher=caller("--pending", "SIGHUP"))
    runs.append(run)
    child = run.child_pid()
    assert wait_until(lambda: signal.SIGHUP in sigset(child, "SigPnd") | sigset(child, "ShdPnd"), 30)
    assert run.proc.poll() is None and signal.SIGHUP not in sigset(run.pid, "ShdPnd")


def test_esiwrap_catches_its_signals_before_it_loads_the_rest(tmp_path: Path) -> None:
    """The `esiwrap` executable catches every signal it handles before it imports its own modules
    (esiwrap.cli, the supervisor, …: a hundred milliseconds and more), so no signal kills it while
    they load. Checked in order, not in milliseconds: an audit hook in esiwrap's interpreter reads
    /proc/self/status at each import of an esiwrap module."""
    hook = tmp_path / "sitecustomize.py"
    hook.write_text(
        "import os, sys\n"
        "def _audit(event, args):\n"
        "    if event == 'import' and args[0].startswith('esiwrap'):\n"
        "        with open('/proc/self/status') as f:\n"
        "            caught = next(l.split()[1] for l in f if l.startswith('SigCgt:'))\n"
        "        with open(os.environ['IMPORTS_SEEN'], 'a') as out:\n"
        "            out.write(f'{args[0]} {caught}\\n')\n"
        "sys.addaudithook(_audit)\n"
    )
    seen = tmp_path / "imports.txt"
    command = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else list(ESIWRAP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "IMPORTS_SEEN": str(seen)}
    done = subprocess.run([*command, "--sources", "cli", "--", "true"], env=env, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    handled = sum(1 << (s - 1) for s in HANDLED)
    order = [line.split() for line in seen.read_text().splitlines()]
    before = [name for name, mask in order if int(mask, 16) & handled != handled]
    assert {"esiwrap.cli", "esiwrap.shell.supervisor", "esiwrap.core.controller"} <= {
        name for name, _ in order}
    assert set(before) <= {"esiwrap", "esiwrap._console", "esiwrap.shell", "esiwrap.shell.early",
                           "esiwrap.signals",
                           "esiwrap.envvars"}, before
