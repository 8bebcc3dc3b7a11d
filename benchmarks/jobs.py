"""Jobs: N consecutive runs that share one state file (`simulate.py --job-runs N`).

A job is what a user really runs on capacity that is taken away: run after run, each resuming
from the last durable checkpoint, each one starting from the state file the runs before it left
(their measured steps and saves, and their history: exposure and how each ended). The pools'
true interruption rates differ from esiwrap's defaults, so the question is how fast esiwrap learns
the job's own rate from its history (`esiwrap.core.history`), run by run, against the reference policy
that knows the true rate from the start:

    calm-spot     a calm spot pool: 0.05 interruptions a day (esiwrap's default for spot: 8)
    stormy-spot   a stormy spot pool, 15 a day on average, in bursts: storms of 40 a day (mean
                  6 h) between lulls of 5 a day (mean 15 h)
    reserved-256  reserved capacity of 256 nodes on a flaky cluster: one node failure in 88
                  node-days (3 x esiwrap's default of one in 264), about 2.9 a day for the job
    short-slots   slots of 90-110 s, shorter than a step plus a save (60 s + 60 s): no run can
                  make progress; the no-progress guard should stop the job at run N + 1
    (every job family but short-slots also checks that the guard never stops a job that progresses)

Each run is `constant` (steps and saves of 60 s) with a deadline at the horizon (±10 %),
reclamation early in 10 % of runs by up to 120 s, and the pool's interruptions without notice: the
first one before the deadline ends the run. The next run starts 5 minutes later on the pool's
clock (the storms go on meanwhile).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from traces import NOMINAL_BPS, Params, Scenario, constant

from esiwrap.core.state import JobState
from esiwrap.core.values import CapacityKind
from esiwrap.tools.replay import Outcome

RESTART_GAP_S = 300.0
JOB_START = 1_800_000_000.0  # the job's clock (wall time) at its first run
STORM_RATE, LULL_RATE = 40.0, 5.0  # a day: the stormy pool's two states (mean 15 a day)
STORM_MEAN_S, LULL_MEAN_S = 6 * 3600.0, 15 * 3600.0
FLAKY_NODE_RATE = 1.0 / 88.0  # node failures a node-day on the flaky reserved cluster


@dataclass(frozen=True)
class JobFamily:
    capacity: CapacityKind
    nodes: int
    mean_rate_per_day: float  # the job's true rate (all nodes), what the reference knows
    bursty: bool = False
    slot_s: float | None = None  # a fixed slot instead of the horizon (short-slots)


JOB_FAMILIES: dict[str, JobFamily] = {
    "calm-spot": JobFamily("spot", 1, 0.05),
    "stormy-spot": JobFamily("spot", 1, 15.0, bursty=True),
    "reserved-256": JobFamily("reserved", 256, 256 * FLAKY_NODE_RATE),
    "short-slots": JobFamily("reserved", 1, 0.0, slot_s=100.0),
}


class Pool:
    """The pool's interruptions without notice, on its own clock: a Poisson process, or for a
    bursty pool one whose rate switches between storms and lulls (a Markov-modulated process)."""

    def __init__(self, family: JobFamily, rng: random.Random, start: float) -> None:
        self.family, self.rng = family, rng
        self.storm = bursty_start(rng) if family.bursty else False
        self.switch_at = start + self._dwell() if family.bursty else math.inf

    def _dwell(self) -> float:
        return self.rng.expovariate(1.0 / (STORM_MEAN_S if self.storm else LULL_MEAN_S))

    def rate_per_s(self) -> float:
        if not self.family.bursty:
            return self.family.mean_rate_per_day / 86_400.0
        return (STORM_RATE if self.storm else LULL_RATE) / 86_400.0

    def next_interruption(self, start: float, until: float) -> float | None:
        """The first interruption in [start, until) on the pool's clock, or None."""
        now = start
        while now < until:
            while self.switch_at <= now:
                self.storm = not self.storm
                self.switch_at += self._dwell()
            end = min(until, self.switch_at)
            rate = self.rate_per_s()
            if rate > 0:
                at = now + self.rng.expovariate(rate)
                if at < end:
                    return at
            now = end
        return None


def bursty_start(rng: random.Random) -> bool:
    return rng.random() < STORM_MEAN_S / (STORM_MEAN_S + LULL_MEAN_S)


@dataclass(frozen=True)
class JobRun:
    """One run of a job, as each policy played it."""

    index: int  # 1-based
    lost: dict[str, float]  # policy -> work lost (a run with no save counted whole)
    stopped: bool  # the no-progress guard stopped this run before it started
    surprised: bool


def play_job(name: str, job: int, runs: int, seed: int, params: Params, horizon_s: float,
             runners: dict[str, Callable[[Scenario], Outcome]]) -> list[JobRun]:
    """A job of `runs` runs: every policy plays the same runs. esiwrap's runs share a state file,
    as `--state-file` does: each starts from the state the run before it left (`Outcome.state`,
    decided by the core's job part: its measurements, its history, its durable checkpoint, from
    whose step it resumes), and the no-progress guard may keep it from starting; then no policy
    plays that run."""
    family = JOB_FAMILIES[name]
    rng = random.Random(f"{seed}:job:{name}:{job}:{horizon_s}")
    clock = JOB_START
    pool = Pool(family, random.Random(f"{seed}:pool:{name}:{job}:{horizon_s}"), clock)
    state: JobState | None = None  # no state file yet: the job's first run
    out: list[JobRun] = []
    for index in range(1, runs + 1):
        slot = family.slot_s if family.slot_s is not None else horizon_s
        at = replace(params, horizon_s=slot) if family.slot_s is None else \
            replace(params, horizon_s=slot, early_prob=0.0)  # a slot of 90-110 s, never cut shorter
        base = constant(rng, at)
        surprise = pool.next_interruption(clock, clock + base.reclaim_at)
        surprised = surprise is not None
        reclaim = (surprise - clock) if surprise is not None else base.reclaim_at
        scenario = replace(
            base, family=name, reclaim_at=reclaim, surprised=surprised, capacity=family.capacity,
            nodes=family.nodes, surprise_rate_per_day=family.mean_rate_per_day,
            checkpoint_bytes=base.saves[0] * NOMINAL_BPS, probe_bps=NOMINAL_BPS / math.exp(rng.gauss(0, 0.5)),
        )
        resumed = state.checkpoint.step if state is not None and state.checkpoint is not None else 0
        own = replace(scenario, job=state, prior_runs_at=clock, run_id=f"{job}-{index}", start_step=resumed)
        lost: dict[str, float] = {}
        stopped = False
        for policy, runner in runners.items():
            if policy.startswith("esiwrap"):
                outcome = runner(own)
                if policy == "esiwrap":
                    assert outcome.state is not None
                    state, stopped = outcome.state, outcome.not_started
            else:
                outcome = runner(scenario)
            lost[policy] = outcome.lost_s
        out.append(JobRun(index, {} if stopped else lost, stopped, surprised))
        clock += reclaim + RESTART_GAP_S  # the slot passes on the pool's clock, used or not
    return out
