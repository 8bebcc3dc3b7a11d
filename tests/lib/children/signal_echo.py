"""Test child: writes `ready`, then a line per signal it receives; `--ignore` names signals to
ignore; `--exit-on` names the signal that ends it (exit 0 after echoing)."""

from __future__ import annotations

import argparse
import os
import signal
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--echo", nargs="*", default=[])
parser.add_argument("--ignore", nargs="*", default=[])
parser.add_argument("--exit-on", default="")
args = parser.parse_args()


def echo(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    os.write(1, f"got {name}\n".encode())
    if name == args.exit_on:
        os._exit(0)


for name in args.echo:
    signal.signal(signal.Signals[name], echo)
for name in args.ignore:
    signal.signal(signal.Signals[name], signal.SIG_IGN)
os.write(1, f"ready {os.getpid()}\n".encode())
while True:
    signal.pause()
    sys.stdout.flush()
