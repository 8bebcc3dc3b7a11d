"""How long a thread waited on timeouts, measured so that a busy machine does not stretch it.

A wall-clock bound on a timeout breaks under load: the thread that waited its 0.5 s then waits
seconds more for a CPU. The kernel splits a thread's time three ways (/proc/thread-self/schedstat):
running, runnable but waiting for a CPU, and blocked (on a socket, a timer, a sleep). Timeouts
and backoff are blocked time; load adds to the second part, not to it.

Blocked time also holds any wait on work done elsewhere (a lock held by a busy thread, a child
process): bound it only where the thread waits on timers and the network.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Waited:
    wall_s: float = 0.0
    blocked_s: float = 0.0  # off the CPU and not waiting for one: timeouts, sleeps, the network


def _clocks() -> tuple[float, float]:
    """(wall, running + waiting for a CPU) in seconds, for the calling thread."""
    with open("/proc/thread-self/schedstat") as f:
        running_ns, runnable_ns, _ = f.read().split()
    return time.monotonic(), (int(running_ns) + int(runnable_ns)) / 1e9


@contextmanager
def waited() -> Iterator[Waited]:
    """The block's wall time and the part of it the thread was blocked (same thread throughout)."""
    result = Waited()
    wall, on_cpu = _clocks()
    try:
        yield result
    finally:
        wall_end, on_cpu_end = _clocks()
        result.wall_s = wall_end - wall
        result.blocked_s = result.wall_s - (on_cpu_end - on_cpu)
