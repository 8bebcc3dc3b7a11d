"""Signal-ready from the first millisecond; what the caller set up, kept for the child.

The `esiwrap` executable calls `catch()` before it imports anything else of its own (the run path
takes a hundred milliseconds and more to load). `catch()`

1. reads what the caller left: the signals it ignores (`nohup` ignores SIGHUP; a shell without job
   control, SIGINT and SIGQUIT for a background job) and its blocked mask;
2. points every signal esiwrap handles at a wakeup pipe (`signal.set_wakeup_fd`: the C-level
   handler writes the signal's number there; the Python-level one does nothing);
3. unblocks them: a launcher that blocked SIGTERM around fork/exec and forgot it must not take
   away the checkpoint. A signal that was pending while blocked is delivered into the pipe now.

A signal that arrives while the rest of esiwrap loads waits in the pipe; the supervisor's loop
reads it from there and handles it as documented, only later. The child gets the caller's set-up
back (`Caught.spawn_setup`): the same mask, and ignored what the caller ignored.

SIGINT inherited as ignored stays ignored in esiwrap as well: the shell meant "this background job
takes no Ctrl-C", and esiwrap's second SIGINT would kill the tree. Every other signal esiwrap
handles is handled whatever the caller did: SIGTERM stays the checkpoint, SIGUSR1 a save, SIGCHLD
reaping, the rest forwarded (to a child that still ignores it, as under tini).

Python itself ignores SIGPIPE and SIGXFSZ before any of our code runs, so the caller's setting of
those two cannot be seen: the child gets their default, as from any Python program.

Imports only `os`, `signal` and `esiwrap.signals`: a few hundred microseconds.
"""

from __future__ import annotations

import os
import signal

from esiwrap.signals import HANDLED

TYPE_CHECKING = False  # typing costs milliseconds, and this runs before anything else
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Caught:
    """The caller's signal set-up and esiwrap's wakeup pipe, from `catch()`."""

    def __init__(self, ignored: frozenset[int], blocked: frozenset[int], caught: tuple[int, ...],
                 previous: dict[int, Any], previous_wakeup_fd: int, read_fd: int, write_fd: int) -> None:
        self.ignored = ignored  # ignored by the caller (of the signals esiwrap could catch)
        self.blocked = blocked  # the caller's mask
        self.caught = caught  # what esiwrap catches
        self.previous = previous  # the handlers before `catch()`, restored by `release()`
        self.previous_wakeup_fd = previous_wakeup_fd
        self.read_fd = read_fd  # one byte per signal: its number
        self.write_fd = write_fd

    def spawn_setup(self) -> Callable[[], None]:
        """For the child, between fork and exec: the caller's dispositions and mask again.

        The caller of fork blocks `caught` around it (`blocked_while`), so no handler of esiwrap
        runs in the child (it would write to esiwrap's wakeup pipe); a signal that came in between
        is delivered, with the caller's disposition, when the mask is restored."""
        to_ignore = tuple(s for s in self.caught if s in self.ignored)
        to_default = tuple(s for s in self.caught if s not in self.ignored)
        mask = self.blocked

        def restore_the_callers_signals() -> None:
            for signum in to_default:
                signal.signal(signum, signal.SIG_DFL)
            for signum in to_ignore:
                signal.signal(signum, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

        return restore_the_callers_signals

    def blocked_while(self) -> _Blocked:
        """`with caught.blocked_while(): fork…`: esiwrap's signals wait (in the kernel) meanwhile."""
        return _Blocked(self.caught)


class _Blocked:
    def __init__(self, signals: tuple[int, ...]) -> None:
        self._signals = signals
        self._before: set[int] = set()

    def __enter__(self) -> None:
        self._before = set(signal.pthread_sigmask(signal.SIG_BLOCK, self._signals))

    def __exit__(self, *_: object) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._before)


_caught: Caught | None = None


def catch() -> Caught:
    """Catch esiwrap's signals into a wakeup pipe now, once per process (main thread only)."""
    global _caught
    if _caught is not None:
        return _caught
    previous = {signum: signal.getsignal(signum) for signum in HANDLED}
    ignored = frozenset(s for s, handler in previous.items() if handler == signal.SIG_IGN)
    blocked = frozenset(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ()))
    caught = tuple(s for s in HANDLED if not (s == signal.SIGINT and s in ignored))
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)  # a full pipe drops a byte; it never blocks the handler
    previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in caught:
        signal.signal(signum, _wake_only)
    _caught = Caught(ignored, blocked, caught, previous, previous_wakeup_fd, read_fd, write_fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)  # what was pending arrives now, in the pipe
    return _caught


def release(redeliver: bool = False) -> None:
    """Undo `catch()` in this process: the previous handlers, mask and wakeup fd (a subcommand,
    which is no supervisor; a supervisor run inside a process that goes on). With `redeliver`,
    the signals that arrived meanwhile are raised again, to act as they would have."""
    global _caught
    done, _caught = _caught, None
    if done is None:
        return
    arrived = b""
    if redeliver:
        with _suppress_blocking():
            arrived = os.read(done.read_fd, 512)
    for signum in done.caught:
        if signal.getsignal(signum) is not _wake_only:
            continue  # changed since (SIGTERM ignored after a Slurm requeue): not ours to undo
        handler = done.previous.get(signum)
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    signal.set_wakeup_fd(done.previous_wakeup_fd)
    signal.pthread_sigmask(signal.SIG_SETMASK, done.blocked)
    os.close(done.read_fd)
    os.close(done.write_fd)
    for signum in dict.fromkeys(arrived):  # each once, in the order they came
        signal.raise_signal(signum)


class _suppress_blocking:  # contextlib.suppress(BlockingIOError), without importing contextlib
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, BlockingIOError)


def _wake_only(signum: int, frame: object) -> None:
    """Nothing to do here: the wakeup fd already carries the signal to the loop."""
