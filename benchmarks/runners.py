"""Policies played against a `Scenario`, each evaluated where it really runs.

* `run_esiwrap` is `esiwrap.tools.replay.replay`: it drives esiwrap's own decision core
  (`esiwrap.core.controller.Controller`, which plans with `esiwrap.core.policy`) with the inputs the
  supervisor would feed it, on a simulated clock: a step report at each boundary (boundary-to-
  boundary time), save begin/snapshot/end around a save, a deadline change when it is announced,
  and a wake-up at every timer the controller asks for. A save signal is taken to arrive at once
  (its latency is microseconds against steps of seconds) but is acted on only at the trainer's
  next boundary: a signal sent while the step report of boundary b is processed is seen at the
  following one. Any stop (`StopChild`) ends training. A run with a state file starts the
  controller from it, as `--state-file` does.
* `run_verl` is verl's rule as verl's `RayPPOTrainer.fit` runs it: after each step, save when
  `0 < remaining <= 60 + max_steps_duration + esi_redundant_time`, where `max_steps_duration` is the
  longest step so far (a step's time includes a save made in it; 0 before the first step ends),
  and keep training. The deadline comes from an environment variable read at start, so it never
  sees a renewal or a notice.
* `run_oracle` knows the future: one save at the last boundary whose save ends before reclamation.
* `run_reference` knows what a policy could know at best without knowing the future: the true
  rate of surprise interruptions and every step's and save's duration, but not when an
  interruption comes, nor how early the known deadline's reclamation will be (only its worst
  case, `reserve_s`). Young/Daly periodic saves for the true rate and the true cost of a save,
  plus one save at the last boundary whose save is durable `reserve_s` before the deadline
  (following the deadline as it is announced).

With uploads (the `upload` families), a checkpoint counts only once its upload ended before
reclamation. The oracle saves at the last boundary whose save and upload both end in time; the
reference's last save is the last one whose save and upload are durable `reserve_s` before the
deadline; verl, which knows nothing of uploads, has each of its checkpoints uploaded after it, one
at a time and the newest waiting one next (`esiwrap.tools.replay.UploadLine`), as a user's script beside
it would (so do the reference's checkpoints).

The trainer is the same for all of them: it saves at a boundary when asked (or on its own every
`own_save_every` steps: one save serves both), a synchronous save stops training for its whole
length, an asynchronous one for its blocking part while the write goes on (a new save waits for
the write in flight to finish). Time spent saving is not training: a run's progress is the
training time of the steps its last durable save holds (`Scenario.boundaries`), and the work it
loses is reclamation minus that.
"""

from __future__ import annotations

import math

from traces import Scenario

from esiwrap.core.controller import ControllerConfig
from esiwrap.core.policy import PolicyConfig
from esiwrap.tools.replay import Outcome, Tally, UploadLine, Write, replay

VERL_SAVE_S = 60.0  # should_save_ckpt_esi's save_ckpt_duration default; verl never passes another


# ---------------------------------------------------------------------------------- oracle
def run_oracle(scenario: Scenario) -> Outcome:
    """One save of its own at the last boundary whose write ends before reclamation, on top of
    the trainer's own saves (which it cannot avoid, and which keep progress of their own)."""
    tally = Tally(scenario)
    wall_shift = 0.0  # time the trainer's own saves have stopped training so far
    best: tuple[int, float] | None = None  # (step, wall time of its boundary)
    for step, trained in enumerate(tally.progress, start=1):
        at = trained + wall_shift
        if at > scenario.reclaim_at:
            break
        if at + scenario.saves[step - 1] + _upload_s(scenario, step) <= scenario.reclaim_at:
            best = (step, at)
        if scenario.own_save(step):
            _durable(tally, tally.begin(step, at))
            wall_shift += scenario.blocking_s(step)
    if best is not None and (tally.saved_step is None or best[0] > tally.saved_step):
        _durable(tally, tally.begin(*best))
    return tally.outcome()


def _upload_s(scenario: Scenario, step: int) -> float:
    return scenario.uploads[step - 1] if scenario.uploads is not None else 0.0


def _durable(tally: Tally, write: Write) -> None:
    """The oracle's write, and its upload right after it (the oracle never waits for another)."""
    if tally.durable(write) and tally.trace.uploads is not None:
        tally.uploaded(write.step, write.durable, write.durable + _upload_s(tally.trace, write.step))


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
    saves = _Saves(scenario)
    now, longest = 0.0, 0.0
    for step, duration in enumerate(scenario.steps, start=1):
        boundary = now + duration
        if boundary > scenario.reclaim_at:
            break
        now = boundary
        step_time = duration
        if verl_wants_save(scenario.deadline - boundary, longest, redundant_s) or scenario.own_save(step):
            resumed = saves.save(step, now)
            if resumed is None:
                break
            now = resumed
            step_time = now - (boundary - duration)
        longest = max(longest, step_time)
    return saves.outcome()


# ---------------------------------------------------------------------------------- reference
def run_reference(scenario: Scenario, reserve_s: float) -> Outcome:
    saves = _Saves(scenario)
    rate_per_s = scenario.surprise_rate_per_day / 86_400.0
    costs = [scenario.blocking_s(k) for k in range(1, len(scenario.steps) + 1)]
    cost = sum(costs) / len(costs) if costs else 0.0
    interval = math.sqrt(2.0 * max(cost, 1e-3) / rate_per_s) if rate_per_s > 0 else math.inf
    changes = sorted(scenario.changes, key=lambda c: c.at)
    deadline, saved_for = scenario.deadline, None  # the deadline its one save was for
    now, trained, checkpoint_trained = 0.0, 0.0, 0.0
    for step, duration in enumerate(scenario.steps, start=1):
        boundary = now + duration
        if boundary > scenario.reclaim_at:
            break
        now, trained = boundary, trained + duration
        while changes and changes[0].at <= now:
            deadline = changes.pop(0).deadline
        last_fit = _last_boundary_that_fits(scenario, step, now, deadline - reserve_s)
        periodic = trained - checkpoint_trained >= interval
        if (last_fit and saved_for != deadline) or periodic or scenario.own_save(step):
            if last_fit:
                saved_for = deadline
            checkpoint_trained = trained
            resumed = saves.save(step, now)
            if resumed is None:
                break
            now = resumed
    return saves.outcome()


class _Saves:
    """The checkpoints of a policy without esiwrap (verl's, the reference's): one write at a time
    (a new save waits for the asynchronous write in flight), each checkpoint uploaded after it
    by a script beside the trainer (`UploadLine`)."""

    def __init__(self, scenario: Scenario) -> None:
        self._scenario = scenario
        self._tally = Tally(scenario)
        self._uploads = UploadLine(scenario, self._tally) if scenario.uploads is not None else None
        self._in_flight: Write | None = None

    def save(self, step: int, now: float) -> float | None:
        """A save at boundary `step`, asked for at `now`: when training resumes, or None when the
        save did not end before reclamation (the run is over)."""
        if self._in_flight is not None:  # the previous write must finish first
            now = max(now, self._in_flight.durable)
            self._durable(self._in_flight)
            self._in_flight = None
        write = self._tally.begin(step, now)
        if self._scenario.blocking is None:
            return write.durable if self._durable(write) else None
        self._in_flight = write
        return write.resumes

    def outcome(self) -> Outcome:
        if self._in_flight is not None:
            self._durable(self._in_flight)
        if self._uploads is not None:
            self._uploads.finish()
        return self._tally.outcome()

    def _durable(self, write: Write) -> bool:
        done = self._tally.durable(write)
        if done and self._uploads is not None:
            self._uploads.add(write.step, write.durable)
        return done


def _last_boundary_that_fits(scenario: Scenario, step: int, now: float, durable_by: float) -> bool:
    """A save here (and its upload) is durable by `durable_by`, and one at the next boundary would
    not be."""
    if now + scenario.saves[step - 1] + _upload_s(scenario, step) > durable_by:
        return False
    if step >= len(scenario.steps):
        return True
    return now + scenario.steps[step] + scenario.saves[step] + _upload_s(scenario, step + 1) > durable_by


# ---------------------------------------------------------------------------------- esiwrap
def run_esiwrap(scenario: Scenario, config: PolicyConfig | ControllerConfig) -> Outcome:
    """esiwrap's own decision core, replayed over the scenario (`esiwrap.tools.replay`)."""
    return replay(scenario, config)
