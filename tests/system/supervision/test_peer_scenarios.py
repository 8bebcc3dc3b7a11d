"""The scenarios of tini's and dumb-init's own test suites, re-run against esiwrap: plain, and as
PID 1 of a PID namespace (`unshare --pid --fork --mount-proc`) where the scenario is about PID 1.
Written for esiwrap from what those suites check (their code is not used).

What esiwrap does differently, by design and as docs/running/container.md documents, is not
re-run as if it were the same: SIGUSR1 (the save signal) and SIGTERM (the checkpoint) are esiwrap's
own, faults (SIGSEGV, …) end esiwrap instead of being forwarded, the child runs in its own session
(no controlling terminal), signals go to the child's PID and never to its group, and SIGTSTP never
stops esiwrap. tini's signal-configuration scenario is in test_caller_signals.py.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from esiwrap_harness import CHILDREN, PYTHON, EsiwrapRun, esiwrap_below, kill_leftovers, wait_until

from esiwrap.errors import EXIT_NOT_FOUND, EXIT_USAGE
from esiwrap.signals import FORWARDED, signal_label

pytestmark = pytest.mark.system

ESIWRAP = (PYTHON, "-m", "esiwrap")
AS_PID_1 = ("unshare", "--fork", "--pid", "--mount-proc", *ESIWRAP)
RECORDER = str(CHILDREN / "signal_recorder.py")
# dumb-init's "normal" signals (1..31 but KILL, STOP, CHLD and the three job-control stops) that
# esiwrap forwards as they are; SIGTERM reaches the child too, as the stop (nothing to checkpoint).
STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
NORMAL = [s for s in range(1, 32) if s in FORWARDED and s not in STOPS]
LAUNCHERS = {"plain": ESIWRAP, "pid-1": AS_PID_1}


def start(runs: list[EsiwrapRun], *args: str, launcher: tuple[str, ...] = ESIWRAP,
          cwd: str | None = None) -> EsiwrapRun:
    run = EsiwrapRun(["--sources", "cli", *args], launcher=launcher, cwd=cwd)
    runs.append(run)
    return run


def target(run: EsiwrapRun, launcher: tuple[str, ...]) -> int:
    """The pid to signal: esiwrap itself (below `unshare` as PID 1 of its namespace)."""
    return esiwrap_below(run) if launcher is AS_PID_1 else run.pid


# ------------------------------------------------------------------ exit codes (both suites)
@pytest.mark.parametrize("code", [0, 1, 2, 32, 64, 75, 76, 126, 127, 128, 129, 143, 254, 255])
def test_the_childs_exit_code_is_esiwraps(runs: list[EsiwrapRun], code: int) -> None:
    """`sh -c 'exit N'`: esiwrap exits N (tini's exit-code test, dumb-init's regular exits)."""
    assert start(runs, "--", "sh", "-c", f"exit {code}").finish(30) == code


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGKILL],
                         ids=signal_label)
def test_a_child_killed_by_a_signal_gives_128_plus_n(runs: list[EsiwrapRun], signum: int) -> None:
    """dumb-init's terminated-by-signal test: the child kills itself with N; esiwrap exits 128+N."""
    run = start(runs, "--", PYTHON, "-c", f"import os; os.kill(os.getpid(), {int(signum)})")
    assert run.finish(30) == 128 + signum


# ------------------------------------------------------------------ forwarding
@pytest.mark.parametrize("where", LAUNCHERS)
def test_normal_signals_reach_the_child(runs: list[EsiwrapRun], where: str) -> None:
    """dumb-init's proxy test (and tini's SIGUSR2): each normal signal sent to esiwrap reaches the
    child, in order, plain and as PID 1 (where the kernel drops what PID 1 does not handle); then
    SIGTERM stops the child (nothing to checkpoint), which sees it too."""
    launcher = LAUNCHERS[where]
    run = start(runs, "--", PYTHON, RECORDER, *(str(s) for s in [*NORMAL, signal.SIGTERM]), launcher=launcher)
    run.wait_stdout("ready", 30)
    pid = target(run, launcher)
    for count, signum in enumerate(NORMAL, 1):
        os.kill(pid, signum)
        run.wait_stdout(f"got {signal_label(signum)}\n", 30)
        assert run.stdout.count(b"got ") == count
    os.kill(pid, signal.SIGTERM)
    run.wait_stdout("got SIGTERM\n", 30)


@pytest.mark.parametrize("where", LAUNCHERS)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2], ids=signal_label)
def test_a_python_child_that_runs_a_shell_command_dies_of_the_signal(runs: list[EsiwrapRun], where: str,
                                                                     signum: int) -> None:
    """tini's signals test: the child (signals at their default) runs `sleep 100` through
    os.system; a signal to esiwrap ends it, and esiwrap exits 128+N."""
    launcher = LAUNCHERS[where]
    code = ("import os, signal\n"
            "for s in (signal.SIGTERM, signal.SIGUSR2): signal.signal(s, signal.SIG_DFL)\n"
            "print('ready', flush=True); os.system('sleep 100')")
    run = start(runs, "--", PYTHON, "-c", code, launcher=launcher)
    run.wait_stdout("ready", 30)
    pid = target(run, launcher)
    assert wait_until(lambda: "sleep" in [p.name() for p in psutil.Process(pid).children(recursive=True)], 30)
    os.kill(pid, signum)
    assert run.finish(30) == 128 + signum


# ------------------------------------------------------------------ reaping and the tree
@pytest.mark.parametrize("where", LAUNCHERS)
def test_a_hundred_orphans_are_reaped(runs: list[EsiwrapRun], where: str) -> None:
    """tini's reaping test: 100 orphaned `sleep`s are adopted by esiwrap (child subreaper, or PID 1)
    and reaped as they exit: none is left, not even as a zombie."""
    run = start(runs, "--", PYTHON, str(CHILDREN / "many_orphans.py"), launcher=LAUNCHERS[where])
    assert run.finish(60) == 0, run.stdout
    assert b"orphans=100 left=0" in run.stdout
    assert (b"pid1=True" in run.stdout) is (where == "pid-1")


def test_no_zombie_as_pid_1(runs: list[EsiwrapRun]) -> None:
    """dumb-init's test-zombies: as PID 1, a grandchild whose parent is gone is not left a zombie."""
    script = ("bash -c \"bash -c 'echo i am a zombie' &\" & sleep 1; "
              "n=$(ps -A -o state= | grep -c Z || true); echo zombies=$n; [ \"$n\" -eq 0 ]")
    run = start(runs, "--", "bash", "-c", script, launcher=AS_PID_1)
    assert run.finish(60) == 0, run.stdout
    assert b"zombies=0" in run.stdout


def test_sigterm_ends_a_pipeline_and_its_background_job(runs: list[EsiwrapRun]) -> None:
    """dumb-init's setsid test: SIGTERM to esiwrap with two pipelines running, one in the
    background, ends all four processes (esiwrap stops the child's whole tree). dumb-init pipes
    `yes` into `tail`; here the writers sleep: two `yes | tail` pipelines keep both cores busy in
    the kernel, and in a loaded suite run they starved every other test's processes for 26 s."""
    run = start(runs, "--", "sh", "-c", "sleep 600 | tail & sleep 600 | tail >&2")
    child = run.child_pid()
    assert wait_until(lambda: len(psutil.Process(child).children(recursive=True)) == 4, 30)
    tree = psutil.Process(child).children(recursive=True)
    run.signal(signal.SIGTERM)
    assert run.finish(60) == 128 + signal.SIGTERM
    assert not psutil.wait_procs(tree, timeout=10)[1]


def test_what_the_command_left_running_gets_sigterm(runs: list[EsiwrapRun]) -> None:
    """dumb-init: the command exits and leaves a process behind (`print_signals & sleep 1`): that
    process gets SIGTERM, and is gone when esiwrap exits."""
    # a grace long enough for a stalled node (the leftover answers SIGTERM at once, else it is
    # killed and never says so)
    run = start(runs, "--stop-grace", "20", "--", "sh", "-c",
                f"'{PYTHON}' '{RECORDER}' {int(signal.SIGTERM)} & sleep 1")
    run.wait_stdout("got SIGTERM\n", 30)
    leftover = int(run.stdout.split(b"ready ")[1].split()[0])
    assert run.finish(30) == 0
    assert not psutil.pid_exists(leftover) or psutil.Process(leftover).status() == psutil.STATUS_ZOMBIE


def test_esiwraps_death_is_the_childs_sigterm(runs: list[EsiwrapRun], tmp_path: Path) -> None:
    """tini's parent-death test, esiwrap's way: the child kills esiwrap with SIGKILL; the kernel
    sends the child SIGTERM (PR_SET_PDEATHSIG), which it handles by writing "ok"."""
    done = tmp_path / "done"
    code = ("import os, signal, sys, time\n"
            f"def handler(*_): open({str(done)!r}, 'w').write('ok'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, handler)\n"
            "os.kill(os.getppid(), signal.SIGKILL)\n"
            "time.sleep(20)\n")
    run = start(runs, "--", PYTHON, "-c", code)
    assert run.finish(30) == -signal.SIGKILL
    assert wait_until(lambda: done.exists() and done.read_text() == "ok", 10)


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize(("args", "expected"), [
    (("--help",), 0), (("--version",), 0), (("-z", "true"), EXIT_USAGE),
    (("--yolo", "/bin/true"), EXIT_USAGE), ((), EXIT_USAGE), (("zzzz",), EXIT_NOT_FOUND),
    (("--", "/doesnotexist"), EXIT_NOT_FOUND),
], ids=["help", "version", "unknown-short-option", "unknown-long-option", "no-command", "not-found",
        "bad-exec"])
def test_command_line(args: tuple[str, ...], expected: int) -> None:
    """tini's and dumb-init's command-line checks: help and version exit 0; an unknown option or
    no command is a usage error (esiwrap's is 2); a command that is not there is 127, named."""
    done = subprocess.run([*ESIWRAP, *args], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("ESIWRAP_COMMAND")})
    assert done.returncode == expected, done.stderr
    if args and args[-1] == "/doesnotexist":
        assert "/doesnotexist: no such file" in done.stderr


def test_the_child_starts_in_the_callers_directory(runs: list[EsiwrapRun], tmp_path: Path) -> None:
    """dumb-init's working-directory test (its first half: esiwrap itself keeps its directory, for
    relative --log-file and --state-file paths)."""
    run = start(runs, "--", "sh", "-c", "readlink /proc/$$/cwd", cwd=str(tmp_path))
    assert run.finish(30) == 0
    assert run.stdout.decode().strip() == str(tmp_path)


# ------------------------------------------------------------------ terminals and job control
def _on_a_terminal(argv: list[str], typed: bytes, expect: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    """Run argv on a new pseudo-terminal, type `typed` once `expect` has appeared; (code, output)."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        os.execvp(argv[0], argv)
    output, sent = b"", not expect
    if not expect:
        os.write(fd, typed)  # kept by the terminal until the program reads it
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            output += chunk
            if not sent and expect in output:
                os.write(fd, typed)
                sent = True
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), output
    finally:
        os.close(fd)
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_shell_on_the_terminal_exits_0() -> None:
    """tini's TTY test: an interactive `dash` under esiwrap on a terminal reads `exit 0` typed there."""
    code, output = _on_a_terminal([*ESIWRAP, "--sources", "cli", "--", "dash", "-i"], b"exit 0\n", b"# ")
    assert code == 0, output


def test_ctrl_c_on_the_terminal_ends_the_command() -> None:
    """tini's TTY test: Ctrl-C typed on the terminal of `dash -c 'while true; do echo \\#; sleep
    0.1; done'` reaches the loop through esiwrap (it is forwarded): 130."""
    loop = "while true; do echo '#'; sleep 0.1; done"
    code, output = _on_a_terminal([*ESIWRAP, "--sources", "cli", "--", "dash", "-c", loop], b"\x03", b"#")
    assert code == 128 + signal.SIGINT, output


def test_a_program_reading_the_terminal_gets_its_input() -> None:
    """dumb-init's TTY test: `tac` under esiwrap reads lines typed on the terminal until EOF."""
    code, output = _on_a_terminal([*ESIWRAP, "--sources", "cli", "--log-level", "error", "--", "tac"],
                                  b"1\n2\n3\n\x04", b"")
    assert code == 0
    assert output.replace(b"\r\n", b"\n").endswith(b"3\n2\n1\n"), output


@pytest.mark.parametrize("signum", [signal.SIGTTIN, signal.SIGTTOU], ids=signal_label)
def test_terminal_stop_signals_stop_esiwrap_until_sigcont(signum: int) -> None:
    """dumb-init's shell-background test for SIGTTIN and SIGTTOU: esiwrap stops (their default),
    SIGCONT wakes it and reaches the child. (esiwrap runs in a process group of its own inside
    this session, as a shell's job does: the kernel discards these stops for an orphaned group.)"""
    proc = subprocess.Popen([*ESIWRAP, "--sources", "cli", "--log-level", "error", "--", PYTHON, RECORDER,
                             str(int(signal.SIGCONT))], stdout=subprocess.PIPE, process_group=0)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"ready ")
        proc.send_signal(signum)
        assert wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, 10)
        proc.send_signal(signal.SIGCONT)
        assert proc.stdout.readline() == b"got SIGCONT\n"
        assert psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        kill_leftovers(proc.pid)


def test_sigtstp_is_forwarded_and_never_stops_esiwrap(runs: list[EsiwrapRun]) -> None:
    """dumb-init's shell-background test for SIGTSTP, esiwrap's way: the child gets it, esiwrap
    (which must not miss a deadline) goes on running."""
    run = start(runs, "--", PYTHON, RECORDER, str(int(signal.SIGTSTP)), str(int(signal.SIGUSR2)))
    run.wait_stdout("ready", 30)
    run.signal(signal.SIGTSTP)
    run.wait_stdout("got SIGTSTP\n", 30)
    run.signal(signal.SIGUSR2)
    run.wait_stdout("got SIGUSR2\n", 30)  # esiwrap was awake to forward it
    assert psutil.Process(run.pid).status() != psutil.STATUS_STOPPED
