"""The wall-clock helper (tests/lib/faketime.py) on real processes: a step moves what they read from
the wall clock, by the step, at once, in every thread and every descendant; their monotonic
clock and their timeouts keep real time.

A reading is checked against the real clocks of this (unfaked) process read just before the
command was sent and just after the answer came: the child's CLOCK_MONOTONIC is the same clock,
so it must fall between the two; its wall clock, less the offset, too. A machine under load
widens the bracket, never breaks it. Timeouts have a firm lower bound and a generous upper one.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faketime
import pytest
from esiwrap_harness import CHILDREN, PYTHON
from faketime import FaketimeUnavailable, WallClock

pytestmark = pytest.mark.system

CLOCK_PROBE = CHILDREN / "clock_probe.py"
READ_SLACK_S = 0.01  # float precision of an epoch reading; the bracket itself absorbs the load
JUMP_SLACK_S = 0.1  # a reading's wall and monotonic clocks are read one after the other: preemption
TIMEOUT_SLACK_S = 15.0  # late on a loaded machine, never early; far below the 30 s of a wait moved by a step
ANSWER_TIMEOUT_S = 30.0


@dataclass
class Answer:
    reading: dict[str, Any]
    real_before: float  # this process's time.time() and time.monotonic() when the command was sent
    mono_before: float
    real_after: float  # ... and when the answer had come
    mono_after: float


class ClockProbe:
    """tests/lib/children/clock_probe.py under the wall clock, asked one command at a time."""

    def __init__(self, env: dict[str, str], stderr: Path, via_child: bool = False) -> None:
        self.stderr = stderr
        with open(stderr, "wb") as errors:
            self.proc = subprocess.Popen(
                [PYTHON, str(CLOCK_PROBE), *(["--via-child"] if via_child else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._buffer = b""
        self.ready = self.line()

    def send(self, command: str) -> tuple[float, float]:
        """Send a command; this process's (wall, monotonic) clocks just before."""
        assert self.proc.stdin is not None
        before = time.time(), time.monotonic()
        self.proc.stdin.write(f"{command}\n".encode())
        self.proc.stdin.flush()
        return before

    def line(self, timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
        """The next JSON line of the probe, waiting at most `timeout`."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                raise AssertionError(f"no answer from the clock probe within {timeout}s; {self.where()}")
            data = os.read(self.proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
            if not data:
                raise AssertionError(f"the clock probe closed its stdout; {self.where()}")
            self._buffer += data
        raw, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(raw)
        return answer

    def ask(self, command: str) -> Answer:
        real_before, mono_before = self.send(command)
        reading = self.line()
        return Answer(reading, real_before, mono_before, time.time(), time.monotonic())

    def where(self) -> str:
        return f"exit {self.proc.poll()}, stderr: {self.stderr.read_text()[-2000:]!r}"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._selector.close()


@pytest.fixture
def probe(wall_clock: WallClock, tmp_path: Path) -> Iterator[Callable[..., ClockProbe]]:
    """Start clock probes under the wall clock; each is killed (its process group) at the end."""
    started: list[ClockProbe] = []

    def start(via_child: bool = False) -> ClockProbe:
        started.append(ClockProbe(wall_clock.env(), tmp_path / f"probe-{len(started)}.stderr", via_child))
        return started[-1]

    yield start
    for each in started:
        each.kill()


def assert_reads(answer: Answer, offset_s: float) -> None:
    """The reading's wall clocks are the real one plus the offset, its monotonic clocks the real
    one, each between this process's readings before the command and after the answer."""
    reading = answer.reading
    for wall in ("wall", "utc"):
        low, high = answer.real_before + offset_s - READ_SLACK_S, answer.real_after + offset_s + READ_SLACK_S
        assert low <= reading[wall] <= high, (wall, reading[wall] - answer.real_before, offset_s, reading)
    for mono in ("mono", "perf"):
        low, high = answer.mono_before - READ_SLACK_S, answer.mono_after + READ_SLACK_S
        assert low <= reading[mono] <= high, (mono, reading[mono] - answer.mono_before, reading)


@pytest.mark.parametrize("via_child", [False, True], ids=["child", "grandchild"])
def test_a_running_process_reads_each_step_on_its_wall_clock_and_none_on_its_monotonic(
        wall_clock: WallClock, probe: Callable[..., ClockProbe], via_child: bool) -> None:
    """A process started with env() (or a grandchild of it), already running, reads
    time.time() and datetime.now() at the real time plus the offset after each step (+30 s,
    -30 s, -30 s, +0.5 s), in its main thread and in a thread started before the steps; between
    two readings its wall clock moves by the step more than its monotonic clock, and
    time.monotonic() and time.perf_counter() read the real monotonic clock throughout."""
    clock = probe(via_child=via_child)
    if via_child:
        assert clock.ready["pid"] != clock.proc.pid
    readings = []
    for step_s in (0.0, +30.0, -30.0, -30.0, +0.5):
        wall_clock.step(step_s)
        for command in ("now", "thread"):
            answer = clock.ask(command)
            assert_reads(answer, wall_clock.offset)
            assert answer.reading["thread"] == ("reader" if command == "thread" else "MainThread")
            readings.append((step_s if command == "now" else 0.0, answer.reading))
    assert wall_clock.offset == pytest.approx(-29.5)
    for (_, earlier), (step_s, later) in itertools.pairwise(readings):
        assert later["mono"] > earlier["mono"]
        wall_moved = later["wall"] - earlier["wall"]
        mono_moved = later["mono"] - earlier["mono"]
        assert wall_moved - mono_moved == pytest.approx(step_s, abs=JUMP_SLACK_S), (earlier, later)


def test_a_process_started_after_a_step_by_one_under_the_clock_reads_the_offset(
        wall_clock: WallClock, probe: Callable[..., ClockProbe]) -> None:
    """A grandchild started after a step (the way esiwrap starts its trainer) reads the wall
    clock at the offset, and the real monotonic clock."""
    clock = probe()
    wall_clock.step(+30)
    assert_reads(clock.ask("grandchild"), +30)
    wall_clock.step(-60)
    answer = clock.ask("grandchild")
    assert_reads(answer, -30)
    assert answer.reading["pid"] != clock.proc.pid


def test_sleep_takes_real_time_across_a_step(wall_clock: WallClock, probe: Callable[..., ClockProbe]) -> None:
    """time.sleep(0.5) under the wall clock takes 0.5 s of real time, measured by this process's
    monotonic clock and by the child's, though the wall clock steps (+30 s, then -60 s) while it
    sleeps; the reading after the sleep has the new offset."""
    clock = probe()
    for step_s in (+30, -60):
        real_sent, mono_sent = clock.send("sleep 0.5")
        sleeping = clock.line()
        assert sleeping["sleeping"]
        wall_clock.step(step_s)
        slept = clock.line()
        real_done, mono_done = time.time(), time.monotonic()
        assert slept["slept"]
        assert 0.5 <= mono_done - mono_sent <= 0.5 + TIMEOUT_SLACK_S
        assert 0.5 <= slept["mono"] - sleeping["mono"] <= 0.5 + TIMEOUT_SLACK_S
        assert_reads(Answer(slept, real_sent, mono_sent, real_done, mono_done), wall_clock.offset)


def test_a_selectors_loop_wakes_after_its_timeout_across_steps(
        wall_clock: WallClock, probe: Callable[..., ClockProbe]) -> None:
    """A selectors loop waiting 1 s on a pipe that stays empty wakes after 1 s of real time each
    time round, though the wall clock steps +30 s during the first wait and -60 s during the
    second; three rounds take at least 3 s of this process's monotonic clock."""
    clock = probe()
    real_sent, mono_sent = clock.send("select 3 1.0")
    previous = clock.line()
    assert previous["selecting"]
    for step_s in (+30, -60, 0):
        if step_s:
            wall_clock.step(step_s)
        woke = clock.line()
        assert woke["woke"] == 0
        assert 0.999 <= woke["mono"] - previous["mono"] <= 1.0 + TIMEOUT_SLACK_S, (previous, woke)
        previous = woke
    real_done, mono_done = time.time(), time.monotonic()
    assert 3.0 <= mono_done - mono_sent <= 3.0 + TIMEOUT_SLACK_S
    assert_reads(Answer(previous, real_sent, mono_sent, real_done, mono_done), -30)


def test_waits_of_c_code_take_real_time_at_any_offset(
        wall_clock: WallClock, probe: Callable[..., ClockProbe]) -> None:
    """At +30 s and at -30 s, C code waiting 0.5 s waits 0.5 s of real time: a condition on the
    monotonic clock (a deadline libfaketime must pass through unchanged), a condition on the wall
    clock and an absolute clock_nanosleep on the wall clock (deadlines read from the faked wall
    clock, which libfaketime moves back by the offset)."""
    clock = probe()
    for step_s in (+30, -60):
        wall_clock.step(step_s)
        for kind, result in (("cond-monotonic", errno.ETIMEDOUT), ("cond-wall", errno.ETIMEDOUT),
                             ("sleep-until-wall", 0)):
            answer = clock.ask(f"wait {kind} 0.5")
            assert answer.reading["waited"] == result, (kind, answer.reading)
            assert 0.5 <= answer.mono_after - answer.mono_before <= 0.5 + TIMEOUT_SLACK_S, kind
            waited_s = answer.reading["mono"] - answer.reading["started"]["mono"]
            assert 0.49 <= waited_s <= 0.5 + TIMEOUT_SLACK_S, (kind, answer.reading)


def test_without_libfaketime_the_clock_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine without Debian's libfaketime the helper fails, naming the package and the
    script that installs it (the fixture turns this into a failed test, never a skip)."""
    monkeypatch.setattr(faketime, "LIBRARY_PLACES", (str(tmp_path / "nowhere"),))
    wanted = r"libfaketimeMT\.so\.1 not found .*apt-get install libfaketime"
    with pytest.raises(FaketimeUnavailable, match=wanted):
        WallClock.create(tmp_path, shim=tmp_path / "unused.so")
