"""Test child: handles every signal number given on the command line by writing `got LABEL` (the
label as esiwrap.signals.signal_label writes it), after a `ready PID` line. Runs until killed."""

from __future__ import annotations

import os
import signal
import sys

from esiwrap.signals import signal_label


def record(signum: int, _frame: object) -> None:
    os.write(1, f"got {signal_label(signum)}\n".encode())


for number in sys.argv[1:]:
    signal.signal(int(number), record)
os.write(1, f"ready {os.getpid()}\n".encode())
while True:
    signal.pause()
