"""Policies played against a `Scenario`, each evaluated where it really runs.

* `run_esiwrap` drives esiwrap's own planning code (`esiwrap.policy`: `Observations`, `replan`)
  through the same sequence of calls the supervisor makes (`Supervisor._on_step`, `_replan`,
  `_housekeeping`, `_request_save`, `_acknowledged`, `_set_deadline`). What the supervisor learns
  arrives as it would: a step report at each boundary (boundary-to-boundary time), a save ack
  when the save ends, a deadline change when it is announced. A save signal is taken to arrive
  at once (its latency is microseconds against steps of seconds) but is acted on only at the
  trainer's next boundary: a signal sent while the step report of boundary b is processed is
  seen at the following one.
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

from esiwrap.policy import Observations, PolicyConfig, SavePlan, replan

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
class _Supervisor:
    """The planning state of `esiwrap.supervisor.Supervisor`, without its I/O.

    Method names follow the supervisor's; each does what its namesake does with the policy.
    """

    def __init__(self, config: PolicyConfig, deadline: float) -> None:
        self.config = config
        self.deadline = deadline
        self.obs = Observations(config.step_window)
        self.plan: SavePlan | None = None
        self.requested_at: float | None = None  # a save signal is out, not yet acknowledged
        self.saves_done = 0
        self.stopped = False

    def _replan(self, now: float) -> None:
        if self.stopped or self.requested_at is not None:
            return
        plan = replan(self.deadline, self.obs, self.config, self.saves_done, self.plan, now)
        if plan is None:  # _no_further_save with --after-save stop: exit 75
            self.plan = None
            self.stopped = True
            return
        self.plan = plan

    def housekeeping(self, now: float) -> None:
        """The planned moment has come (or had already passed when it was computed)."""
        if not self.stopped and self.plan is not None and self.requested_at is None \
                and now >= self.plan.signal_at:
            self.requested_at = now  # _request_save

    def next_timer(self) -> float:
        if self.stopped or self.plan is None or self.requested_at is not None:
            return math.inf
        return self.plan.signal_at

    def on_hello(self, now: float) -> None:
        self.obs.trainer_started(now)
        self._replan(now)
        self.housekeeping(now)

    def on_step(self, step: int, duration_s: float, now: float) -> None:
        self.obs.record_step(step, duration_s, now)
        self._replan(now)
        self.housekeeping(now)

    def on_acknowledged(self, duration_s: float, now: float) -> None:
        self.obs.record_requested_save(duration_s, now)
        self.requested_at = None
        self.saves_done += 1
        self.plan = None
        self._replan(now)
        self.housekeeping(now)

    def on_deadline(self, deadline: float, now: float) -> None:
        self.deadline = deadline
        self._replan(now)
        self.housekeeping(now)  # a deadline already too close: the save is asked for at once


def run_esiwrap(scenario: Scenario, config: PolicyConfig) -> Outcome:
    tally = _Tally(scenario)
    sup = _Supervisor(config, scenario.deadline)
    changes = sorted(scenario.changes, key=lambda c: c.at)

    def advance(until: float) -> None:
        """Timers and deadline announcements up to `until`, in time order."""
        while True:
            change_at = changes[0].at if changes else math.inf
            timer = sup.next_timer()
            if timer <= until and timer <= change_at:
                sup.housekeeping(timer)
            elif change_at <= until:
                change = changes.pop(0)
                sup.on_deadline(change.deadline, change.at)
            else:
                return

    sup.on_hello(0.0)
    now = last_boundary = 0.0
    for step, duration in enumerate(scenario.steps, start=1):
        boundary = now + duration
        advance(boundary)  # a signal sent by now is seen at this boundary
        if boundary > scenario.reclaim_at or sup.stopped:
            break
        seen = sup.requested_at is not None
        sup.on_step(step, boundary - last_boundary, boundary)
        last_boundary = now = boundary
        if seen:
            ends = tally.save(step, boundary)
            if ends is None:
                break
            advance(ends)
            sup.on_acknowledged(ends - boundary, ends)
            now = ends
        if sup.stopped:
            break
    return tally.outcome()
