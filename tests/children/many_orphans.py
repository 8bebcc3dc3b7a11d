"""Test child (tini's reaping scenario): a helper starts 100 short `sleep`s and exits without
waiting, so they are orphaned to whoever adopts them; this process waits, bounded, until none of
them is left, running or as a zombie, then prints how many remain and exits 0 only if none does."""

from __future__ import annotations

import os
import subprocess
import sys
import time

started = subprocess.run(
    [sys.executable, "-c",
     "import random, subprocess\n"
     "for i in range(100):\n"
     "    p = subprocess.Popen(['sleep', str(0.5 + i % 2 + random.random())])\n"
     "    print(p.pid)\n"
     "import os; os._exit(0)\n"],  # no wait: the sleeps are orphans from here on
    capture_output=True, text=True, check=True)
orphans = [int(line) for line in started.stdout.split()]
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    left = [pid for pid in orphans if os.path.exists(f"/proc/{pid}")]  # a zombie still has its entry
    if not left:
        break
    time.sleep(0.1)
print(f"orphans={len(orphans)} left={len(left)} pid1={os.getppid() == 1}", flush=True)
sys.exit(0 if not left else 1)
