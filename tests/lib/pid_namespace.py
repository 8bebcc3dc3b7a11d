"""esiwrap as PID 1 of a PID namespace of its own (`unshare --pid --fork --mount-proc`), as a
container runtime starts it, and its pid as the host sees it."""

from __future__ import annotations

import psutil
from esiwrap_harness import PYTHON, EsiwrapRun, wait_until

AS_PID_1 = ("unshare", "--fork", "--pid", "--mount-proc", PYTHON, "-m", "esiwrap")


def pid_1_on_the_host(run: EsiwrapRun) -> int:
    """The host's pid of the namespace's PID 1 (esiwrap), the child of `unshare --fork`."""
    found: list[int] = []

    def esiwrap_started() -> bool:
        found[:] = [c.pid for c in psutil.Process(run.pid).children() if "esiwrap" in " ".join(c.cmdline())]
        return bool(found)

    assert wait_until(esiwrap_started, 30)
    return found[0]
