"""Ask the deadline sources off the supervisor's loop, each on its own period.

Sources may block on the network (bounded by their own timeouts), so one background thread asks
them and hands the answers to the loop through a queue, waking it with one byte on a socket.
The thread never logs and never decides: the loop does both.
"""

from __future__ import annotations

import contextlib
import math
import queue
import socket
import threading
import time
from collections.abc import Sequence

from esiwrap.deadline import Answer, Source, ask


class DeadlineWatcher:
    def __init__(self, sources: Sequence[Source], wake: socket.socket) -> None:
        self._sources = list(sources)
        self._wake = wake
        self._answers: queue.SimpleQueue[list[Answer]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="esiwrap-deadline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def drain(self) -> list[Answer]:
        """Every answer that arrived since the last call, oldest first."""
        answers: list[Answer] = []
        while True:
            try:
                answers.extend(self._answers.get_nowait())
            except queue.Empty:
                return answers

    def _run(self) -> None:
        next_due = {id(source): 0.0 for source in self._sources}
        while not self._stopping.is_set():
            due = [s for s in self._sources if next_due[id(s)] <= time.monotonic()]
            if due:
                self._post([ask(source, time.time()) for source in due])
                for source in due:
                    period = source.period_s
                    next_due[id(source)] = time.monotonic() + period if period else math.inf
            soonest = min(next_due.values(), default=math.inf)
            if soonest == math.inf:
                return  # every source is static: nothing more to learn
            self._stopping.wait(max(0.0, soonest - time.monotonic()))

    def _post(self, answers: list[Answer]) -> None:
        self._answers.put(answers)
        with contextlib.suppress(OSError):
            self._wake.send(b"\0")
