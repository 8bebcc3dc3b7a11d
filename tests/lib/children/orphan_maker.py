"""Test child: makes an orphan (a grandchild whose parent exits), then waits, bounded, until the
orphan has been reaped by whoever adopted it; prints the outcome."""

from __future__ import annotations

import os
import subprocess
import sys
import time

out = subprocess.run(["sh", "-c", "sleep 0.3 & echo $!"], capture_output=True, text=True, check=True)
orphan = int(out.stdout.strip())
deadline = time.monotonic() + 15
while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
    time.sleep(0.05)
reaped = not os.path.exists(f"/proc/{orphan}")
print(f"pid1={os.getppid() == 1} orphan={orphan} reaped={reaped}", flush=True)
sys.exit(0 if reaped else 1)
