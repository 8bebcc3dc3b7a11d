"""Property tests of the decision core: random input sequences, invariants after every input.

The machine plays the supervisor's loop: inputs arrive in any order, time passes with a wake-up
at every timer the controller asks for, and every action is checked.
"""

from __future__ import annotations

import math
from typing import Any

from controller_driver import CHILD, Driver, logs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from esiwrap.core import controller as core
from esiwrap.core.controller import ControllerConfig, Mode
from esiwrap.core.policy import PolicyConfig
from esiwrap.errors import EXIT_CHECKPOINTED

PIDS = st.sampled_from([CHILD, 5001, 5002, 7777])
SIGNALS = st.sampled_from(["SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", "SIGQUIT", "SIGUSR2"])
SOURCES = st.sampled_from(["cli", "env:MLP", "volcengine", "volcengine-spot"])
SECONDS = st.floats(min_value=0.0, max_value=900.0, allow_nan=False)
EXPECTS_A_STOP = (Mode.RUNNING, Mode.SAVE_REQUESTED, Mode.DRAINING)


def finite_everywhere(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_everywhere(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(finite_everywhere(v) for v in value)
    return True


class ControllerMachine(RuleBasedStateMachine):
    @initialize(
        signal_child=st.booleans(), after_save=st.sampled_from(["stop", "linger", "continue"]),
        on_sigterm=st.sampled_from(["checkpoint", "forward"]), grace=st.sampled_from([5.0, 30.0]),
        redundant=st.sampled_from([0.0, 120.0]), save_duration=st.sampled_from([1.0, 60.0, 600.0]),
    )
    def start(self, signal_child: bool, after_save: Any, on_sigterm: Any, grace: float,
              redundant: float, save_duration: float) -> None:
        self.config = ControllerConfig(
            policy=PolicyConfig(redundant_s=redundant, save_duration_s=save_duration),
            signal_child=signal_child, after_save=after_save, on_sigterm=on_sigterm, stop_grace_s=grace,
        )
        self.d = Driver(self.config)
        self.signallable: set[int] = set()  # said hello from inside the tree, asking to be signalled
        self.attached: set[int] = set()  # said a hello the controller took
        self.said_bye: set[int] = set()  # attached (or the child, with --signal-child), then said bye
        self.child_gone = False
        self.exits: list[core.Exit] = []
        self.acknowledged = 0
        self.deadline_since: float | None = None
        self.drain_since: float | None = None
        self.checked = 0

    # ------------------------------------------------------------------ inputs
    def _feed(self, input_: core.Input) -> None:
        self._check(self.d.feed(input_))

    @precondition(lambda self: not self.exits)
    @rule(pid=PIDS, descendant=st.booleans(), wants_signal=st.booleans(), saves=st.booleans())
    def hello(self, pid: int, descendant: bool, wants_signal: bool, saves: bool) -> None:
        if pid == CHILD and self.child_gone:
            return
        taken = descendant and pid not in self.said_bye  # only our own tree attaches
        if taken:
            self.attached.add(pid)
        if taken and wants_signal:
            self.signallable.add(pid)
        self._feed(core.Hello(pid, saves=saves, wants_signal=wants_signal, descendant=descendant))

    @precondition(lambda self: not self.exits)
    @rule(pid=PIDS)
    def trainer_gone(self, pid: int) -> None:
        self.signallable.discard(pid)
        self.attached.discard(pid)
        self.said_bye.discard(pid)  # its process exited: the pid may be another process's
        self._feed(core.TrainerGone(pid))

    @precondition(lambda self: not self.exits)
    @rule(pid=PIDS)
    def trainer_says_bye(self, pid: int) -> None:
        if pid in self.attached or (self.config.signal_child and pid == CHILD and not self.child_gone):
            self.said_bye.add(pid)
        self.signallable.discard(pid)
        self.attached.discard(pid)
        self._feed(core.TrainerLeft(pid))

    @precondition(lambda self: not self.exits)
    @rule(pid=PIDS, step=st.integers(0, 50), duration=SECONDS)
    def step(self, pid: int, step: int, duration: float) -> None:
        self._feed(core.Step(pid, step, duration))

    @precondition(lambda self: not self.exits)
    @rule(pid=PIDS, step=st.integers(0, 50))
    def save_begin(self, pid: int, step: int) -> None:
        self._feed(core.SaveBegin(pid, step))

    @precondition(lambda self: not self.exits)
    @rule(pid=PIDS, step=st.integers(0, 50), ok=st.booleans(), duration=SECONDS)
    def save_end(self, pid: int, step: int, ok: bool, duration: float) -> None:
        self._feed(core.SaveEnd(pid, step, ok=ok, duration_s=duration, path="/ckpt"))

    @precondition(lambda self: not self.exits)
    @rule(source=SOURCES, offset=st.floats(min_value=-300.0, max_value=7200.0, allow_nan=False))
    def deadline(self, source: str, offset: float) -> None:
        before = self.d.controller.deadline
        self._check(self.d.deadline(offset, source=source))
        if self.d.controller.deadline is not before:
            self.deadline_since = self.d.wall

    @precondition(lambda self: not self.exits)
    @rule(name=SIGNALS)
    def signal(self, name: str) -> None:
        self._feed(core.SignalReceived(name))

    @rule(seconds=SECONDS)
    def time_passes(self, seconds: float) -> None:
        if not self.exits:  # after the exit there is nothing left to drive (the rule keeps the run going)
            self._check(self.d.advance(seconds))

    @precondition(lambda self: not self.exits and not self.child_gone)
    @rule(code=st.sampled_from([0, 1, None]))
    def child_exits(self, code: int | None) -> None:
        self.child_gone = True
        self.signallable.discard(CHILD)
        self.attached.discard(CHILD)
        self.said_bye.discard(CHILD)
        self._feed(core.ChildExited(CHILD, code, None if code is not None else "SIGKILL", 9))

    @precondition(lambda self: not self.exits and self.d.controller.mode in (Mode.STOPPING, Mode.KILLING))
    @rule(remaining=st.sampled_from([0, 1, 3]))
    def tree_checked(self, remaining: int) -> None:
        self._feed(core.TreeChecked(remaining))

    # ------------------------------------------------------------------ invariants
    def _check(self, actions: list[core.Action]) -> None:
        save_signal = self.config.save_signal
        # never a process that said bye: it is ending, and ignores the save signal until it is gone
        allowed = ({CHILD} if self.config.signal_child else self.signallable) - self.said_bye
        for action in actions:
            assert not self.exits, f"an action after exit: {action}"
            if isinstance(action, core.SendSignal):
                if action.signal == save_signal:
                    assert set(action.pids) <= allowed, (action, allowed)
                else:
                    assert action.pids == (CHILD,), action  # forwarded: the child only
                assert not (self.child_gone and CHILD in action.pids), "signalled a reaped child"
            elif isinstance(action, core.Log):
                assert finite_everywhere(dict(action.fields)), action
                if action.event == "save_completed":  # asked for, or the trainer's own
                    self.acknowledged += 1
            elif isinstance(action, core.ExtendStopTimeout):
                assert math.isfinite(action.seconds) and action.seconds > 0
            elif isinstance(action, core.Exit):
                self.exits.append(action)
                if action.code == EXIT_CHECKPOINTED:
                    assert self.acknowledged > 0, "exit 75 without a completed save"
        mode = self.d.controller.mode
        if mode is Mode.CONTINUING and self.config.after_save == "linger" and self.deadline_since is not None:
            self.deadline_since = min(self.deadline_since, self.d.wall)
        if mode is Mode.DRAINING and self.drain_since is None:
            self.drain_since = self.d.wall
        elif mode is not Mode.DRAINING:
            self.drain_since = None

    @invariant()
    def next_timer_is_never_in_the_past(self) -> None:
        """After the loop has handled everything, nothing is due: the loop sleeps, it never spins."""
        if hasattr(self, "d") and not self.exits:
            wait = self.d.controller.wake_at(self.d.now)
            assert wait is None or wait > 0, (self.d.controller.mode, wait)

    @invariant()
    def a_stop_begins_by_the_deadline_plus_grace(self) -> None:
        if not hasattr(self, "d") or self.exits:
            return
        c = self.d.controller
        if c.deadline is None or c.mode not in EXPECTS_A_STOP or self.deadline_since is None:
            return
        latest = max(c.deadline.at, self.deadline_since, self.drain_since or -math.inf)
        assert self.d.wall <= latest + self.config.stop_grace_s + 1e-6, (c.mode, self.d.wall - latest)

    @invariant()
    def lingering_ends_in_time_to_stop_before_the_deadline(self) -> None:
        if not hasattr(self, "d") or self.exits:
            return
        c = self.d.controller
        if c.mode is not Mode.CONTINUING or self.config.after_save != "linger" or c.deadline is None:
            return
        stop_at = c.deadline.at - self.config.stop_grace_s - core.KILL_WAIT_S
        assert self.d.wall <= max(stop_at, self.deadline_since or -math.inf) + 1e-6

    @invariant()
    def logs_are_json(self) -> None:
        if hasattr(self, "d"):
            for entry in logs(self.d.actions):
                assert finite_everywhere(entry)


ControllerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_controller_state_machine = ControllerMachine.TestCase
