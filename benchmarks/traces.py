"""Trace families for the policy simulator: what a run's steps, saves and deadline look like.

A `Scenario` is one run, fixed before any policy sees it (common random numbers: every policy
faces the same steps, saves and reclamation). Each family changes one thing from `constant`, so
a row shows what that one thing does:

    constant      every step `step_s`, every save `save_s`
    jitter        steps and saves with Gaussian jitter (sd `jitter` of the mean)
    heavy-tail    log-normal steps (sigma `tail_sigma`, same mean): rare steps far beyond any seen
    slow-first    the first step is `warmup` x longer (compilation, warm-up)
    validation    every `val_every`-th step also validates: `val_factor` x a step longer
    big-save      saves of 2-6 minutes (a 7B-class model with optimizer state), one size per run
    save-drift    saves grow over the run, by `save_drift` x `save_s` at the deadline
    moving        the deadline is renewed mid-run, then an early spot notice gives `notice` s;
                  the policies hear of each `learn_delay` s after it is announced

In every family the deadline is drawn in [0.9, 1.1] x `horizon` (so it falls anywhere within a
step), and reclamation comes `early` seconds before the deadline, an offset no policy knows:
0 in most runs, up to `early_max` in a fraction `early_prob` of them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Params:
    horizon_s: float = 3600.0
    step_s: float = 60.0
    save_s: float = 60.0
    jitter: float = 0.10
    tail_sigma: float = 0.5
    warmup: tuple[float, float] = (5.0, 10.0)
    val_every: int = 10
    val_factor: float = 3.0
    big_save_s: tuple[float, float] = (120.0, 360.0)
    save_drift: float = 1.0
    renewal_s: float = 3600.0
    notice_s: tuple[float, float] = (120.0, 300.0)
    learn_delay_s: float = 0.0  # how late the policies hear of a renewal or a notice (polling)
    early_prob: float = 0.1
    early_max_s: float = 120.0


@dataclass(frozen=True)
class DeadlineChange:
    at: float  # when the policies learn it
    deadline: float


@dataclass(frozen=True)
class Scenario:
    """One run: step k (1-based) takes steps[k-1]; a save at its boundary takes saves[k-1]."""

    family: str
    steps: list[float]
    saves: list[float]
    deadline: float  # known at time 0
    reclaim_at: float  # when the capacity really goes (the last deadline minus the offset)
    changes: list[DeadlineChange] = field(default_factory=list)

    def boundaries(self) -> list[float]:
        """End of every step on the training clock (no saves in between): the progress made."""
        out, total = [], 0.0
        for duration in self.steps:
            total += duration
            out.append(total)
        return out


def _positive(value: float, floor: float) -> float:
    return max(value, floor)


def _fill(until: float, step: Callable[[int], float], save: Callable[[int, float], float],
          ) -> tuple[list[float], list[float]]:
    """Steps until their sum passes `until` (no policy can get further), with each one's save."""
    steps: list[float] = []
    saves: list[float] = []
    progress = 0.0
    while progress <= until:
        k = len(steps) + 1
        duration = step(k)
        progress += duration
        steps.append(duration)
        saves.append(save(k, progress))
    return steps, saves


def _early(rng: random.Random, p: Params) -> float:
    return rng.uniform(0.0, p.early_max_s) if rng.random() < p.early_prob else 0.0


def _scenario(family: str, rng: random.Random, p: Params, step: Callable[[int], float],
              save: Callable[[int, float], float]) -> Scenario:
    deadline = p.horizon_s * rng.uniform(0.9, 1.1)
    reclaim_at = deadline - _early(rng, p)
    steps, saves = _fill(reclaim_at, step, save)
    return Scenario(family, steps, saves, deadline, reclaim_at)


def constant(rng: random.Random, p: Params) -> Scenario:
    return _scenario("constant", rng, p, lambda k: p.step_s, lambda k, at: p.save_s)


def jitter(rng: random.Random, p: Params) -> Scenario:
    floor_step, floor_save = 0.1 * p.step_s, 0.1 * p.save_s
    return _scenario(
        "jitter", rng, p,
        lambda k: _positive(rng.gauss(p.step_s, p.jitter * p.step_s), floor_step),
        lambda k, at: _positive(rng.gauss(p.save_s, p.jitter * p.save_s), floor_save),
    )


def heavy_tail(rng: random.Random, p: Params) -> Scenario:
    mu = math.log(p.step_s) - p.tail_sigma**2 / 2  # keeps the mean at step_s
    return _scenario("heavy-tail", rng, p, lambda k: rng.lognormvariate(mu, p.tail_sigma),
                     lambda k, at: p.save_s)


def slow_first(rng: random.Random, p: Params) -> Scenario:
    factor = rng.uniform(*p.warmup)
    return _scenario("slow-first", rng, p, lambda k: p.step_s * (factor if k == 1 else 1.0),
                     lambda k, at: p.save_s)


def validation(rng: random.Random, p: Params) -> Scenario:
    extra = p.val_factor * p.step_s
    return _scenario("validation", rng, p,
                     lambda k: p.step_s + (extra if k % p.val_every == 0 else 0.0),
                     lambda k, at: p.save_s)


def big_save(rng: random.Random, p: Params) -> Scenario:
    size = rng.uniform(*p.big_save_s)
    return _scenario("big-save", rng, p, lambda k: p.step_s, lambda k, at: size)


def save_drift(rng: random.Random, p: Params) -> Scenario:
    return _scenario("save-drift", rng, p, lambda k: p.step_s,
                     lambda k, at: p.save_s * (1.0 + p.save_drift * at / p.horizon_s))


def moving(rng: random.Random, p: Params) -> Scenario:
    """Renewed at 30-60 % of the first deadline; then a spot notice reclaims it early."""
    first = p.horizon_s * rng.uniform(0.9, 1.1)
    renewed_at = first * rng.uniform(0.3, 0.6)
    renewed = first + p.renewal_s
    notice = rng.uniform(*p.notice_s)
    noticed_at = rng.uniform(first, renewed - notice)
    final = noticed_at + notice
    reclaim_at = final - _early(rng, p)
    steps, saves = _fill(reclaim_at, lambda k: p.step_s, lambda k, at: p.save_s)
    delay = p.learn_delay_s
    changes = [DeadlineChange(renewed_at + delay, renewed), DeadlineChange(noticed_at + delay, final)]
    return Scenario("moving", steps, saves, first, reclaim_at, changes)


FAMILIES: dict[str, Callable[[random.Random, Params], Scenario]] = {
    "constant": constant,
    "jitter": jitter,
    "heavy-tail": heavy_tail,
    "slow-first": slow_first,
    "validation": validation,
    "big-save": big_save,
    "save-drift": save_drift,
    "moving": moving,
}


def generate(family: str, run: int, seed: int, params: Params) -> Scenario:
    """The `run`-th scenario of a family: the same for every policy and every invocation."""
    rng = random.Random(f"{seed}:{family}:{run}")
    return FAMILIES[family](rng, params)
