"""Drive `esiwrap.core.controller.Controller` by hand in tests: a fake clock, inputs in, actions kept."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from esiwrap.core import controller as core
from esiwrap.core.controller import Controller, ControllerConfig, Now
from esiwrap.core.values import Answer, Deadline

T0 = 1_800_000_000.0  # a wall clock in 2027
CHILD = 4242


class Driver:
    """One controller with its own clock (wall and monotonic advance together)."""

    def __init__(self, config: ControllerConfig | None = None, start: bool = True) -> None:
        self.controller = Controller(config or ControllerConfig())
        self.wall = T0
        self.mono = 1000.0
        self.actions: list[core.Action] = []
        if start:
            self.feed(core.ChildStarted(CHILD, ("python", "train.py")))

    @property
    def now(self) -> Now:
        return Now(self.wall, self.mono)

    def feed(self, input_: core.Input) -> list[core.Action]:
        out = self.controller.handle(input_, self.now)
        self.actions += out
        return out

    def advance(self, seconds: float) -> list[core.Action]:
        """Let time pass as the supervisor's loop would: wake at every timer on the way."""
        out: list[core.Action] = []
        end = self.mono + seconds
        while True:
            due = self.controller.wake_at(self.now)
            step = end - self.mono if due is None else min(due, end - self.mono)
            self.wall += step
            self.mono += step
            out += self.controller.tick(self.now)
            if self.mono >= end or any(isinstance(a, core.Exit) for a in out):
                break
        self.actions += out
        return out

    def deadline(self, in_s: float, source: str = "cli", raw: str = "") -> list[core.Action]:
        deadline = Deadline(at=self.wall + in_s, source=source, raw=raw)
        return self.feed(core.DeadlineAnswers((Answer(source, deadline=deadline),)))

    def hello(self, pid: int = CHILD, **fields: Any) -> list[core.Action]:
        return self.feed(core.Hello(pid, **fields))

    def steps(self, first: int, count: int, every_s: float, pid: int = CHILD) -> None:
        for step in range(first, first + count):
            self.advance(every_s)
            self.feed(core.Step(pid, step, every_s))

    def save(self, step: int, seconds: float, pid: int = CHILD, path: str = "/ckpt") -> list[core.Action]:
        out = self.feed(core.SaveBegin(pid, step))
        out += self.advance(seconds)
        out += self.feed(core.SaveEnd(pid, step, duration_s=seconds, path=path))
        return out


def logs(actions: Iterable[core.Action], event: str | None = None) -> list[dict[str, Any]]:
    """The Log actions as dicts (event name included), optionally of one event."""
    found = [{"event": a.event, "level": a.level, **a.fields} for a in actions if isinstance(a, core.Log)]
    return [f for f in found if event is None or f["event"] == event]


def signals(actions: Iterable[core.Action]) -> list[core.SendSignal]:
    return [a for a in actions if isinstance(a, core.SendSignal)]


def exits(actions: Iterable[core.Action]) -> list[core.Exit]:
    return [a for a in actions if isinstance(a, core.Exit)]
