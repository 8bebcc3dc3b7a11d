"""The `esiwrap` executable: `esiwrap.cli.main`, started and ended light.

Start: the signals first (`esiwrap.shell.early.catch`), before anything else is imported: from then on
a signal does not kill a starting supervisor, it waits in a pipe for the loop (a subcommand gives
them back: `esiwrap report` stops on Ctrl-C as any program does). Then the garbage collector is
off while the modules load. They make tens of thousands of objects that live as long as the
process, so collecting them finds nothing; `cli` freezes them and turns the collector back on
before supervision begins (`cli.resume_gc`).

End: once stdout and stderr are flushed, the process leaves with `os._exit`. Tearing every
module down one object at a time costs more than a short run's whole supervision (about 8 ms
of CPU here), and by then the child tree is reaped, sockets closed and files written. A bug's
traceback still takes the ordinary way out, and so does `python -m esiwrap` (`__main__`), which
a test or a tool may run inside a process that goes on afterwards.
"""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False  # typing costs milliseconds before the signals are caught
if TYPE_CHECKING:
    from typing import NoReturn


def console() -> NoReturn:
    from esiwrap.shell import early

    early.catch()
    gc.disable()
    from esiwrap.cli import main

    try:
        code = main()
    except SystemExit as exc:  # argparse's --help/--version, and every one-line user error
        code = _exit_code(exc.code)
    _flush()
    os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what Python does with SystemExit("message")
    return 1


def _flush() -> None:
    import contextlib

    from esiwrap.shell import log

    log.flush()  # the supervisor's lines still queued for a slow reader, bounded
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`esiwrap report | head`)
            stream.flush()
