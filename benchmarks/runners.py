"""Policies played against a `Scenario`, each evaluated where it really runs.

* `run_esiwrap` drives esiwrap's own decision core (`esiwrap.controller.Controller`, which plans
  with `esiwrap.policy`) with the events the supervisor would feed it, on a simulated clock: a
  step report at each boundary (boundary-to-boundary time), save begin/end around a save, a
  deadline change when it is announced, and a wake-up at every timer the controller asks for.
  A save signal is taken to arrive at once (its latency is microseconds against steps of
  seconds) but is acted on only at the trainer's next boundary: a signal sent while the step
  report of boundary b is processed is seen at the following one. Any stop (`StopChild`) ends
  training.
* `run_verl` is verl's rule as verl's `RayPPOTrainer.fit` runs it: after each step, save when
  `0 < remaining <= 60 + max_steps_duration + esi_redundant_time`, where `max_steps_duration` is the
  longest step so far (a step's time includes a save made in it; 0 before the first step ends),
  and keep training. The deadline comes from an environment variable read at start, so it never
  sees a renewal or a notice.
* `run_oracle` knows the future: one save at the last boundary whose save ends before reclamation.

Time spent saving is not training: a run's progress is the training time of the steps its last
completed save holds (`Scenario.boundaries`), and the work it loses is reclamation minus that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traces import Scenario

from esiwrap import controller as core
from esiwrap.controller import Controller, ControllerConfig, Now
from esiwrap.deadline import Answer, Deadline
from esiwrap.policy import PolicyConfig

VERL_SAVE_S = 60.0  # should_save_ckpt_esi's save_ckpt_duration default; verl never passes another


@dataclass(frozen=True)
class Outcome:
    saved_step: int | None  # the last step held by a completed save
    progress_s: float  # its training time: what the next instance resumes from
    reclaim_at: float
    saves: int  # saves begun
    saving_s: float  # wall time spent in saves, up to reclamation

    @property
    def missed(self) -> bool:
        return self.saved_step is None

    @property
    def lost_s(self) -> float:
        return self.reclaim_at - self.progress_s


class _Tally:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.progress = scenario.boundaries()
        self.saved_step: int | None = None
        self.saves = 0
        self.saving_s = 0.0

    def save(self, step: int, begins: float) -> float | None:
        """A save of `step` begun at `begins`: its end, or None when reclamation comes first."""
        self.saves += 1
        ends = begins + self.scenario.saves[step - 1]
        if ends > self.scenario.reclaim_at:
            self.saving_s += max(0.0, self.scenario.reclaim_at - begins)
            return None
        self.saving_s += ends - begins
        self.saved_step = step
        return ends

    def cut_short(self, begins: float, stopped_at: float) -> None:
        """A save begun at `begins` that esiwrap's stop ended before it completed."""
        self.saves += 1
        self.saving_s += max(0.0, min(stopped_at, self.scenario.reclaim_at) - begins)

    def outcome(self) -> Outcome:
        progress = self.progress[self.saved_step - 1] if self.saved_step is not None else 0.0
        return Outcome(self.saved_step, progress, self.scenario.reclaim_at, self.saves, self.saving_s)


# ---------------------------------------------------------------------------------- oracle
def run_oracle(scenario: Scenario) -> Outcome:
    tally = _Tally(scenario)
    best: int | None = None
    for step, end in enumerate(tally.progress, start=1):
        if end + scenario.saves[step - 1] <= scenario.reclaim_at:
            best = step
    if best is not None:
        tally.save(best, tally.progress[best - 1])
    return tally.outcome()


# ---------------------------------------------------------------------------------- verl
def verl_wants_save(remaining_s: float, max_steps_duration_s: float, redundant_s: float,
                    save_s: float = VERL_SAVE_S) -> bool:
    """verl's `should_save_ckpt_esi` (Volcengine MLP branch), with time as an argument."""
    return (
        remaining_s > 0
        and max_steps_duration_s > 0
        and remaining_s <= save_s + max_steps_duration_s + redundant_s
    )


def run_verl(scenario: Scenario, redundant_s: float = 0.0) -> Outcome:
    tally = _Tally(scenario)
    now, longest = 0.0, 0.0
    for step, duration in enumerate(scenario.steps, start=1):
        boundary = now + duration
        if boundary > scenario.reclaim_at:
            break
        step_time = duration
        now = boundary
        if verl_wants_save(scenario.deadline - boundary, longest, redundant_s):
            ends = tally.save(step, boundary)
            if ends is None:
                break
            step_time += ends - boundary
            now = ends
        longest = max(longest, step_time)
    return tally.outcome()


# ---------------------------------------------------------------------------------- esiwrap
TRAINER_PID = 1000  # the simulated trainer is the direct child and says hello at once


class _Shell:
    """What `esiwrap.supervisor` does around the controller, on a simulated clock.

    The controller is esiwrap's own `esiwrap.controller.Controller`; this shell only carries out its
    actions: the save signal raises the trainer's flag (seen at the trainer's next boundary), and
    any stop ends training (the run keeps what its last completed save holds).
    """

    def __init__(self, scenario: Scenario, config: ControllerConfig) -> None:
        self.controller = Controller(config)
        self.now = 0.0
        self.flag = False  # the trainer's save flag, raised by the save signal
        self.stopped_at: float | None = None
        self.changes = sorted(scenario.changes, key=lambda c: c.at)
        self.feed(core.ChildStarted(TRAINER_PID))
        self.feed(core.DeadlineAnswers((_answer(scenario.deadline),)))
        self.feed(core.Hello(TRAINER_PID))

    def feed(self, event: core.Event) -> None:
        self._apply(self.controller.handle(event, Now(self.now, self.now)))

    def _apply(self, actions: list[core.Action]) -> None:
        for action in actions:
            if isinstance(action, core.SendSignal) and TRAINER_PID in action.pids \
                    and action.signal == self.controller.config.save_signal:
                self.flag = True
            elif isinstance(action, (core.StopChild, core.KillTree, core.Exit)) and self.stopped_at is None:
                self.stopped_at = self.now

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def advance(self, until: float) -> None:
        """Timers and deadline announcements up to `until`, in time order, as the loop wakes."""
        while not self.stopped:
            wait = self.controller.wake_at(Now(self.now, self.now))
            timer = math.inf if wait is None else self.now + wait
            change_at = self.changes[0].at if self.changes else math.inf
            if min(timer, change_at) > until:
                break
            if change_at <= timer:
                self.now = max(self.now, change_at)
                self.feed(core.DeadlineAnswers((_answer(self.changes.pop(0).deadline),)))
            else:
                self.now = timer
                self._apply(self.controller.tick(Now(self.now, self.now)))
        self.now = max(self.now, until)


def _answer(deadline: float) -> Answer:
    return Answer("sim", deadline=Deadline(at=deadline, source="sim"))


def run_esiwrap(scenario: Scenario, config: PolicyConfig | ControllerConfig) -> Outcome:
    tally = _Tally(scenario)
    full = config if isinstance(config, ControllerConfig) else ControllerConfig(policy=config)
    shell = _Shell(scenario, full)
    last_boundary = 0.0
    for step, duration in enumerate(scenario.steps, start=1):
        boundary = shell.now + duration
        shell.advance(boundary)  # a signal sent by now is seen at this boundary
        if boundary > scenario.reclaim_at or shell.stopped:
            break
        seen, shell.flag = shell.flag, False
        shell.feed(core.Step(TRAINER_PID, step, boundary - last_boundary))
        last_boundary = boundary
        if seen:
            shell.feed(core.SaveBegin(TRAINER_PID, step))
            ends = boundary + scenario.saves[step - 1]
            shell.advance(ends)
            if shell.stopped_at is not None and shell.stopped_at < ends:
                tally.cut_short(boundary, shell.stopped_at)
                break  # stopped while saving: the save never completed
            if tally.save(step, boundary) is None:
                break
            shell.feed(core.SaveEnd(TRAINER_PID, step, duration_s=ends - boundary))
        if shell.stopped:
            break
    return tally.outcome()
