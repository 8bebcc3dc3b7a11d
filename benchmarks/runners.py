"""Policies played against a `Scenario`, each evaluated where it really runs.

* `run_esiwrap` drives esiwrap's own decision core (`esiwrap.controller.Controller`, which plans
  with `esiwrap.policy`) with the events the supervisor would feed it, on a simulated clock: a
  step report at each boundary (boundary-to-boundary time), save begin/snapshot/end around a
  save, a deadline change when it is announced, and a wake-up at every timer the controller asks
  for. A save signal is taken to arrive at once (its latency is microseconds against steps of
  seconds) but is acted on only at the trainer's next boundary: a signal sent while the step
  report of boundary b is processed is seen at the following one. Any stop (`StopChild`) ends
  training. A run with a state file starts the controller from it, as `--state-file` does.
* `run_verl` is verl's rule as verl's `RayPPOTrainer.fit` runs it: after each step, save when
  `0 < remaining <= 60 + max_steps_duration + esi_redundant_time`, where `max_steps_duration` is the
  longest step so far (a step's time includes a save made in it; 0 before the first step ends),
  and keep training. The deadline comes from an environment variable read at start, so it never
  sees a renewal or a notice.
* `run_oracle` knows the future: one save at the last boundary whose save ends before reclamation.

The trainer is the same for all three: it saves at a boundary when asked (or on its own every
`own_save_every` steps: one save serves both), a synchronous save stops training for its whole
length, an asynchronous one for its blocking part while the write goes on (a new save waits for
the write in flight to finish). Time spent saving is not training: a run's progress is the
training time of the steps its last durable save holds (`Scenario.boundaries`), and the work it
loses is reclamation minus that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traces import Scenario

from esiwrap import controller as core
from esiwrap.controller import Controller, ControllerConfig, Now
from esiwrap.deadline import Answer, Deadline
from esiwrap.policy import PolicyConfig, Prior

VERL_SAVE_S = 60.0  # should_save_ckpt_esi's save_ckpt_duration default; verl never passes another


@dataclass(frozen=True)
class Outcome:
    saved_step: int | None  # the last step held by a completed save
    progress_s: float  # its training time: what the next instance resumes from
    reclaim_at: float
    saves: int  # saves begun
    saving_s: float  # wall time training stood still for saves, up to reclamation

    @property
    def missed(self) -> bool:
        return self.saved_step is None

    @property
    def lost_s(self) -> float:
        return self.reclaim_at - self.progress_s


@dataclass(frozen=True)
class Write:
    """A save begun at `begins`: training resumes at `resumes`, it is durable at `durable`."""

    step: int
    begins: float
    resumes: float
    durable: float


class _Tally:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.progress = scenario.boundaries()
        self.saved_step: int | None = None
        self.saves = 0
        self.saving_s = 0.0

    def begin(self, step: int, at: float) -> Write:
        self.saves += 1
        resumes = at + self.scenario.blocking_s(step)
        self.saving_s += max(0.0, min(resumes, self.scenario.reclaim_at) - at)
        return Write(step, at, resumes, at + self.scenario.saves[step - 1])

    def durable(self, write: Write) -> bool:
        """The write is on disk if it ended before reclamation; then it holds its step."""
        if write.durable > self.scenario.reclaim_at:
            return False
        if self.saved_step is None or write.step > self.saved_step:
            self.saved_step = write.step
        return True

    def cut_short(self, write: Write, stopped_at: float) -> None:
        """esiwrap's stop came while training stood still for this save: count only until then."""
        counted = min(write.resumes, self.scenario.reclaim_at)
        self.saving_s -= max(0.0, counted - min(stopped_at, write.resumes))

    def outcome(self) -> Outcome:
        progress = self.progress[self.saved_step - 1] if self.saved_step is not None else 0.0
        return Outcome(self.saved_step, progress, self.scenario.reclaim_at, self.saves, self.saving_s)


# ---------------------------------------------------------------------------------- oracle
def run_oracle(scenario: Scenario) -> Outcome:
    """One save of its own at the last boundary whose write ends before reclamation, on top of
    the trainer's own saves (which it cannot avoid, and which keep progress of their own)."""
    tally = _Tally(scenario)
    wall_shift = 0.0  # time the trainer's own saves have stopped training so far
    best: tuple[int, float] | None = None  # (step, wall time of its boundary)
    for step, trained in enumerate(tally.progress, start=1):
        at = trained + wall_shift
        if at > scenario.reclaim_at:
            break
        if at + scenario.saves[step - 1] <= scenario.reclaim_at:
            best = (step, at)
        if scenario.own_save(step):
            tally.durable(tally.begin(step, at))
            wall_shift += scenario.blocking_s(step)
    if best is not None and (tally.saved_step is None or best[0] > tally.saved_step):
        tally.durable(tally.begin(*best))
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
    in_flight: Write | None = None
    for step, duration in enumerate(scenario.steps, start=1):
        boundary = now + duration
        if boundary > scenario.reclaim_at:
            break
        now = boundary
        step_time = duration
        if verl_wants_save(scenario.deadline - boundary, longest, redundant_s) or scenario.own_save(step):
            if in_flight is not None:  # the previous write must finish first
                now = max(now, in_flight.durable)
                tally.durable(in_flight)
                in_flight = None
            write = tally.begin(step, now)
            if scenario.blocking is None:
                if not tally.durable(write):
                    break
                now = write.durable
            else:
                now, in_flight = write.resumes, write
            step_time = now - (boundary - duration)
        longest = max(longest, step_time)
    if in_flight is not None:
        tally.durable(in_flight)
    return tally.outcome()


# ---------------------------------------------------------------------------------- esiwrap
TRAINER_PID = 1000  # the simulated trainer is the direct child and says hello at once


class _Shell:
    """What `esiwrap.supervisor` does around the controller, on a simulated clock.

    The controller is esiwrap's own `esiwrap.controller.Controller`; this shell only carries out its
    actions: the save signal raises the trainer's flag (seen at the trainer's next boundary), and
    any stop ends training (the run keeps what its last durable save holds). An asynchronous
    write in flight reports its end when it is durable, in time order with everything else.
    """

    def __init__(self, scenario: Scenario, config: ControllerConfig, tally: _Tally) -> None:
        prior = Prior(scenario.prior_steps, scenario.prior_saves) if scenario.prior_saves else None
        self.controller = Controller(config, prior=prior)
        self.tally = tally
        self.now = 0.0
        self.flag = False  # the trainer's save flag, raised by the save signal
        self.stopped_at: float | None = None
        self.in_flight: Write | None = None
        self.changes = sorted(scenario.changes, key=lambda c: c.at)
        self.feed(core.ChildStarted(TRAINER_PID))
        self.feed(core.DeadlineAnswers((_answer(scenario.deadline),)))
        self.feed(core.Hello(TRAINER_PID))

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def feed(self, event: core.Event) -> None:
        self._apply(self.controller.handle(event, Now(self.now, self.now)))

    def _apply(self, actions: list[core.Action]) -> None:
        for action in actions:
            if isinstance(action, core.SendSignal) and TRAINER_PID in action.pids \
                    and action.signal == self.controller.config.save_signal:
                self.flag = True
            elif isinstance(action, (core.StopChild, core.KillTree, core.Exit)) and self.stopped_at is None:
                self.stopped_at = self.now

    def advance(self, until: float) -> None:
        """Timers, deadline announcements and a write becoming durable, up to `until`, in order."""
        while not self.stopped:
            wait = self.controller.wake_at(Now(self.now, self.now))
            timer = math.inf if wait is None else self.now + wait
            change_at = self.changes[0].at if self.changes else math.inf
            durable_at = self.in_flight.durable if self.in_flight is not None else math.inf
            first = min(timer, change_at, durable_at)
            if first > until:
                break
            self.now = max(self.now, first)
            if durable_at == first:
                self.finish_write()
            elif change_at == first:
                self.feed(core.DeadlineAnswers((_answer(self.changes.pop(0).deadline),)))
            else:
                self._apply(self.controller.tick(Now(self.now, self.now)))
        self.now = max(self.now, until)

    def finish_write(self) -> None:
        write = self.in_flight
        assert write is not None
        self.in_flight = None
        if self.tally.durable(write):
            self.feed(core.SaveEnd(TRAINER_PID, write.step, duration_s=write.durable - write.begins))


def _answer(deadline: float) -> Answer:
    return Answer("sim", deadline=Deadline(at=deadline, source="sim"))


def run_esiwrap(scenario: Scenario, config: PolicyConfig | ControllerConfig) -> Outcome:
    tally = _Tally(scenario)
    full = config if isinstance(config, ControllerConfig) else ControllerConfig(policy=config)
    shell = _Shell(scenario, full, tally)
    last_boundary = 0.0
    for step, duration in enumerate(scenario.steps, start=1):
        boundary = shell.now + duration
        shell.advance(boundary)  # a signal sent by now is seen at this boundary
        if boundary > scenario.reclaim_at or shell.stopped:
            break
        seen = shell.flag
        shell.feed(core.Step(TRAINER_PID, step, boundary - last_boundary))
        last_boundary = boundary
        if (seen or scenario.own_save(step)) and shell.in_flight is None:
            shell.flag = False
            if not _save(shell, tally, scenario, step):
                break
        if shell.stopped:
            break
    if shell.in_flight is not None and not shell.stopped:
        shell.advance(shell.in_flight.durable)
    return tally.outcome()


def _save(shell: _Shell, tally: _Tally, scenario: Scenario, step: int) -> bool:
    """The trainer saves at this boundary; False when the run ended during the save."""
    shell.feed(core.SaveBegin(TRAINER_PID, step))
    write = tally.begin(step, shell.now)
    if scenario.blocking is not None:
        shell.advance(write.resumes)
        if shell.stopped_at is not None and shell.stopped_at < write.resumes:
            tally.cut_short(write, shell.stopped_at)
            return False
        shell.in_flight = write
        shell.feed(core.SaveSnapshot(TRAINER_PID, step, duration_s=write.resumes - write.begins))
        return True
    shell.advance(write.durable)
    if shell.stopped_at is not None and shell.stopped_at < write.durable:
        tally.cut_short(write, shell.stopped_at)
        return False  # stopped while saving: the save never completed
    if not tally.durable(write):
        return False
    shell.feed(core.SaveEnd(TRAINER_PID, step, duration_s=write.durable - write.begins))
    return True
