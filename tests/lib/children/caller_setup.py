"""Test launcher: sets up signals as a caller of esiwrap might, then execs the rest of its argv.

    caller_setup.py [--ignore SIG,...] [--block SIG,...] [--pending SIG,...] -- COMMAND...

`--ignore`: SIG_IGN (what nohup does for SIGHUP); `--block`: added to the blocked mask (a launcher
that blocks signals around fork/exec and forgets them); `--pending`: sent to itself while blocked,
so it is pending when COMMAND starts (pending signals survive exec). SIGPIPE and SIGXFSZ go back to
their default first: this launcher is Python, which ignores them, unlike a shell or a C launcher.
"""

from __future__ import annotations

import os
import signal
import sys

from esiwrap.signals import signal_number


def numbers(text: str) -> list[int]:
    found = [signal_number(name) for name in text.split(",") if name]
    assert all(n is not None for n in found), text
    return [n for n in found if n is not None]


def main(argv: list[str]) -> None:
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    settings = dict(zip(options[::2], options[1::2], strict=True))
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    for signum in numbers(settings.get("--ignore", "")):
        signal.signal(signum, signal.SIG_IGN)
    pending = numbers(settings.get("--pending", ""))
    signal.pthread_sigmask(signal.SIG_BLOCK, [*numbers(settings.get("--block", "")), *pending])
    for signum in pending:
        os.kill(os.getpid(), signum)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
