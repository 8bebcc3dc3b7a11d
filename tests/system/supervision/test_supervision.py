"""esiwrap as an init for one command: exit codes, signal forwarding, stopping, no orphans."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from esiwrap_harness import (
    FINISHING_TRAINER,
    PYTHON,
    SIGNAL_ECHO,
    EsiwrapRun,
    processes_with_marker,
    release,
    send_until_gone,
    wait_until,
)

from esiwrap.errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SAVE_MISSED, EXIT_USAGE
from esiwrap.times import iso_epoch

pytestmark = pytest.mark.system


def echo_child(*args: str) -> list[str]:
    return [PYTHON, str(SIGNAL_ECHO), *args]


@pytest.mark.parametrize(
    ("script", "expected"),
    [("exit 0", 0), ("exit 3", 3), ("kill -KILL $$", 128 + signal.SIGKILL),
     ("kill -TERM $$", 128 + signal.SIGTERM)],
)
def test_child_exit_code_passes_through(esiwrap, script: str, expected: int) -> None:
    """The child's own exit code is esiwrap's; killed by signal N gives 128+N."""
    run = esiwrap("--", "sh", "-c", script)
    assert run.finish(30) == expected
    exited = run.first("child_exited")
    assert run.first("supervisor_exit")["code"] == expected
    assert (exited["code"] is None) == (expected >= 128)


def test_sigkill_of_the_child_hints_at_out_of_memory(esiwrap) -> None:
    """An unexpected SIGKILL is the OOM killer's signature: the log says so."""
    run = esiwrap("--", "sh", "-c", "kill -KILL $$")
    run.finish(30)
    assert "out of memory" in run.first("child_exited")["hint"]


def test_command_not_found_is_127(esiwrap) -> None:
    """A command that does not exist: 127 and one line naming it."""
    run = esiwrap("--", "no-such-command-esiwrap-test")
    assert run.finish(30) == EXIT_NOT_FOUND
    assert "no-such-command-esiwrap-test" in run.first("command_failed")["reason"]


def test_command_not_executable_is_126(esiwrap, tmp_path: Path) -> None:
    """A file without the execute bit: 126."""
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    run = esiwrap("--", str(script))
    assert run.finish(30) == EXIT_NOT_EXECUTABLE


def test_usage_errors_are_one_line_and_exit_2() -> None:
    """Bad option values: exit 2, one line naming the flag, the value and a good example."""
    cases = [
        (["--deadline", "2025-13-01T00:00:00Z", "--", "true"], "--deadline '2025-13-01T00:00:00Z': month"),
        (["--step-quantile", "1.5", "--", "true"], "--step-quantile '1.5'"),
        (["--signal", "SIGTERM", "--", "true"], "must be one of SIGUSR1, SIGUSR2"),
        (["--signal", "SIGRTMIN+3", "--", "true"], "--signal 'SIGRTMIN+3': must be one of SIGUSR1, SIGUSR2"),
        (["--stop-signal", "40", "--", "true"], "--stop-signal '40': must be one of SIGTERM, SIGINT"),
        (["--stop-grace", "soon", "--", "true"], "e.g. --stop-grace 30"),
        (["--sources", "cli,bogus", "--", "true"], "--sources 'cli,bogus'"),
        (["--after-save", "later", "--", "true"], "must be one of stop, linger, continue"),
        ([], "no command given"),
    ]
    for args, expected in cases:
        done = subprocess.run([PYTHON, "-m", "esiwrap", *args], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == EXIT_USAGE, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert expected in done.stderr, done.stderr


def test_env_values_are_validated_like_flags() -> None:
    """ESIWRAP_<NAME> carries every option; a bad one names the variable."""
    env = {**os.environ, "ESIWRAP_STOP_GRACE": "abc"}
    done = subprocess.run([PYTHON, "-m", "esiwrap", "--", "true"], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("esiwrap: ESIWRAP_STOP_GRACE 'abc'")


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2, signal.SIGINT])
def test_signals_are_forwarded_to_the_child_pid(esiwrap, signum: int) -> None:
    """HUP, QUIT, USR2 and a first INT reach the child itself."""
    name = signal.Signals(signum).name
    run = esiwrap("--", *echo_child("--echo", name, "--exit-on", name))
    run.wait_stdout("ready")
    run.signal(signum)
    run.wait_stdout(f"got {name}")
    assert run.finish(30) == 0


def test_sigterm_forward_mode(esiwrap) -> None:
    """--on-sigterm forward hands SIGTERM straight to the child."""
    run = esiwrap("--on-sigterm", "forward", "--", *echo_child("--echo", "SIGTERM", "--exit-on", "SIGTERM"))
    run.wait_stdout("ready")
    run.signal(signal.SIGTERM)
    run.wait_stdout("got SIGTERM")
    assert run.finish(30) == 0
    assert "child_stopping" not in run.names()  # forwarded as is, not turned into a stop


def test_child_ignoring_sigterm_is_killed_after_grace(esiwrap) -> None:
    """The stop sequence escalates to SIGKILL once --stop-grace is over, not before."""
    run = esiwrap("--stop-grace", "1", "--", *echo_child("--ignore", "SIGTERM"))
    run.wait_stdout("ready")
    run.signal(signal.SIGTERM)  # nothing attached to save: esiwrap stops the child
    stopping = run.wait_event("child_stopping", 10)
    assert stopping["signal"] == "SIGTERM"
    killed = run.wait_event("child_killed", 30)  # 1 s of grace; the rest is room for a loaded machine
    assert iso_epoch(killed["timestamp"]) - iso_epoch(stopping["timestamp"]) >= 1.0 - 0.002  # ms stamps
    assert run.finish(30) == 128 + signal.SIGKILL


def test_second_sigint_kills_at_once(esiwrap) -> None:
    """Ctrl-C twice: the first is forwarded, the second kills the child tree without grace."""
    run = esiwrap("--stop-grace", "60", "--", *echo_child("--echo", "SIGINT"))
    run.wait_stdout("ready")
    run.signal(signal.SIGINT)
    run.wait_stdout("got SIGINT")
    run.signal(signal.SIGINT)
    assert run.finish(15) == 128 + signal.SIGKILL


def test_daemonized_grandchild_is_not_left_behind(esiwrap) -> None:
    """`setsid sleep &` escapes the session, but not the subreaper: nothing survives the stop."""
    marker = str(3000 + random.randint(0, 999)) + ".25"
    script = f"setsid sleep {marker} & exec sleep {marker}1"
    run = esiwrap("--stop-grace", "5", "--", "sh", "-c", script)
    run.wait_event("child_started")
    assert wait_until(lambda: len(processes_with_marker(marker, "sleep")) == 2, 10)
    run.signal(signal.SIGTERM)
    run.finish(30)
    assert processes_with_marker(marker, "sleep") == []


def test_leftovers_are_cleaned_when_the_child_exits_by_itself(esiwrap) -> None:
    """A child that exits leaving a background process: esiwrap stops it, then exits."""
    marker = str(4000 + random.randint(0, 999)) + ".5"
    run = esiwrap("--", "sh", "-c", f"setsid sleep {marker} & exit 4")
    assert run.finish(30) == 4
    assert processes_with_marker(marker, "sleep") == []


def test_sigkill_of_esiwrap_takes_the_child_down(esiwrap) -> None:
    """PR_SET_PDEATHSIG: if esiwrap is killed, the trainer does not run on alone."""
    run = esiwrap("--", *echo_child())
    child = run.child_pid()
    run.wait_stdout("ready")
    run.signal(signal.SIGKILL)
    assert wait_until(lambda: not _running(child), 10)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_early_sigterm_never_hangs() -> None:
    """A SIGTERM 0-50 ms after start, before anything is set up, ends esiwrap promptly."""
    rng = random.Random(7)
    for _ in range(12):
        proc = subprocess.Popen([PYTHON, "-m", "esiwrap", "--", "sleep", "300"],
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            try:
                proc.wait(timeout=rng.uniform(0, 0.05))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) is not None
        finally:
            _kill_group(proc.pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def test_unregistered_child_never_gets_the_save_signal(esiwrap) -> None:
    """SIGUSR1 would kill a child without a handler: nothing that did not say hello gets it.

    The child echoes SIGUSR1 if it ever arrives; esiwrap must instead log no_trainer_attached
    and stop it gracefully, --stop-grace before the deadline, exit 76. The grace (10 s) is what a
    stalled node needs: a loaded run once stopped every process for seconds, and a 3 s grace ran
    out before the child could print that it got SIGTERM.
    """
    run = esiwrap("--deadline", "+14s", "--redundant-time", "1", "--save-duration", "1",
                  "--stop-grace", "10", "--",
                  *echo_child("--echo", "SIGUSR1", "SIGTERM", "--exit-on", "SIGTERM"))
    run.wait_stdout("ready")
    attached = run.wait_event("no_trainer_attached", 30)
    assert attached["action"] == "stop"
    assert run.finish(60) == EXIT_SAVE_MISSED
    assert "got SIGUSR1" not in run.stdout.decode()
    assert "got SIGTERM" in run.stdout.decode()
    assert run.first("save_requested")["pids"] == []


def test_signal_child_sends_the_save_signal_to_the_direct_child(esiwrap) -> None:
    """--signal-child: the child handles the save signal itself, no registration needed."""
    run = esiwrap("--deadline", "+10s", "--redundant-time", "1", "--save-duration", "1",
                  "--signal-child", "--stop-grace", "2", "--",
                  *echo_child("--echo", "SIGUSR1"))
    child = run.child_pid()
    requested = run.wait_event("save_requested", 20)
    assert requested["pids"] == [child]
    run.wait_stdout("got SIGUSR1")
    assert run.finish(30) == EXIT_SAVE_MISSED  # nothing acknowledged over the channel


# ------------------------------------------------------------------------ a trainer that finishes
def finish_under_esiwrap(run: EsiwrapRun, fifo: Path, then: str) -> int:
    """The finishing trainer under esiwrap, held in its interpreter's shutdown (its handlers given
    back already): once esiwrap logged its bye, `then` happens (`manual`: esiwrap is asked for a
    save by hand; `deadline`: the save falls due), 200 SIGUSR1 reach the trainer as if esiwrap had
    sent them just before it read the bye; the trainer goes on, under SIGUSR1 in a tight loop until
    esiwrap reaped it. esiwrap's exit code."""
    child = run.child_pid()
    pidfd = os.pidfd_open(child)
    try:
        def alive() -> bool:
            return not select.select([pidfd], [], [], 0)[0]  # readable once it exited

        run.wait_stdout("teardown")
        run.wait_event("trainer_left", 30, pid=child)
        if then == "manual":
            run.signal(signal.SIGUSR1)
            assert run.wait_event("no_trainer_attached", 30)["action"] == "ignored"
        else:
            assert run.wait_event("save_requested", 60)["pids"] == []
        send_until_gone(pidfd, signal.SIGUSR1, alive, at_most=200)
        assert release(fifo, alive), "the trainer died in its shutdown"
        send_until_gone(pidfd, signal.SIGUSR1)  # until esiwrap reaped it: the pidfd reaches no other
        return run.finish(30)
    finally:
        os.close(pidfd)


@pytest.mark.parametrize(("end", "code", "runs"), [("return", 0, 8), ("exit", 3, 1), ("raise", 1, 1)])
def test_a_trainer_that_finished_exits_with_its_own_code_not_the_save_signals(
        esiwrap, tmp_path: Path, end: str, code: int, runs: int) -> None:
    """A trainer finishes (the script's end, sys.exit(3), an uncaught exception) while save
    signals are on their way: it said bye as it ended, so esiwrap sends it none (a save asked for
    by hand finds nobody), and the ones already on their way find the signal ignored, also once
    its interpreter gave its handlers back. esiwrap exits with the trainer's own code, every run."""
    for run_number in range(runs):
        fifo = tmp_path / f"hold-{run_number}"
        os.mkfifo(fifo)
        run = esiwrap("--", PYTHON, str(FINISHING_TRAINER), "--hold", str(fifo), "--end", end)
        assert finish_under_esiwrap(run, fifo, "manual") == code, run.story()
        exited = run.first("child_exited")
        assert (exited["code"], exited["signal"]) == (code, None)
        assert run.first("supervisor_exit")["reason"] == "child exited"
        assert "save_requested" not in run.names()


def test_a_save_that_falls_due_after_the_bye_goes_to_nobody(esiwrap, tmp_path: Path) -> None:
    """The issue's run: the deadline's save falls due once the trainer has finished and said bye
    (it holds in its shutdown until then): the request names no pid, nothing is signalled, and
    esiwrap exits with the trainer's 0, not 76 and not 138."""
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    run = esiwrap("--deadline", "+12s", "--redundant-time", "1", "--save-duration", "1", "--stop-grace", "2",
                  "--", PYTHON, str(FINISHING_TRAINER), "--hold", str(fifo))
    assert finish_under_esiwrap(run, fifo, "deadline") == 0, run.story()
    names = run.names()
    assert names.index("trainer_left") < names.index("save_requested")
    assert run.first("supervisor_exit")["reason"] == "child exited"


def test_a_trainer_that_uninstalled_lives_on_through_save_signals(esiwrap, tmp_path: Path) -> None:
    """`uninstall()` (a framework's callback at the end of training) says bye, and evaluation goes
    on: a save asked for by hand then finds nobody, and 200 save signals that reach the trainer as
    if esiwrap had sent them before it read the bye find the signal ignored. The trainer finishes
    with its own 0 (it used to be killed: 138)."""
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    run = esiwrap("--", PYTHON, str(FINISHING_TRAINER), "--hold", str(fifo), "--uninstall")
    child = run.child_pid()
    pidfd = os.pidfd_open(child)
    try:
        def alive() -> bool:
            return not select.select([pidfd], [], [], 0)[0]

        run.wait_stdout("evaluating")
        run.wait_event("trainer_left", 30, pid=child)
        run.signal(signal.SIGUSR1)
        assert run.wait_event("no_trainer_attached", 30)["action"] == "ignored"
        assert send_until_gone(pidfd, signal.SIGUSR1, alive, at_most=200) == 200
        assert release(fifo, alive), "killed by a save signal after uninstall()"
        run.wait_stdout("teardown")
        assert release(fifo, alive)
    finally:
        os.close(pidfd)
    assert run.finish(30) == 0, run.story()
    assert run.first("child_exited")["signal"] is None
    assert run.first("supervisor_exit")["reason"] == "child exited"


def test_a_child_killed_by_the_save_signal_it_had_no_handler_for_is_told_apart(esiwrap) -> None:
    """--signal-child, and the child never installed a handler: the save signal kills it. The exit
    code stays the child's 128+10; the reason says it was the save signal esiwrap sent, how long
    before, and what that means."""
    run = esiwrap("--signal-child", "--", *echo_child())
    run.wait_stdout("ready")
    run.signal(signal.SIGUSR1)  # a save asked for by hand: the child gets the save signal
    assert run.finish(30) == 128 + signal.SIGUSR1
    reason = run.first("supervisor_exit")["reason"]
    assert reason.startswith("child exited: killed by SIGUSR1, the save signal esiwrap sent it "), reason
    assert reason.endswith(" ms earlier: it had no handler for it (a trainer that never called install(), "
                           "or one that had called uninstall() or was shutting down)"), reason
    assert run.first("child_exited")["hint"] == reason.removeprefix("child exited: ")


def test_version_from_both_entry_points() -> None:
    """`esiwrap --version` and `python -m esiwrap --version` agree."""
    from esiwrap import __version__

    by_module = subprocess.run([PYTHON, "-m", "esiwrap", "--version"], capture_output=True,
                               text=True, timeout=30)
    script = Path(sys.executable).parent / "esiwrap"
    by_script = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=30)
    assert by_module.stdout.strip() == by_script.stdout.strip() == f"esiwrap {__version__}"


def test_help_does_not_import_heavy_modules() -> None:
    """--help stays light: no torch, no SDK, no verl."""
    code = ("import sys, runpy; sys.argv=['esiwrap','--help']\n"
            "try:\n runpy.run_module('esiwrap', run_name='__main__')\nexcept SystemExit: pass\n"
            "names=('torch','volcenginesdkecs','volcenginesdkcore','verl','ray')\n"
            "heavy=[m for m in names if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=30)
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr


def test_unique_marker_helper_sees_processes() -> None:
    """The leftover scan used above finds a live process by its command line."""
    marker = f"{uuid.uuid4().int % 1000}.75"
    proc = subprocess.Popen(["sleep", marker])
    try:
        assert wait_until(lambda: len(processes_with_marker(marker, "sleep")) == 1, 5)
    finally:
        proc.kill()
        proc.wait()


def test_orphans_are_reaped_as_subreaper(esiwrap) -> None:
    """An orphaned grandchild comes to esiwrap (child subreaper) and is reaped, not a zombie."""
    run = esiwrap("--", PYTHON, str(Path(__file__).parents[2] / "lib" / "children" / "orphan_maker.py"))
    assert run.finish(30) == 0, run.stdout
    assert "reaped=True" in run.stdout.decode()
