"""The child and its tree: spawn in a new session, signal it, find and kill what is left.

Nothing here knows about deadlines. The supervisor reaps (it owns SIGCHLD); this module only
starts processes and sends signals.

psutil is imported only by the functions that walk a process tree (a stop with processes left):
a run whose child exits alone never pays for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from esiwrap.errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, CommandError

if TYPE_CHECKING:
    import psutil

    from esiwrap.shell import early

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SHELL = "/bin/sh"

_libc: Any = None  # ctypes.CDLL, loaded on first use


def _prctl(option: int, arg: int) -> bool:
    global _libc
    if _libc is None:
        import ctypes

        try:
            # The C library is already in this process: dlopen(NULL) finds prctl without
            # ctypes.util.find_library, which runs `ldconfig -p` in a subprocess.
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.prctl  # noqa: B018 - a C library without prctl (not Linux): fail here, once
        except (OSError, AttributeError):
            _libc = False
    if _libc is False:
        return False
    return bool(_libc.prctl(option, arg, 0, 0, 0) == 0)


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to us (not to init), so we can reap and stop them."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def resolve_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The executable's path, or a CommandError with the shell's exit code (127/126)."""
    program = argv[0]
    if os.sep in program:
        if not os.path.exists(program):
            raise CommandError(f"{program}: no such file", EXIT_NOT_FOUND)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise CommandError(f"{program}: not executable (chmod +x?)", EXIT_NOT_EXECUTABLE)
        return program
    found = which(program, env.get("PATH", os.defpath))
    if found is None:
        raise CommandError(f"{program}: command not found on PATH", EXIT_NOT_FOUND)
    return found


def which(program: str, path: str) -> str | None:
    """The first executable file named `program` on `path` (shutil.which, without importing
    shutil and the compression modules it loads)."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def spawn(argv: Sequence[str], env: Mapping[str, str], death_signal: int,
          signals: early.Caught | None = None, callers_env: Mapping[str, str] | None = None) -> int:
    """Start the command in its own session; it gets `death_signal` if esiwrap dies first.

    With `signals` (what `esiwrap.shell.early` caught), the child starts with the caller's signal set-up:
    the mask esiwrap was given, and ignored what the caller ignored. A file without `#!` that
    the kernel will not run is run with /bin/sh, as execvp does. `callers_env`, the environment
    before esiwrap's additions, names them in an "argument list too long" error.

    Call before starting any thread: the pre-exec hook runs between fork and exec.
    """
    executable = resolve_command(argv, env)
    try:
        return _fork_exec(list(argv), executable, env, death_signal, signals)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC or _looks_binary(executable):
            raise _spawn_error(argv, env, callers_env, exc) from None
    try:  # a script without a #! line: what execvp, tini and every shell do
        return _fork_exec([SHELL, executable, *argv[1:]], SHELL, env, death_signal, signals)
    except OSError as exc:
        raise _spawn_error(argv, env, callers_env, exc) from None


def _fork_exec(argv: list[str], executable: str, env: Mapping[str, str], death_signal: int,
               signals: early.Caught | None) -> int:
    parent = os.getpid()
    _prctl(0, 0)  # load libc in the parent, so the child does no dlopen between fork and exec
    restore_signals = signals.spawn_setup() if signals is not None else None

    def in_child() -> None:
        if restore_signals is not None:
            restore_signals()
        _prctl(PR_SET_PDEATHSIG, death_signal)
        if os.getppid() != parent:  # esiwrap died before prctl took effect
            os.kill(os.getpid(), death_signal)
            os._exit(128 + death_signal)  # the caller blocked or ignored it: leave all the same

    with signals.blocked_while() if signals is not None else contextlib.nullcontext():
        proc = subprocess.Popen(argv, executable=executable, env=dict(env), start_new_session=True,
                                preexec_fn=in_child)
    proc.returncode = 0  # esiwrap reaps with waitpid(-1); keep Popen from reaping or warning
    return proc.pid


def _looks_binary(path: str) -> bool:
    """An executable for another machine (ENOEXEC too) rather than a script: /bin/sh cannot help."""
    try:
        with open(path, "rb") as file:
            head = file.read(512)
    except OSError:
        return True
    return head.startswith(b"\x7fELF") or b"\0" in head


def _spawn_error(argv: Sequence[str], env: Mapping[str, str], callers_env: Mapping[str, str] | None,
                 exc: OSError) -> CommandError:
    if isinstance(exc, PermissionError):
        return CommandError(f"{argv[0]}: not executable ({exc.strerror})", EXIT_NOT_EXECUTABLE)
    if exc.errno == errno.E2BIG:
        return CommandError(too_long(argv, env, callers_env), EXIT_NOT_EXECUTABLE)
    if exc.errno == errno.ENOEXEC:
        return CommandError(f"{argv[0]}: cannot run ({exc.strerror}: a program for another kind of "
                            "machine?)", EXIT_NOT_EXECUTABLE)
    return CommandError(f"{argv[0]}: cannot run ({exc.strerror})", EXIT_NOT_EXECUTABLE)


MAX_ARG_STRLEN = 32 * 4096  # Linux: the longest single argument or NAME=value, with its NUL
POINTER_BYTES = 8


def exec_bytes(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """What execve counts against its limit: every string with its NUL, and a pointer to each."""
    strings = [*argv, *(f"{k}={v}" for k, v in env.items())]
    return sum(len(os.fsencode(s)) + 1 + POINTER_BYTES for s in strings)


def too_long(argv: Sequence[str], env: Mapping[str, str], callers_env: Mapping[str, str] | None) -> str:
    """The one-line E2BIG error: how far over, and whether esiwrap's own variables did it."""
    limit = os.sysconf("SC_ARG_MAX")
    total = exec_bytes(argv, env)
    if callers_env is None:
        return (f"{argv[0]}: argument list too long: the command and its environment take {total} bytes, "
                f"over the kernel's limit of {limit}; shorten the arguments or unset large variables")
    before = exec_bytes(argv, callers_env)
    added = {k: v for k, v in env.items() if callers_env.get(k) != v}
    names = ", ".join(sorted(added))
    fitted = before < limit and _longest(argv, callers_env)[0] <= MAX_ARG_STRLEN
    longest, name = _longest(argv, env)
    if fitted and (total >= limit or longest > MAX_ARG_STRLEN):
        over = (f"the command and its environment take {total} bytes, over the kernel's limit of {limit}"
                if total >= limit else f"{name} is {longest} bytes, over the kernel's {MAX_ARG_STRLEN} "
                "for one")
        return (f"{argv[0]}: argument list too long, because of esiwrap's own variables ({names}: "
                f"{total - before} bytes): with them {over}; unset some large environment variables, "
                "or set ESIWRAP_HOOK=0 to leave PYTHONPATH alone")
    return (f"{argv[0]}: argument list too long: the command and its environment take {before} bytes "
            f"without esiwrap's own variables ({names}), over the kernel's limit of {limit}; shorten "
            "the arguments or unset large environment variables")


def _longest(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    """The longest string execve copies (bytes with its NUL), and what it is."""
    sizes = [(len(os.fsencode(a)) + 1, "an argument") for a in argv]
    sizes += [(len(os.fsencode(f"{k}={v}")) + 1, k) for k, v in env.items()]
    return max(sizes, default=(0, ""))


def send(pid: int, signum: int) -> bool:
    """Signal one process; False when it is already gone."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def has_children() -> bool:
    """Whether this process has any child, running or not yet reaped (nothing is reaped here)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def descendants(pid: int) -> list[psutil.Process]:
    import psutil

    try:
        children: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return children


def is_descendant(pid: int, ancestor: int) -> bool:
    """True when `pid` is `ancestor` or below it: we only ever signal our own tree."""
    import psutil

    try:
        proc = psutil.Process(pid)
        while proc is not None:
            if proc.pid == ancestor:
                return True
            proc = proc.parent()
    except psutil.Error:
        return False
    return False


def alive(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those still running (same pid and start time: a recycled pid does not count)."""
    import psutil

    living = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                living.append(proc)
    return living


def signal_all(processes: Iterable[psutil.Process], signum: int) -> None:
    import psutil

    for proc in processes:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signum)


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+), else None."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid exists (psutil.pid_exists, without importing psutil)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
