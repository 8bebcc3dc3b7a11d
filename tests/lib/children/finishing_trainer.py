"""Test trainer that finishes while save signals are on their way.

It calls `esiwrap.trainer.install()` (`--own-handler`: a Python handler of its own instead, as a
trainer without the library's exit hook has), runs `--steps` steps, and ends (`--end`): it falls
off the end of the script, calls `sys.exit(3)`, raises an uncaught exception (1) or calls
`os._exit(4)`. With `--uninstall` it calls `esi.uninstall()` after its steps, as a framework's
callback does at the end of training, and holds as `evaluating` (evaluation goes on) first.

On its way out it writes where it is: `atexit: <the save signal's disposition>` from an atexit
hook of its own, registered before `install()`'s and so run after it; then `teardown` from a
finalizer that runs while the interpreter tears its modules down, after it gave every signal with
a Python handler back to the default action (for `--end os_exit`: `os._exit`, just before the
call). With `--hold FIFO` it stops there until the test writes a byte to the FIFO: the test sends
it the save signal while it holds, at the one moment of the shutdown where a handler no longer
protects it.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys

import esiwrap.trainer as esi
from esiwrap.signals import save_signal

parser = argparse.ArgumentParser()
parser.add_argument("--end", choices=["return", "exit", "raise", "os_exit"], default="return")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--hold", default="", help="a FIFO: stop on the way out until a byte comes")
parser.add_argument("--own-handler", action="store_true", help="no install(): a handler of its own")
parser.add_argument("--uninstall", action="store_true",
                    help="after the steps, uninstall() and hold as `evaluating` (a framework's callback)")
args = parser.parse_args()


def hold(where: str, fifo: str = args.hold, write=os.write, open_=os.open, read=os.read,
         close=os.close, rdonly=os.O_RDONLY) -> None:
    """Say where we are; wait for the test's byte (names bound now: in teardown the module's
    globals may be gone already)."""
    write(1, f"{where}\n".encode())
    if fifo:
        fd = open_(fifo, rdonly)  # returns once the test opens the FIFO to write
        read(fd, 1)
        close(fd)


def disposition(signum: int) -> str:
    handler = signal.getsignal(signum)
    if handler is signal.SIG_IGN:
        return "SIG_IGN"
    return "SIG_DFL" if handler is signal.SIG_DFL else "a handler"


class Teardown:
    """Finalized when the interpreter clears the main module: after its signal handlers are gone."""

    def __del__(self, hold=hold) -> None:
        hold("teardown")


save_signum = save_signal()  # ESIWRAP_SIGNAL, else SIGUSR1: what install() handles
atexit.register(lambda: os.write(1, f"atexit: {disposition(save_signum)}\n".encode()))  # runs last
keeper = Teardown()
if args.own_handler:
    signal.signal(save_signum, lambda signum, frame: None)
else:
    esi.install()
for step in range(1, args.steps + 1):
    esi.step_done(step)
    if esi.save_requested():
        with esi.saving(step):
            print(f"finishing_trainer: saved {step}", flush=True)
print("finishing_trainer: finished", flush=True)
if args.uninstall:  # a framework's callback at the end of training; evaluation follows
    esi.uninstall()
    hold("evaluating")
if args.end == "exit":
    sys.exit(3)
if args.end == "raise":
    raise RuntimeError("finishing_trainer: finished, then failed")
if args.end == "os_exit":
    hold("os._exit")
    os._exit(4)
