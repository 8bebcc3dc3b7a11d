"""The deadline watcher asks each source on its own thread: one slow source (an API timing out)
never delays another's polls (a spot notice), and the first answers arrive as one batch."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from esiwrap.core.values import Answer, Deadline
from esiwrap.errors import SourceUnavailable
from esiwrap.sources import watcher as watcher_module
from esiwrap.sources.watcher import DeadlineWatcher


class Blocking:
    """A source whose answer waits until the test releases it (an API call hanging)."""

    name = "slow"
    period_s = 60.0

    def __init__(self) -> None:
        self.release = threading.Event()

    def resolve(self, now: float) -> Deadline:
        self.release.wait(10)
        return Deadline(at=now + 100, source=self.name)


class Polled:
    """A source asked every 50 ms that counts how often it was asked (a spot poll)."""

    name = "poll"
    period_s = 0.05

    def __init__(self) -> None:
        self.asked = 0

    def resolve(self, now: float) -> Deadline:
        self.asked += 1
        raise SourceUnavailable("no spot interruption notice", expected=True)


class Static:
    name = "static"
    period_s = None

    def resolve(self, now: float) -> Deadline:
        return Deadline(at=now + 50, source=self.name)


@pytest.fixture
def wake() -> Iterator[tuple[socket.socket, socket.socket]]:
    pair = socket.socketpair()
    yield pair
    for sock in pair:
        sock.close()


def collect(watcher: DeadlineWatcher, reader: socket.socket, until: float) -> list[list[Answer]]:
    """Batches as the supervisor sees them: one drain per wake-up, until the time is up."""
    batches: list[list[Answer]] = []
    reader.settimeout(0.05)
    while time.monotonic() < until:
        try:
            reader.recv(512)
        except TimeoutError:
            continue
        drained = watcher.drain()
        if drained:
            batches.append(drained)
    return batches


def test_first_round_is_one_batch_in_source_order(wake: tuple[socket.socket, socket.socket]) -> None:
    """All sources answer promptly: their first answers come together, in --sources order."""
    reader, writer = wake
    watcher = DeadlineWatcher([Static(), Polled()], writer)
    watcher.start()
    try:
        batches = collect(watcher, reader, time.monotonic() + 0.5)
    finally:
        watcher.stop()
    assert [a.source for a in batches[0]] == ["static", "poll"]
    assert all(len(b) == 1 and b[0].source == "poll" for b in batches[1:])


def test_a_hanging_source_does_not_delay_the_polls(wake: tuple[socket.socket, socket.socket],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """While one source hangs, the other is still polled on its period; the hung one's answer,
    late for the first round, arrives on its own."""
    monkeypatch.setattr(watcher_module, "FIRST_ROUND_WAIT_S", 0.2)
    reader, writer = wake
    slow, poll = Blocking(), Polled()
    watcher = DeadlineWatcher([slow, poll], writer)
    watcher.start()
    try:
        early = collect(watcher, reader, time.monotonic() + 0.8)
        asked_while_hung = poll.asked
        slow.release.set()
        late = collect(watcher, reader, time.monotonic() + 0.3)
    finally:
        slow.release.set()
        watcher.stop()
    assert [a.source for a in early[0]] == ["poll"]  # the first round, without the hung source
    assert asked_while_hung >= 5
    assert any(a.source == "slow" and a.deadline is not None for b in late for a in b)
