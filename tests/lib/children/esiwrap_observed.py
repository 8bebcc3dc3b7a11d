"""Keeps a status file (and, with a port, a metrics endpoint) as esiwrap's supervisor does: the
real Observer in a real selector loop. Snapshots arrive as JSON lines on stdin; EOF ends it.

    python esiwrap_observed.py STATUS_FILE|auto [METRICS_PORT]

Prints `ready STATUS_PATH URL` once serving (URL is - without a port). The file name has
"esiwrap" in it: `esiwrap status` only believes a live pid whose command line says esiwrap.
"""

from __future__ import annotations

import os
import selectors
import sys
import time

from esiwrap.core.snapshot import Snapshot
from esiwrap.shell.observe import Observer, ObserveSettings
from esiwrap.shell.statusfile import default_status_file


def main() -> None:
    status_arg = sys.argv[1]
    status_file = (default_status_file(os.environ, os.getpid(), os.getuid())
                   if status_arg == "auto" else status_arg)
    port = int(sys.argv[2]) if len(sys.argv) > 2 else None
    selector = selectors.DefaultSelector()
    observer = Observer(selector, ObserveSettings(status_file=status_file, metrics_port=port,
                                                  min_interval_s=0.0))
    url = observer.endpoint.url if observer.endpoint else "-"
    buffer = b""
    done = False

    def on_stdin(_: selectors.SelectorKey) -> None:
        nonlocal buffer, done
        data = os.read(sys.stdin.fileno(), 65536)
        if not data:
            done = True
            return
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            observer.update(Snapshot.from_json(line))
            print("updated", flush=True)

    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, on_stdin)
    print(f"ready {status_file} {url}", flush=True)
    while not done:
        mono = time.monotonic()
        wake = observer.next_wake(mono)
        for key, _ in selector.select(None if wake is None else max(0.0, wake - mono)):
            key.data(key)
        observer.tick(time.monotonic())
    observer.close()


if __name__ == "__main__":
    main()
