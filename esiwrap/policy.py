"""When to ask for a checkpoint: pure functions of what was observed; time is always an argument.

The rule (verl's, with measured inputs):

    signal_at = deadline - (step_estimate + save_estimate + reserve)

A signal at `signal_at` becomes a save at the trainer's next step boundary, which comes at most one
step later; the save then takes `save_estimate`; `reserve` is slack (`--redundant-time` for the
insurance save, `--final-margin` for the saves after it).

* step_estimate: the `--step-quantile` of the last `--step-window` boundary-to-boundary intervals
  (validation and the trainer's own saves count; saves esiwrap asked for are measured separately and
  subtracted). The time the current step has already run is a lower bound, before the first interval
  is known too: never assume 0 (verl's bug). Final saves use the median instead
  (FINAL_STEP_QUANTILE): the insurance checkpoint already holds, so a final save that lands late
  loses nothing, and aiming at the typical step rather than the slowest one keeps a warm-up step,
  a validation step or a heavy tail from ending training minutes early (benchmarks/simulate.py).
* save_estimate: `--save-duration` until a save is observed, then the longest observed save times
  SAVE_SAFETY_FACTOR, so it never falls below what was seen.

The supervisor and `benchmarks/simulate.py` both drive this module; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SAVE_SAFETY_FACTOR = 1.25
FINAL_STEP_QUANTILE = 0.5
RESCHEDULE_LOG_THRESHOLD_S = 5.0

SaveKind = Literal["insurance", "final"]


@dataclass(frozen=True)
class PolicyConfig:
    redundant_s: float = 120.0
    save_duration_s: float = 60.0
    step_window: int = 100
    step_quantile: float = 0.99  # 1.0 is the maximum (`--step-quantile max`)
    final_save: bool = True
    final_margin_s: float = 10.0
    save_safety_factor: float = SAVE_SAFETY_FACTOR
    final_step_quantile: float = FINAL_STEP_QUANTILE  # never above step_quantile


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (never interpolates below an observed value); q=1 is the maximum."""
    if not values:
        msg = "quantile of no values"
        raise ValueError(msg)
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class Observations:
    """What the trainer has told the supervisor so far; updated only from arguments."""

    def __init__(self, step_window: int) -> None:
        self.intervals: deque[float] = deque(maxlen=step_window)
        self.longest_save_s: float | None = None  # only the longest save counts
        self.last_step: int | None = None
        self.step_started_at: float | None = None  # wall time the running step began
        self._exclude_next_s = 0.0

    def trainer_started(self, at: float) -> None:
        """A trainer attached: its current step began no later than now."""
        if self.step_started_at is None:
            self.step_started_at = at

    def record_step(self, step: int, duration_s: float, at: float) -> float:
        """A step boundary at `at`; returns the interval that entered the window."""
        interval = max(0.0, duration_s - self._exclude_next_s)
        self._exclude_next_s = 0.0
        self.intervals.append(interval)
        self.last_step = step
        self.step_started_at = at
        return interval

    def record_save(self, duration_s: float) -> None:
        """A measured save (the trainer's own ones too): it feeds the save estimate."""
        self.longest_save_s = max(duration_s, self.longest_save_s or 0.0)

    def record_requested_save(self, duration_s: float, at: float) -> None:
        """A save esiwrap asked for ended at `at`; training resumes now.

        Its time is counted in the save estimate, so it is taken out of the interval that
        contains it, and the running step is taken to begin when the save ended.
        """
        self.record_save(duration_s)
        self._exclude_next_s += duration_s
        self.step_started_at = at


def step_estimate_s(obs: Observations, config: PolicyConfig) -> float | None:
    """The quantile of the window, or None before the first interval is known."""
    return quantile(list(obs.intervals), config.step_quantile) if obs.intervals else None


def final_step_estimate_s(obs: Observations, config: PolicyConfig) -> float | None:
    """The typical step, for final saves: the insurance checkpoint covers one that lands late."""
    if not obs.intervals:
        return None
    return quantile(list(obs.intervals), min(config.final_step_quantile, config.step_quantile))


def save_estimate_s(obs: Observations, config: PolicyConfig) -> float:
    if obs.longest_save_s is None:
        return config.save_duration_s
    return obs.longest_save_s * config.save_safety_factor


def latest_signal_at(cutoff: float, step_s: float | None, step_started_at: float | None) -> float:
    """The latest moment t to signal so the next boundary comes by `cutoff`.

    The next boundary is estimated to come `max(step_s, t - step_started_at)` after t: the step
    that is running has already taken `t - step_started_at`, a lower bound of its length. The
    earliest t with t + max(step_s, t - s0) >= cutoff is the answer (a closed form, so the
    supervisor can set one timer instead of re-checking as the step runs on).
    """
    step = step_s or 0.0
    if step_started_at is None:
        return cutoff - step
    plain = cutoff - step
    if plain - step_started_at <= step:
        return plain
    return (cutoff + step_started_at) / 2.0


@dataclass(frozen=True)
class SavePlan:
    """When to send the save signal, and the inputs that produced it (for the log)."""

    kind: SaveKind
    signal_at: float  # the timer: already brought forward for a step running longer than usual
    step_estimate_s: float
    save_estimate_s: float
    reserve_s: float
    nominal_at: float = 0.0  # deadline - (step + save + reserve): the plan while steps stay usual


def plan_save(deadline: float, obs: Observations, config: PolicyConfig, kind: SaveKind) -> SavePlan:
    step = step_estimate_s(obs, config)
    if kind == "final":
        step = final_step_estimate_s(obs, config)
    save = save_estimate_s(obs, config)
    reserve = config.redundant_s if kind == "insurance" else config.final_margin_s
    cutoff = deadline - save - reserve
    signal_at = latest_signal_at(cutoff, step, obs.step_started_at)
    nominal_at = cutoff - step if step is not None else signal_at
    return SavePlan(kind, signal_at, step or 0.0, save, reserve, nominal_at)


def next_save(
    deadline: float, obs: Observations, config: PolicyConfig, saves_done: int, now: float
) -> SavePlan | None:
    """The next save to ask for, or None when no further save fits.

    The first save is insurance and is always planned (if its moment has passed, ask at once).
    After it, with `final_save`, keep training and plan again with the smaller final margin, as
    long as that moment is still ahead: the save then lands on a later boundary than the last one.
    """
    if saves_done == 0:
        return plan_save(deadline, obs, config, "insurance")
    if not config.final_save:
        return None
    plan = plan_save(deadline, obs, config, "final")
    return plan if plan.signal_at >= now else None


def replan(
    deadline: float,
    obs: Observations,
    config: PolicyConfig,
    saves_done: int,
    decided: SavePlan | None,
    now: float,
) -> SavePlan | None:
    """What the supervisor does on every input change (a step, an acknowledged save, a deadline).

    With no save decided yet, decide with `next_save` whether there is a next one at all (None:
    no further save fits, stop). Once decided, the kind is kept and only its moment moves as the
    estimates and the deadline change.
    """
    if decided is None:
        return next_save(deadline, obs, config, saves_done, now)
    return plan_save(deadline, obs, config, decided.kind)


def renewal_reopens_insurance(deadline: float, obs: Observations, config: PolicyConfig, now: float) -> bool:
    """A later deadline after a completed save: is there room for a fresh insurance save before it?

    If so the supervisor starts over (saves_done = 0) rather than only moving the final save, which
    would then come hours later with just the final margin of slack.
    """
    return plan_save(deadline, obs, config, "insurance").signal_at > now


def needed_s(plan: SavePlan) -> float:
    """How long before the deadline the plan needs its signal."""
    return plan.step_estimate_s + plan.save_estimate_s + plan.reserve_s


def moved_enough(old: float | None, new: float) -> bool:
    """Log a re-plan only when it moves by more than a few seconds."""
    return old is None or abs(new - old) > RESCHEDULE_LOG_THRESHOLD_S
