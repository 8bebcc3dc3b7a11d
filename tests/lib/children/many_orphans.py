"""Test child (tini's reaping scenario): a helper starts 100 short `sleep`s and exits without
waiting, so they are orphaned to whoever adopts them; this process waits, bounded, until none of
them is left, running or as a zombie, then prints how many remain and exits 0 only if none does."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks after boot), or None once it is gone: with it, a pid
    the kernel hands to a new process is not taken for the orphan that had it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


started = subprocess.run(
    [sys.executable, "-c",
     "import random, subprocess\n"
     "for i in range(100):\n"
     "    p = subprocess.Popen(['sleep', str(0.5 + i % 2 + random.random())])\n"
     "    print(p.pid)\n"
     "import os; os._exit(0)\n"],  # no wait: the sleeps are orphans from here on
    capture_output=True, text=True, check=True)
orphans = {pid: start_time(pid) for pid in map(int, started.stdout.split())}  # each lives 0.5 s at least
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    # a zombie still has its entry; a pid taken by a new process has another start time
    left = [pid for pid, began in orphans.items() if began is not None and start_time(pid) == began]
    if not left:
        break
    time.sleep(0.1)
print(f"orphans={len(orphans)} left={len(left)} pid1={os.getppid() == 1}", flush=True)
sys.exit(0 if not left else 1)
