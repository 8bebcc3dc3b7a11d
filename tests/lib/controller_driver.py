"""Drive the decision core by hand in tests: a fake clock, inputs in, actions kept.

The driver is a world of the supervisor's own runner (`esiwrap.core.runner`): each `feed` is one
wake-up of the loop (the input and what follows, then the timers that fell due, once), and
`advance` wakes at every timer on the way, as the supervisor's loop would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from esiwrap.core import controller as core
from esiwrap.core.controller import Controller, ControllerConfig, Now
from esiwrap.core.effects import Effects
from esiwrap.core.runner import Runner
from esiwrap.core.values import Answer, Deadline

T0 = 1_800_000_000.0  # a wall clock in 2027
CHILD = 4242


class Recording(Effects):
    """The tests' world: every action recorded in order; nothing follows from any of them (a test
    feeds what the world would answer, e.g. `TreeChecked`)."""

    def __init__(self) -> None:
        self.actions: list[core.Action] = []

    def _record(self, action: Any) -> None:
        self.actions.append(action)

    log = send_signal = stop_child = kill_tree = term_leftovers = check_tree = keep_state = _record
    notify_stopping = extend_stop_timeout = probe_storage = start_upload = stop_upload = _record
    check_filesystem = release_capacity = refuse_message = resolve_deadline = exit = _record
    verify_checkpoint = stop_verify = write_manifest = look_for_checkpoint = fetch_manifests = _record
    start_restore = stop_restore = start_command = _record


class Driver:
    """One controller with its own clock (wall and monotonic advance together), driven by the runner."""

    def __init__(self, config: ControllerConfig | None = None, start: bool = True,
                 controller: Controller | None = None) -> None:
        self.controller = controller or Controller(config or ControllerConfig())
        self.world = Recording()
        self.runner = Runner(self.controller, self.world, lambda: self.now)
        self.wall = T0
        self.mono = 1000.0
        if start:
            self.feed(core.ChildStarted(CHILD, ("python", "train.py")))

    @property
    def now(self) -> Now:
        return Now(self.wall, self.mono)

    @property
    def actions(self) -> list[core.Action]:
        """Every action so far, in order."""
        return self.world.actions

    def feed(self, input_: core.Input) -> list[core.Action]:
        """One wake-up of the loop with this input; the actions it brought."""
        start = len(self.actions)
        self.runner.feed(input_)
        self.runner.wake()
        return self.actions[start:]

    def advance(self, seconds: float) -> list[core.Action]:
        """Let time pass as the supervisor's loop would: wake at every timer on the way."""
        start = len(self.actions)
        end = self.mono + seconds
        while True:
            due = self.runner.wake_in()
            step = end - self.mono if due is None else min(due, end - self.mono)
            self.wall += step
            self.mono += step
            self.runner.wake()
            if self.mono >= end or any(isinstance(a, core.Exit) for a in self.actions[start:]):
                break
        return self.actions[start:]

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


def stop_when_due(d: Driver) -> None:
    """Train on (no further save fits) until esiwrap stops the child; the tree is then gone."""
    while not any(isinstance(a, core.StopChild) for a in d.actions):
        d.advance(0.5)
    d.feed(core.ChildExited(CHILD, None, "SIGTERM", 15))
    d.feed(core.TreeChecked(0))
