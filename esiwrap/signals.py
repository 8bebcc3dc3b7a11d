"""Signals: which ones esiwrap uses, forwards or leaves alone (the one list the supervisor and
docs/reference/signals.md follow), and signal names as they travel between esiwrap and the trainer
(`ESIWRAP_SIGNAL`, a hello's `stop_signal`). Standard library only (and `esiwrap.envvars`): loaded
in every hooked Ray worker.

Like tini and dumb-init, esiwrap forwards every catchable signal it does not use itself to the
child, so `kill -ALRM`, `kill -PWR` (lxc-stop's halt signal) or a real-time signal reach the
trainer instead of ending esiwrap and the run with it. Not forwarded:

* USED: SIGINT (forwarded; the second one kills the child tree), SIGTERM (a checkpoint, then the
  stop), SIGUSR1 (a save by hand), SIGCHLD (reaping: it is about esiwrap's own children);
* UNCATCHABLE: SIGKILL ends esiwrap (the child gets SIGTERM through PR_SET_PDEATHSIG); SIGSTOP
  freezes esiwrap while the child trains on unsupervised, until SIGCONT;
* SYNCHRONOUS faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT): a handler that
  returns would re-run the faulting instruction forever; they keep their default (esiwrap dies,
  the child gets SIGTERM);
* TERMINAL job control on output (SIGTTIN, SIGTTOU): default, as for any program. Caught, a
  background esiwrap writing to its terminal under `stty tostop` would be sent SIGTTOU again on
  every retried write, forever;
* OWN I/O errors (SIGPIPE, SIGXFSZ): ignored, as Python does at start-up; they are raised by
  esiwrap's own writes (a closed log pipe, a full log file) and forwarding them would kill the
  child for esiwrap's I/O trouble.

SIGTSTP (Ctrl-Z) is forwarded: esiwrap itself is never stopped by it (a stopped supervisor misses
the deadline while training runs on); the child, in its own session, only sees it if it installed
a handler (the kernel discards the default stop for an orphaned process group). SIGWINCH and
SIGCONT are forwarded too.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from esiwrap.envvars import SIGNAL_ENV

USED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD)
UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)
SYNCHRONOUS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP,
               signal.SIGSYS, signal.SIGABRT)
TERMINAL_OUTPUT = (signal.SIGTTIN, signal.SIGTTOU)
OWN_IO_ERRORS = (signal.SIGPIPE, signal.SIGXFSZ)
NOT_FORWARDED = frozenset(int(s) for s in USED + UNCATCHABLE + SYNCHRONOUS + TERMINAL_OUTPUT + OWN_IO_ERRORS)
# Every other signal this platform has, real-time ones included (glibc keeps 32 and 33 for itself
# and `valid_signals` leaves them out).
FORWARDED = tuple(sorted(int(s) for s in signal.valid_signals() if int(s) not in NOT_FORWARDED))
HANDLED = (*USED, *FORWARDED)


def signal_number(name: str) -> int | None:
    """`SIGINT`, `int`, `Int`, `2` or `SIGRTMIN+3` (what `signal_label` writes) as a signal
    number; None for anything else."""
    text = name.strip().upper()
    if text.isdigit():
        number = int(text)
        return number if number in {int(s) for s in signal.valid_signals()} else None
    base, plus, offset = text.partition("+")
    if plus and base in ("SIGRTMIN", "RTMIN") and offset.isdigit():
        number = int(signal.SIGRTMIN) + int(offset)
        return number if number <= int(signal.SIGRTMAX) else None
    member = getattr(signal.Signals, text if text.startswith("SIG") else "SIG" + text, None)
    return int(member) if member is not None else None


def signal_label(signum: int) -> str:
    """`SIGHUP`; real-time signals as `SIGRTMIN+3` (most have no name of their own)."""
    rtmin, rtmax = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
    if rtmin < signum < rtmax:
        return f"SIGRTMIN+{signum - rtmin}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def save_signal(environ: Mapping[str, str] = os.environ) -> int:
    """The save signal esiwrap exported to this process; SIGUSR1 when none (or nonsense) was."""
    return signal_number(environ.get(SIGNAL_ENV, "")) or int(signal.SIGUSR1)
