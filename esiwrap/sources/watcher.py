"""Ask the deadline sources off the supervisor's loop, each on its own period.

Sources may block on the network (bounded by their own timeouts), so each source is asked on a
thread of its own: a slow API call never delays a spot-notice poll. The first answers of all
sources are handed over together (or those in by `FIRST_ROUND_WAIT_S`, so one slow API cannot
hold back the others), so the first `deadline_resolved` is the winner among all of them; later
answers are handed over as they come. Answers reach the loop through a queue, with
one byte on a socket to wake it. The threads never log and never decide: the loop does both.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Sequence

from esiwrap.core.values import Answer
from esiwrap.sources.base import Source
from esiwrap.sources.chain import ask

FIRST_ROUND_WAIT_S = 3.0
FALLBACK_PERIOD_S = 300.0


class DeadlineWatcher:
    def __init__(self, sources: Sequence[Source], wake: socket.socket) -> None:
        self._sources = list(sources)
        self._wake = wake
        self._answers: queue.SimpleQueue[list[Answer]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._nudge = threading.Condition()  # `ask_now`: every source is asked again at once
        self._round = 0
        self._first_round: dict[int, Answer] | None = {}  # None once handed over
        self._first_lock = threading.Lock()
        self._first_timer = threading.Timer(FIRST_ROUND_WAIT_S, self._hand_over_first_round)
        self._first_timer.daemon = True
        self._threads = [
            threading.Thread(target=self._watch, args=(index, source), daemon=True,
                             name=f"esiwrap-deadline-{source.name}")
            for index, source in enumerate(self._sources)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        self._first_timer.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._nudge:
            self._nudge.notify_all()
        self._first_timer.cancel()

    def drain(self) -> list[Answer]:
        """Every answer that arrived since the last call, oldest first."""
        answers: list[Answer] = []
        while True:
            try:
                answers.extend(self._answers.get_nowait())
            except queue.Empty:
                return answers

    def _watch(self, index: int, source: Source) -> None:
        first = True
        while not self._stopping.is_set():
            answer = ask(source, time.time())
            if first:
                self._first_answer(index, answer)
                first = False
            else:
                self._post([answer])
            period = _period(source)  # read after asking: a source may back off after a failure
            if not period:
                return  # a static source: its answer cannot change
            self._wait(period)

    def ask_now(self) -> None:
        """Ask every periodic source again now, not at the end of its period (the answers come
        as usual, through `drain`)."""
        with self._nudge:
            self._round += 1
            self._nudge.notify_all()

    def _wait(self, period: float) -> None:
        """Until the period is over, `ask_now` is called or the watcher stops."""
        with self._nudge:
            start = self._round
            self._nudge.wait_for(lambda: self._round != start or self._stopping.is_set(), timeout=period)

    def _first_answer(self, index: int, answer: Answer) -> None:
        with self._first_lock:
            if self._first_round is not None:
                self._first_round[index] = answer
                if len(self._first_round) < len(self._sources):
                    return
        if not self._hand_over_first_round():
            self._post([answer])  # too late for the first round

    def _hand_over_first_round(self) -> bool:
        """Post the first answers collected so far, once; False if that was done already."""
        with self._first_lock:
            if self._first_round is None:
                return False
            batch = [self._first_round[i] for i in sorted(self._first_round)]
            self._first_round = None
        self._first_timer.cancel()
        if batch:
            self._post(batch)
        return True

    def _post(self, answers: list[Answer]) -> None:
        self._answers.put(answers)
        with contextlib.suppress(OSError):
            self._wake.send(b"\0")


def _period(source: Source) -> float | None:
    """The source's period; a source whose period cannot be read is asked again after
    FALLBACK_PERIOD_S rather than never (the thread must not die of it)."""
    try:
        period = source.period_s
    except Exception:
        return FALLBACK_PERIOD_S
    usable = period is None or (isinstance(period, (int, float)) and period > 0)
    return period if usable else FALLBACK_PERIOD_S
