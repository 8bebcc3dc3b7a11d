"""Test child: reads its clocks on request, one command a line on stdin, one JSON line per reading
on stdout (`wall`: time.time(), `utc`: datetime.now(), `mono`: time.monotonic(), `perf`:
time.perf_counter(), `pid`, `thread`: the reading thread's name, and what the command adds).

    now                  a reading from the main thread
    thread               a reading from a thread (`reader`) started before the first command
    grandchild           a reading from a child this process starts now
    sleep SECONDS        `sleeping`, time.sleep(SECONDS), then `slept`
    select COUNT SECONDS `selecting`, then a selectors loop waiting SECONDS on a pipe that never
                         becomes readable, COUNT times: `woke` after each wait
    wait KIND SECONDS    a wait of C code that nothing ends, to a deadline SECONDS ahead:
                         `cond-monotonic` pthread_cond_timedwait on a CLOCK_MONOTONIC condition,
                         `cond-wall` on a CLOCK_REALTIME one, `sleep-until-wall` an absolute
                         clock_nanosleep on CLOCK_REALTIME; `waited` with the C call's result

`--via-child`: run this program as a child (same stdin and stdout) and exit with its code, so
that the one answering is a grandchild of the test. `--once`: print a reading and exit.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import selectors
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any


def reading(**extra: Any) -> dict[str, Any]:
    return {"wall": time.time(), "utc": datetime.now(timezone.utc).timestamp(), "mono": time.monotonic(),
            "perf": time.perf_counter(), "pid": os.getpid(), "thread": threading.current_thread().name,
            **extra}


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def c_wait(kind: str, seconds: float) -> int:
    """Wait as C code does, through the C library as preloaded (libfaketime's functions first);
    returns the call's result (ETIMEDOUT for a condition, 0 for clock_nanosleep)."""
    libc = ctypes.CDLL(None, use_errno=True)
    clock = time.CLOCK_REALTIME if kind.endswith("-wall") else time.CLOCK_MONOTONIC
    deadline_ns = time.clock_gettime_ns(clock) + int(seconds * 1e9)
    deadline = Timespec(deadline_ns // 10**9, deadline_ns % 10**9)
    if kind == "sleep-until-wall":
        timer_abstime = 1
        return int(libc.clock_nanosleep(clock, timer_abstime, ctypes.byref(deadline), None))
    attr, cond, mutex = (ctypes.create_string_buffer(64) for _ in range(3))  # opaque glibc types
    libc.pthread_condattr_init(attr)
    libc.pthread_condattr_setclock(attr, clock)
    libc.pthread_cond_init(cond, attr)
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    try:
        return int(libc.pthread_cond_timedwait(cond, mutex, ctypes.byref(deadline)))
    finally:
        libc.pthread_mutex_unlock(mutex)
        libc.pthread_cond_destroy(cond)


def thread_readings(asks: queue.SimpleQueue[None]) -> None:
    while True:
        asks.get()
        say(**reading())


def main() -> int:
    if "--once" in sys.argv:
        say(**reading())
        return 0
    if "--via-child" in sys.argv:
        return subprocess.call([sys.executable, __file__])
    asks: queue.SimpleQueue[None] = queue.SimpleQueue()
    threading.Thread(target=thread_readings, args=(asks,), name="reader", daemon=True).start()
    never_readable, _keep_open = os.pipe()
    selector = selectors.DefaultSelector()
    selector.register(never_readable, selectors.EVENT_READ)
    say(ready=True, **reading())
    for line in sys.stdin:
        command, *args = line.split()
        if command == "now":
            say(**reading())
        elif command == "thread":
            asks.put(None)
        elif command == "grandchild":
            done = subprocess.run([sys.executable, __file__, "--once"], capture_output=True, text=True,
                                  check=True)
            sys.stdout.write(done.stdout)
            sys.stdout.flush()
        elif command == "sleep":
            say(sleeping=True, **reading())
            time.sleep(float(args[0]))
            say(slept=True, **reading())
        elif command == "select":
            say(selecting=True, **reading())
            for _ in range(int(args[0])):
                events = selector.select(float(args[1]))
                say(woke=len(events), **reading())
        elif command == "wait":
            started = reading()
            result = c_wait(args[0], float(args[1]))
            say(waited=result, started=started, **reading())
        else:
            say(error=f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
