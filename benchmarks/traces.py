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

and combinations and new shapes of run:

    save-freq     the trainer also saves on its own every `save_freq` steps (verl's save_freq)
    async         asynchronous saves: training stops for `async_block` x the save (the
                  snapshot), the write goes on for the rest of it
    async-big     asynchronous saves of 2-6 minutes
    resumed       constant, on a run that starts with the previous run's state file (the same
                  save, measured three times, and a window of steps)
    resumed-big   big-save, with the previous run's state file
    big-jitter    big-save with jittered steps and saves
    big-renewal   big-save; the deadline is renewed in its last ten minutes, around the
                  insurance save (which must then be taken again for the new deadline)
    big-moving    big-save with a renewal and then a spot notice, as in moving
    upload        constant, with `--upload`: each checkpoint is durable only once its upload ends,
                  and an upload takes `upload_factor` (3-6, one per run) x the save, +-10 %
    upload-big    big-save with uploads as in upload (6-36 minutes)
    upload-resumed  upload-big, on a run that starts with the previous run's state file (its saves
                  and uploads measured three times, within 5 % of this run's first)

and at real scale:

    huge-save     saves of 10-30 minutes (a 70B-class model with its optimizer state), one size a run
    huge-async    asynchronous saves of 10-30 minutes
    surprise-week constant, with interruptions that give no notice, one a week (Poisson), on
                  reserved capacity of 32 nodes (a job that large sees about that many node failures)
    surprise-day  the same, one a day, on 256 reserved nodes
    surprise-spot the same, at `spot_rate` a day, on one spot instance
    big-surprise-day   big-save with surprises one a day (256 reserved nodes)
    huge-surprise-week huge-save with surprises one a week (32 reserved nodes)

In every family the deadline is drawn in [0.9, 1.1] x `horizon` (so it falls anywhere within a
step), and reclamation comes `early` seconds before the deadline, an offset no policy knows:
0 in most runs, up to `early_max` in a fraction `early_prob` of them. A surprise interruption
that comes before that is the run's reclamation instead.

What a real run knows before its first save rides along with every trace (`with_knowledge`), from
random streams of its own, so the traces themselves are those of the first rounds: the
checkpoint's size and a storage probe whose error is log-normal (`prior_sigma`; `prior=False`
leaves both out), the kind of capacity the deadline source reports (reserved; spot for the families
with a spot notice) and the job's node count.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from esiwrap.core.values import CapacityKind
from esiwrap.tools.replay import DeadlineChange, Trace


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
    save_freq: int = 10
    async_block: float = 0.1
    huge_save_s: tuple[float, float] = (600.0, 1800.0)
    prior: bool = True  # the trainer reports its checkpoint's bytes and the storage is probed
    prior_sigma: float = 0.5  # log-normal error of that prior against the real save
    spot_rate: float = 8.0  # surprise-spot: interruptions a day on spot capacity (esiwrap's default)
    upload_factor: tuple[float, float] = (3.0, 6.0)


Scenario = Trace  # one run of a family: `esiwrap.tools.replay.Trace`
NOMINAL_BPS = 1e9  # the storage's real speed; only the ratio to the probe matters
WEEK_NODES, DAY_NODES = 32, 256  # reserved jobs that see about one node failure a week, a day


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


def moving(rng: random.Random, p: Params, save: float | None = None) -> Scenario:
    """Renewed at 30-60 % of the first deadline; then a spot notice reclaims it early."""
    first = p.horizon_s * rng.uniform(0.9, 1.1)
    renewed_at = first * rng.uniform(0.3, 0.6)
    renewed = first + p.renewal_s
    notice = rng.uniform(*p.notice_s)
    noticed_at = rng.uniform(first, renewed - notice)
    final = noticed_at + notice
    reclaim_at = final - _early(rng, p)
    save_s = p.save_s if save is None else save
    steps, saves = _fill(reclaim_at, lambda k: p.step_s, lambda k, at: save_s)
    delay = p.learn_delay_s
    changes = [DeadlineChange(renewed_at + delay, renewed), DeadlineChange(noticed_at + delay, final)]
    return Scenario("moving", steps, saves, first, reclaim_at, changes)


def save_freq(rng: random.Random, p: Params) -> Scenario:
    base = _scenario("save-freq", rng, p, lambda k: p.step_s, lambda k, at: p.save_s)
    return replace(base, own_save_every=p.save_freq)


def _asynchronous(base: Scenario, family: str, p: Params) -> Scenario:
    return replace(base, family=family, blocking=[p.async_block * s for s in base.saves])


def async_saves(rng: random.Random, p: Params) -> Scenario:
    return _asynchronous(constant(rng, p), "async", p)


def async_big(rng: random.Random, p: Params) -> Scenario:
    return _asynchronous(big_save(rng, p), "async-big", p)


def _with_state_file(base: Scenario, family: str, rng: random.Random, p: Params) -> Scenario:
    """The same job resumed: the previous run measured its saves (three, within 5 % of this run's
    first) and a window of steps, and left them in the state file."""
    size = base.saves[0]
    prior_saves = tuple(size * rng.uniform(0.95, 1.05) for _ in range(3))
    prior_steps = tuple(_positive(rng.gauss(p.step_s, p.jitter * p.step_s), 0.1 * p.step_s)
                        for _ in range(20))
    return replace(base, family=family, prior_steps=prior_steps, prior_saves=prior_saves)


def resumed(rng: random.Random, p: Params) -> Scenario:
    return _with_state_file(constant(rng, p), "resumed", rng, p)


def resumed_big(rng: random.Random, p: Params) -> Scenario:
    return _with_state_file(big_save(rng, p), "resumed-big", rng, p)


def big_jitter(rng: random.Random, p: Params) -> Scenario:
    size = rng.uniform(*p.big_save_s)
    return _scenario(
        "big-jitter", rng, p,
        lambda k: _positive(rng.gauss(p.step_s, p.jitter * p.step_s), 0.1 * p.step_s),
        lambda k, at: _positive(rng.gauss(size, p.jitter * size), 0.1 * size),
    )


def big_renewal(rng: random.Random, p: Params) -> Scenario:
    """Big saves; the deadline is renewed (+`renewal`) in its last ten minutes, when the insurance
    save for it is due or done, and then holds."""
    size = rng.uniform(*p.big_save_s)
    first = p.horizon_s * rng.uniform(0.9, 1.1)
    renewed_at = first - rng.uniform(60.0, 600.0)
    renewed = first + p.renewal_s
    reclaim_at = renewed - _early(rng, p)
    steps, saves = _fill(reclaim_at, lambda k: p.step_s, lambda k, at: size)
    changes = [DeadlineChange(renewed_at + p.learn_delay_s, renewed)]
    return Scenario("big-renewal", steps, saves, first, reclaim_at, changes)


def big_moving(rng: random.Random, p: Params) -> Scenario:
    size = rng.uniform(*p.big_save_s)
    return replace(moving(rng, p, save=size), family="big-moving")


def huge_save(rng: random.Random, p: Params) -> Scenario:
    size = rng.uniform(*p.huge_save_s)
    return _scenario("huge-save", rng, p, lambda k: p.step_s, lambda k, at: size)


def huge_async(rng: random.Random, p: Params) -> Scenario:
    return _asynchronous(huge_save(rng, p), "huge-async", p)


def _surprised(base: Scenario, family: str, rng: random.Random, rate_per_day: float,
               capacity: CapacityKind, nodes: int) -> Scenario:
    """Interruptions with no notice at `rate_per_day` (Poisson): the first one that comes before
    the reclamation of the known deadline is the run's end."""
    first = rng.expovariate(rate_per_day / 86_400.0) if rate_per_day > 0 else math.inf
    return replace(base, family=family, reclaim_at=min(base.reclaim_at, first), capacity=capacity,
                   nodes=nodes, surprise_rate_per_day=rate_per_day, surprised=first < base.reclaim_at)


def surprise_week(rng: random.Random, p: Params) -> Scenario:
    return _surprised(constant(rng, p), "surprise-week", rng, 1.0 / 7.0, "reserved", WEEK_NODES)


def surprise_day(rng: random.Random, p: Params) -> Scenario:
    return _surprised(constant(rng, p), "surprise-day", rng, 1.0, "reserved", DAY_NODES)


def surprise_spot(rng: random.Random, p: Params) -> Scenario:
    return _surprised(constant(rng, p), "surprise-spot", rng, p.spot_rate, "spot", 1)


def big_surprise_day(rng: random.Random, p: Params) -> Scenario:
    return _surprised(big_save(rng, p), "big-surprise-day", rng, 1.0, "reserved", DAY_NODES)


def huge_surprise_week(rng: random.Random, p: Params) -> Scenario:
    return _surprised(huge_save(rng, p), "huge-surprise-week", rng, 1.0 / 7.0, "reserved", WEEK_NODES)


def _with_uploads(base: Scenario, family: str, rng: random.Random, p: Params) -> Scenario:
    """The same run with `--upload`: a checkpoint's upload takes a few times its save."""
    factor = rng.uniform(*p.upload_factor)
    uploads = [_positive(rng.gauss(factor * s, p.jitter * factor * s), 0.1 * s) for s in base.saves]
    return replace(base, family=family, uploads=uploads)


def upload(rng: random.Random, p: Params) -> Scenario:
    return _with_uploads(constant(rng, p), "upload", rng, p)


def upload_big(rng: random.Random, p: Params) -> Scenario:
    return _with_uploads(big_save(rng, p), "upload-big", rng, p)


def upload_resumed(rng: random.Random, p: Params) -> Scenario:
    base = _with_state_file(upload_big(rng, p), "upload-resumed", rng, p)
    assert base.uploads is not None
    prior = tuple(base.uploads[0] * rng.uniform(0.95, 1.05) for _ in range(3))
    return replace(base, prior_uploads=prior)


FAMILIES: dict[str, Callable[[random.Random, Params], Scenario]] = {
    "constant": constant,
    "jitter": jitter,
    "heavy-tail": heavy_tail,
    "slow-first": slow_first,
    "validation": validation,
    "big-save": big_save,
    "save-drift": save_drift,
    "moving": moving,
    "save-freq": save_freq,
    "async": async_saves,
    "async-big": async_big,
    "resumed": resumed,
    "resumed-big": resumed_big,
    "big-jitter": big_jitter,
    "big-renewal": big_renewal,
    "big-moving": big_moving,
    "huge-save": huge_save,
    "huge-async": huge_async,
    "surprise-week": surprise_week,
    "surprise-day": surprise_day,
    "surprise-spot": surprise_spot,
    "big-surprise-day": big_surprise_day,
    "huge-surprise-week": huge_surprise_week,
    "upload": upload,
    "upload-big": upload_big,
    "upload-resumed": upload_resumed,
}
SPOT_FAMILIES = frozenset({"moving", "big-moving"})  # a spot notice: the capacity is spot
SURPRISE_FAMILIES = frozenset(f for f in FAMILIES if "surprise" in f)


def with_knowledge(scenario: Scenario, rng: random.Random, p: Params) -> Scenario:
    """What a real run would know before its first save: the capacity's kind (unless the family set
    it) and, with `prior`, the checkpoint's bytes and a probe of the storage with its error."""
    capacity = scenario.capacity or ("spot" if scenario.family in SPOT_FAMILIES else "reserved")
    # a spot notice's source watches for it from the start, and promises its shortest notice
    notice = p.notice_s[0] if scenario.family in SPOT_FAMILIES else None
    if not p.prior:
        return replace(scenario, capacity=capacity, notice_s=notice)
    error = math.exp(rng.gauss(0.0, p.prior_sigma))  # prior / real save
    return replace(scenario, capacity=capacity, notice_s=notice,
                   checkpoint_bytes=scenario.saves[0] * NOMINAL_BPS, probe_bps=NOMINAL_BPS / error)


def generate(family: str, run: int, seed: int, params: Params) -> Scenario:
    """The `run`-th scenario of a family: the same for every policy and every invocation."""
    rng = random.Random(f"{seed}:{family}:{run}")
    scenario = FAMILIES[family](rng, params)
    return with_knowledge(scenario, random.Random(f"{seed}:{family}:{run}:prior"), params)
