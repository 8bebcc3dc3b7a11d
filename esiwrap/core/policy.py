"""When to ask for a checkpoint: pure functions of what was observed; time is always an argument.

The rule for a save that must land before the deadline (verl's, with measured inputs):

    signal_at = deadline - (step_estimate + save_estimate + reserve)

A signal at `signal_at` becomes a save at the trainer's next step boundary, which comes at most one
step later; the save then takes `save_estimate`; `reserve` is slack (`--redundant-time` for the
insurance save, `--final-margin` for the saves after it).

Four kinds of save, in the order a run meets them:

* calibration: nothing measured yet and the deadline is hours away (more than
  CALIBRATION_HORIZON_FACTOR unmeasured saves, and an hour): one save now, so that no later decision rests on
  a guess. It is a real checkpoint of the early work.
* periodic: a checkpoint cadence that bounds the work at risk from an interruption that comes
  with less warning than a step plus a save (a spot notice after a renewal, a failed node).
  Young/Daly's interval, sqrt(2 x save cost / rate), for `--interruption-rate` interruptions a
  day, or, by default, the rate of the capacity the sources describe (`interruption_rate`: spot,
  a reservation with a known end, nothing known); skipped when the insurance save comes within
  half an interval anyway.
* insurance: the save that must not fail. Planned with the high step quantile, the longest
  measured save (growth-aware) x SAVE_SAFETY_FACTOR and `--redundant-time`; before any save has
  been measured, with the prior (the checkpoint's bytes / the storage's probed bandwidth) x
  `prior_margin`, the margin that covers the prior's error; with no prior, `--save-duration` x
  `--unmeasured-factor`: it never bets the run on a guess.
* final: after the insurance save, the last boundary that still fits, with the median step, the
  measured save x FINAL_SAVE_FACTOR and `--final-margin`. A final save that lands late loses
  nothing: the insurance checkpoint is complete.

Save estimates are growth-aware: with two or more saves measured in this run, the trend of their
durations is extrapolated to the moment the planned save would run, and the estimate is the larger
of that and the longest save seen. Saves may be asynchronous: the blocking part (the snapshot)
stops training, the durable part is what must end before the deadline.

With `--upload`, a checkpoint is durable only once its upload has completed: the upload is the last
part of the durable end, so a plan counts the save's durable estimate plus `upload_estimate_s`
(measured uploads, else `--upload-duration`, with the insurance save's margins for every kind).
One upload runs at a time; a save after the insurance save is planned only where its upload,
started after the one running, still ends before the deadline.

A checkpoint counts once it is verified (the built-in check of its metadata, and `--verify`'s
command): the verification comes between the save and its upload, so the durable end is
save + verify + upload (`verify_estimate_s`: the longest measured verification x
VERIFY_SAFETY_FACTOR; before one is measured, nothing for the built-in check, which reads
metadata in milliseconds, and `--verify-duration` x `--unmeasured-factor` for a `--verify`
command, whose time esiwrap cannot know).

The supervisor's controller and `benchmarks/simulate.py` both drive this module; nothing here
reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from esiwrap.core.history import (
    PRIOR_INTERRUPTIONS,
    Evidence,
    RunRecord,
    evidence,
    posterior_rate,
    rate_basis,
)
from esiwrap.core.values import CapacityKind

SAVE_SAFETY_FACTOR = 1.25  # insurance: checkpoint writes vary with disk and page cache
UPLOAD_SAFETY_FACTOR = 1.5  # uploads cross a shared network: their times vary more than writes
VERIFY_SAFETY_FACTOR = 1.5  # a verification reads metadata: a cold page cache makes it slower
# A verification that runs this long (and VERIFY_TIMEOUT_FACTOR x its estimate) is given up: a
# built-in check stuck on a dead mount, a --verify command that hangs. Its checkpoint does not count.
VERIFY_TIMEOUT_MIN_S = 60.0
VERIFY_TIMEOUT_FACTOR = 10.0
FINAL_SAVE_FACTOR = 1.05  # final saves: a late one loses nothing, so aim closer
FINAL_STEP_QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.99, 1.0)  # the candidates for a final save's step
FINAL_OWN_STEPS = 20  # a final save plans with this run's own steps once it has this many
# The insurance save is taken by its value: where the chance that the final save fails (the end
# comes early, an interruption in between) times the work it protects exceeds its cost. A deadline
# is taken away early (clock skew, a cloud that starts early) about this often: the simulator's
# traces, and the one-in-ten that keeps the earlier rule (protect 10x the cost) where nothing else
# threatens the final save.
EARLY_END_PROB = 0.1
INSURANCE_WORTH_FACTOR = 1.0 / EARLY_END_PROB  # with no interruptions: protect 10x its cost
CALIBRATION_HORIZON_FACTOR = 20.0  # calibrate when the deadline is this many unmeasured saves away
CALIBRATION_MIN_HORIZON_S = 3600.0  # ...and at least an hour away
# An unmeasured upload is measured by a save at once where the insurance save is further away than
# this (and than that save and its guessed upload): closer, the insurance save is the first anyway.
UPLOAD_CALIBRATION_MIN_S = 600.0
# No periodic save when the insurance save comes within this x interval: a periodic save `gap`
# before it saves `interval` of work for each interruption in that gap, so it pays for itself when
# rate x gap x interval > its cost; with Young/Daly's interval (cost = rate x interval^2 / 2) that
# is gap > interval / 2.
PERIODIC_SKIP_FRACTION = 0.5
SECONDS_PER_DAY = 86_400.0
RESCHEDULE_LOG_THRESHOLD_S = 5.0
# esiwrap's own lateness on a busy node: how late the loop woke for its timers, and how long the
# trainer's reports took to reach it. The plan's margin takes the worst of the recent ones of each
# (a save's signal goes out late by the one, its acknowledgement arrives late by the other).
LATENESS_WINDOW = 50
LATENESS_KEPT = 1000  # ...and this many of the run's, for people (p50, p99)

# The prior: a save of B bytes to storage probed at W bytes/s takes about B / W. How far off that
# is was measured (BENCHMARKS.md: torch.save of a few GB against the probe on this machine) and is
# modelled as log-normal; the insurance save covers it up to PRIOR_COVER_Z sigmas.
PRIOR_ERROR_SIGMA = 0.5
PRIOR_COVER_Z = 3.5  # one save in 4000 longer than the margin, before --redundant-time
PRIOR_FLOOR_S = 1.0  # a checkpoint is also opened, serialized, fsync'd and renamed: never less

# Interruptions with no usable warning, a day, by the kind of capacity (README, "How the moment is
# chosen"): spot capacity is taken back whenever the cloud needs it; reserved and on-demand capacity
# only fails (hardware, host maintenance), at a rate per node; nothing known: one a day.
SPOT_RATE_PER_DAY = 8.0  # per instance: GPU spot capacity goes back within hours
NODE_FAILURE_RATE_PER_DAY = 1.0 / 264.0  # per node: 419 unexpected interruptions in 54 days on 2048 nodes
UNKNOWN_RATE_PER_DAY = 1.0
# A spot source that watches for the cloud's notice (aws-spot: 2 minutes, volcengine-spot: 5) turns
# most interruptions into deadlines: only those whose notice is too short for the rest of a step plus
# a save need a periodic save (`unwarned_share`). Every cloud calls its notice best effort and none
# publishes how often it fails: one in twenty is assumed to come without it, or too late.
NOTICE_MISSED_SHARE = 0.05

SaveKind = Literal["calibration", "periodic", "insurance", "final"]


@dataclass(frozen=True)
class PolicyConfig:
    redundant_s: float = 120.0
    save_duration_s: float = 60.0  # what a save is expected to take until one is measured
    unmeasured_factor: float = 6.0  # the insurance save's margin on that guess, until measured
    step_window: int = 100
    step_quantile: float = 0.99  # 1.0 is the maximum (`--step-quantile max`)
    final_save: bool = True
    final_margin_s: float = 5.0
    interruption_rate_per_day: float | None = None  # the cadence's assumption; None: by capacity; 0: off
    prior_sigma: float = PRIOR_ERROR_SIGMA  # the log-normal error of a save predicted from its size
    save_safety_factor: float = SAVE_SAFETY_FACTOR
    final_save_factor: float = FINAL_SAVE_FACTOR
    uploads: bool = False  # `--upload`: a checkpoint is durable once its upload completed
    upload_duration_s: float = 60.0  # what an upload is expected to take until one is measured
    verify: bool = False  # a checkpoint counts once verified (built-in check, `--verify`)
    verify_duration_s: float = 10.0  # what a --verify command is expected to take until one is measured
    verify_command: bool = False  # `--verify CMD`: its time is a guess (x unmeasured_factor)


@dataclass(frozen=True)
class Prior:
    """What earlier runs of this job measured (the state file): step intervals and save durations."""

    steps: Sequence[float] = ()
    saves: Sequence[float] = ()
    blocking: Sequence[float] = ()  # the blocking part of asynchronous saves
    uploads: Sequence[float] = ()  # `--upload`: how long the uploads of checkpoints took
    runs: Sequence[RunRecord] = ()  # the job's earlier runs (`esiwrap.core.history`), ended
    runs_at: float = 0.0  # when this run started: the runs' ages count from it
    verifies: Sequence[float] = ()  # how long the verifications of checkpoints took
    restores: Sequence[float] = ()  # `--restore`: how long bringing a checkpoint back took


@dataclass(frozen=True)
class Capacity:
    """What the deadline sources said about the capacity: its kind, and how many nodes the job
    spans (a job is interrupted when any one of them is)."""

    kind: CapacityKind | None = None
    nodes: int = 1
    source: str = ""  # which source said so, for the `why`
    notice_s: float | None = None  # the warning a source watches for on every node, before the capacity goes


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (never interpolates below an observed value); q=1 is the maximum."""
    if not values:
        msg = "quantile of no values"
        raise ValueError(msg)
    return sorted_quantile(sorted(values), q)


def sorted_quantile(ordered: Sequence[float], q: float) -> float:
    """`quantile` of values already in ascending order."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class Delays:
    """How late one kind of thing came: the recent ones (for the plan's margin) and the run's (for
    people), bounded."""

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=LATENESS_WINDOW)
        self.kept: deque[float] = deque(maxlen=LATENESS_KEPT)
        self.count = 0
        self.max_s = 0.0

    def record(self, late_s: float) -> None:
        late = max(0.0, late_s)
        self.recent.append(late)
        self.kept.append(late)
        self.count += 1
        self.max_s = max(self.max_s, late)

    @property
    def recent_max_s(self) -> float:
        return max(self.recent, default=0.0)

    def quantile_s(self, q: float) -> float | None:
        """The q-quantile of the run's kept delays, None before the first."""
        return quantile(self.kept, q) if self.kept else None


class Observations:
    """What the trainer has told the supervisor so far; updated only from arguments."""

    def __init__(self, step_window: int, prior: Prior | None = None) -> None:
        self.intervals: deque[float] = deque(maxlen=step_window)
        self.saves: list[tuple[float, float]] = []  # (wall time it ended, durable duration), this run
        self.prior = prior or Prior()
        self.blocking: list[float] = []  # how long each save esiwrap asked for stopped training
        self.last_step: int | None = None
        self.own_intervals = 0  # intervals of this run in the window (the rest: the state file's)
        self.step_started_at: float | None = None  # wall time the running step began
        self.checkpoint_at: float | None = None  # wall time of the boundary the last checkpoint holds
        self.checkpoint_bytes: float | None = None  # how much a checkpoint writes, as the trainer said
        self.bandwidth_bps: float | None = None  # how fast the checkpoint's storage takes writes
        self.bandwidth_source = ""  # "probe", or "previous checkpoint": what measured it
        self.prior_pending = False  # a storage probe is under way: the prior is coming
        self.capacity = Capacity()
        self.uploads: list[float] = []  # durations of this run's completed uploads
        self.upload_started_at: float | None = None  # wall time the running upload began
        self.verifies: list[float] = []  # durations of this run's verifications that ended
        self.restores: list[float] = []  # ...and of its restore (`--restore`), when one came back
        self.timer_late = Delays()  # how late the supervisor's loop woke for its timers
        self.report_delay = Delays()  # how long the trainer's reports took to reach the supervisor
        self._exclude_next_s = 0.0
        self.intervals.extend(self.prior.steps)
        self._sorted: list[float] | None = None  # the window sorted, until the next step
        # kept as saves are recorded (only ever appended): every plan reads them
        self._longest_save: float | None = max(self.prior.saves, default=None)
        self._longest_blocking: float | None = max(self.prior.blocking, default=None)
        self._longest_upload: float | None = max(self.prior.uploads, default=None)
        self._longest_verify: float | None = max(self.prior.verifies, default=None)

    def sorted_intervals(self) -> list[float]:
        """The window in ascending order (computed once per step: every plan reads it)."""
        if self._sorted is None:
            self._sorted = sorted(self.intervals)
        return self._sorted

    @property
    def longest_upload_s(self) -> float | None:
        return self._longest_upload

    @property
    def longest_verify_s(self) -> float | None:
        return self._longest_verify

    @property
    def longest_restore_s(self) -> float | None:
        return max([*self.prior.restores, *self.restores], default=None)

    @property
    def longest_blocking_s(self) -> float | None:
        return self._longest_blocking

    @property
    def measured(self) -> bool:
        """A save duration was measured: in this run, or by an earlier one (the state file)."""
        return bool(self.saves or self.prior.saves)

    @property
    def longest_save_s(self) -> float | None:
        return self._longest_save

    @property
    def lateness_s(self) -> float:
        """What a plan adds to its margin for esiwrap's own lateness: the worst recent wake-up of
        the loop plus the worst recent report delivery (0 where nothing was late, as in the
        simulator)."""
        return self.timer_late.recent_max_s + self.report_delay.recent_max_s

    def trainer_started(self, at: float) -> None:
        """A trainer attached: its current step began no later than now; the work it resumed from
        is the checkpoint the run started with."""
        if self.step_started_at is None:
            self.step_started_at = at
        if self.checkpoint_at is None:
            self.checkpoint_at = at

    def record_step(self, step: int, duration_s: float, at: float) -> float:
        """A step boundary at `at`; returns the interval that entered the window."""
        interval = max(0.0, duration_s - self._exclude_next_s)
        self._exclude_next_s = 0.0
        self.intervals.append(interval)
        self.own_intervals = min(self.own_intervals + 1, self.intervals.maxlen or self.own_intervals + 1)
        self._sorted = None
        self.last_step = step
        self.step_started_at = at
        return interval

    def record_save(self, duration_s: float, at: float, began_at: float | None = None) -> None:
        """A completed save (the trainer's own ones too): it feeds the save estimate, and the
        boundary it was taken at is the latest checkpoint."""
        self.saves.append((at, duration_s))
        self._longest_save = max(duration_s, self._longest_save or duration_s)
        checkpoint = began_at if began_at is not None else at - duration_s
        self.checkpoint_at = max(checkpoint, self.checkpoint_at or checkpoint)

    def record_blocking(self, blocking_s: float, at: float) -> None:
        """A save esiwrap asked for stopped training for `blocking_s` (all of it for a synchronous
        save, the snapshot for an asynchronous one); training resumed at `at`.

        That time is counted in the save estimates, so it is taken out of the interval that holds
        it, and the running step is taken to begin when training resumed.
        """
        self.blocking.append(blocking_s)
        self._longest_blocking = max(blocking_s, self._longest_blocking or blocking_s)
        self._exclude_next_s += blocking_s
        self.step_started_at = at

    def upload_began(self, at: float) -> None:
        """An upload started at `at`: the next one cannot start before it ends."""
        self.upload_started_at = at

    def upload_ended(self, duration_s: float | None) -> None:
        """The running upload ended; `duration_s` when it completed (a measurement), else None."""
        self.upload_started_at = None
        if duration_s is not None:
            self.uploads.append(duration_s)
            self._longest_upload = max(duration_s, self._longest_upload or duration_s)

    def verify_ended(self, duration_s: float) -> None:
        """A verification ended (valid or not: its time was spent either way)."""
        self.verifies.append(duration_s)
        self._longest_verify = max(duration_s, self._longest_verify or duration_s)

    def restore_ended(self, duration_s: float) -> None:
        """The checkpoint came back (`--restore`), verified, in this long."""
        self.restores.append(duration_s)

    def checkpoint_lost(self, boundary_at: float | None) -> None:
        """The last checkpoint turned out invalid: the work at risk counts again from the boundary
        the newest valid one holds (or from the start)."""
        self.checkpoint_at = boundary_at

    def adopt_prior(self, prior: Prior) -> None:
        """An earlier run's measurements, found before this run measured anything (a manifest
        brought them back with the checkpoint)."""
        self.prior = prior
        self.intervals.clear()
        self.intervals.extend(prior.steps)
        self._sorted = None
        self._longest_save = max(prior.saves, default=None)
        self._longest_blocking = max(prior.blocking, default=None)
        self._longest_upload = max(prior.uploads, default=None)
        self._longest_verify = max(prior.verifies, default=None)

    def record_requested_save(self, duration_s: float, at: float, began_at: float | None = None) -> None:
        """A save esiwrap asked for was acknowledged at `at`; a synchronous one (no snapshot was
        reported) stopped training for all of it."""
        self.record_blocking(duration_s, at)
        self.record_save(duration_s, at, began_at)

    def checkpoint_size(self, checkpoint_bytes: float) -> None:
        """What the trainers say a checkpoint holds (all the saving processes together)."""
        self.checkpoint_bytes = checkpoint_bytes

    def checkpoint_size_if_unknown(self, checkpoint_bytes: float) -> None:
        """What the previous checkpoint holds, when no trainer said what one holds."""
        if self.checkpoint_bytes is None:
            self.checkpoint_bytes = checkpoint_bytes

    def probe_begun(self) -> None:
        """A storage probe is under way: the prior is coming (no calibration save on a guess)."""
        self.prior_pending = True

    def probe_ended(self) -> None:
        self.prior_pending = False

    def storage_measured(self, bandwidth_bps: float, source: str) -> None:
        """A measured write speed of the checkpoint's storage. Of two measurements the slower one
        rules (a probe is short, a checkpoint can outgrow caches); a source's new figure replaces
        its old one."""
        known = self.bandwidth_bps
        if known is None or bandwidth_bps < known or source == self.bandwidth_source:
            self.bandwidth_bps, self.bandwidth_source = bandwidth_bps, source

    def capacity_is(self, capacity: Capacity) -> None:
        """What the deadline sources and the trainers say of the capacity and the job's nodes."""
        self.capacity = capacity


def step_estimate_s(obs: Observations, config: PolicyConfig) -> float | None:
    """The quantile of the window, or None before the first interval is known."""
    return sorted_quantile(obs.sorted_intervals(), config.step_quantile) if obs.intervals else None


def final_step_estimate_s(obs: Observations, config: PolicyConfig, room_s: float) -> float | None:
    """The step a final save plans with, chosen for the most expected progress.

    Planning with the q-quantile of the window, the save lands in time with probability about q
    (the next step is no longer than that), and then holds about `room_s - step_q` more seconds of
    training than the last checkpoint, `room_s` being the time from that checkpoint to the latest
    moment the save may begin. The quantile that maximizes q x (room_s - step_q) wins: the median
    when the last checkpoint is recent (a late final save loses little), a higher quantile when it
    is far back. Never above `--step-quantile`.
    """
    if not obs.intervals:
        return None
    values = obs.sorted_intervals()
    if obs.own_intervals >= FINAL_OWN_STEPS and obs.own_intervals < len(obs.intervals):
        values = sorted(list(obs.intervals)[-obs.own_intervals:])  # this run's steps, not an earlier one's
    best: tuple[float, float] | None = None
    for q in FINAL_STEP_QUANTILES:
        if q > config.step_quantile and best is not None:
            break
        step = sorted_quantile(values, min(q, config.step_quantile))
        value = q * (room_s - step)
        if best is None or value > best[0]:
            best = (value, step)
    assert best is not None
    return best[1]


def prior_save_s(obs: Observations) -> float | None:
    """The save predicted from the checkpoint's size and the storage's speed, before any save was
    measured: bytes / bandwidth; None when either is unknown."""
    if not obs.checkpoint_bytes or not obs.bandwidth_bps:
        return None
    return max(PRIOR_FLOOR_S, obs.checkpoint_bytes / obs.bandwidth_bps)


def prior_margin(config: PolicyConfig) -> float:
    """What the prior is multiplied by for a save that must not fail: its error's upper tail."""
    return math.exp(config.prior_sigma * PRIOR_COVER_Z)


def unmeasured_save_s(obs: Observations, config: PolicyConfig) -> float:
    """What the insurance save assumes before any save was measured: the prior with its margin,
    else the guess (`--save-duration` x `--unmeasured-factor`)."""
    prior = prior_save_s(obs)
    if prior is not None:
        return prior * prior_margin(config)
    return config.save_duration_s * max(1.0, config.unmeasured_factor)


def calibration_horizon_s(obs: Observations, config: PolicyConfig) -> float | None:
    """How far away the deadline must be for a calibration save to pay for itself; None when no
    calibration is needed: a save was measured, or a prior plans the first one from knowledge, not a
    guess; with `--upload`, an upload was measured too (no prior predicts one)."""
    upload_guessed = config.uploads and obs.longest_upload_s is None
    save_known = obs.measured or prior_save_s(obs) is not None or obs.prior_pending
    if save_known and not upload_guessed:
        return None
    return max(CALIBRATION_MIN_HORIZON_S, CALIBRATION_HORIZON_FACTOR * unmeasured_save_s(obs, config))


def measured_save_s(obs: Observations, at: float | None = None) -> float | None:
    """The longest measured save, or the trend of this run's saves at `at` if that is longer."""
    longest = obs.longest_save_s
    if longest is None:
        return None
    trend = save_trend_s(obs.saves, at) if at is not None else None
    return max(longest, trend or 0.0)


def save_trend_s(saves: Sequence[tuple[float, float]], at: float) -> float | None:
    """Least-squares line through (end time, duration) of two or more saves, at `at`; None when
    the saves do not grow (a flat or falling trend adds nothing to the longest save seen)."""
    if len(saves) < 2:
        return None
    n = len(saves)
    mean_t = sum(t for t, _ in saves) / n
    mean_d = sum(d for _, d in saves) / n
    spread = sum((t - mean_t) ** 2 for t, _ in saves)
    if spread <= 0:
        return None
    slope = sum((t - mean_t) * (d - mean_d) for t, d in saves) / spread
    if slope <= 0:
        return None
    return mean_d + slope * (at - mean_t)


def save_estimate_s(obs: Observations, config: PolicyConfig, kind: SaveKind = "insurance",
                    at: float | None = None) -> float:
    """The durable save time a plan of this kind counts on, for a save around `at`."""
    measured = measured_save_s(obs, at)
    if measured is None:
        if kind == "insurance":
            return unmeasured_save_s(obs, config)
        prior = prior_save_s(obs)
        return prior if prior is not None else config.save_duration_s
    factor = config.final_save_factor if kind == "final" else config.save_safety_factor
    return measured * factor


def upload_estimate_s(obs: Observations, config: PolicyConfig) -> float:
    """What a checkpoint's upload adds to its durable end (0 without `--upload`): the longest
    measured upload x UPLOAD_SAFETY_FACTOR, else `--upload-duration` x `--unmeasured-factor`.
    Final saves get the same margin: a final save whose upload ends late is a checkpoint that
    never became durable (and exit 74 instead of 75), not one that merely came late."""
    if not config.uploads:
        return 0.0
    measured = obs.longest_upload_s
    if measured is None:
        return config.upload_duration_s * max(1.0, config.unmeasured_factor)
    return measured * UPLOAD_SAFETY_FACTOR


def verify_estimate_s(obs: Observations, config: PolicyConfig) -> float:
    """What a checkpoint's verification adds to its durable end (0 when nothing verifies): the
    longest measured x VERIFY_SAFETY_FACTOR; before one is measured, `--verify-duration` x
    `--unmeasured-factor` for a `--verify` command (it may load the whole checkpoint), and nothing
    for the built-in check alone: it reads metadata only, milliseconds on checkpoints of several
    GB (BENCHMARKS.md), well inside the save's own margin until the first one is measured."""
    if not config.verify:
        return 0.0
    measured = obs.longest_verify_s
    if measured is not None:
        return measured * VERIFY_SAFETY_FACTOR
    if not config.verify_command:
        return 0.0
    return config.verify_duration_s * max(1.0, config.unmeasured_factor)


def verify_timeout_s(obs: Observations, config: PolicyConfig) -> float:
    """How long a verification may run before it is given up (its checkpoint does not count)."""
    return max(VERIFY_TIMEOUT_MIN_S, VERIFY_TIMEOUT_FACTOR * verify_estimate_s(obs, config))


def restore_estimate_s(obs: Observations) -> float | None:
    """What bringing the checkpoint back is expected to take: the longest restore measured (this
    job's earlier runs) x UPLOAD_SAFETY_FACTOR (it crosses the same network), or None."""
    longest = obs.longest_restore_s
    return None if longest is None else longest * UPLOAD_SAFETY_FACTOR


RestoreBound = Literal["insurance", "final"]


def restore_bound(deadline: float, obs: Observations, config: PolicyConfig, now: float,
                  expected_s: float) -> RestoreBound:
    """Which save a restore that starts `now` must leave room for: the insurance save, when an
    attempt of `expected_s` still ends before its moment; else (a slot already short) a final
    save: the run then saves as soon as it can, as with any deadline too close for the
    insurance."""
    insurance = plan_save(deadline, obs, config, "insurance").nominal_at
    return "insurance" if now + expected_s < insurance else "final"


def restore_cutoff_at(deadline: float, obs: Observations, config: PolicyConfig,
                      bound: RestoreBound = "insurance") -> float:
    """The latest moment a restore may end: the `bound` save's signal, planned as if training had
    started (a step, then the save, its verification and upload, and the reserve before the
    deadline: `--redundant-time` for the insurance, `--final-margin` for a final save). A
    restore that ends later leaves a run that cannot save before the deadline. For a final
    save, what is not measured yet counts at its guess (`--save-duration`, `--upload-duration`),
    without the insurance's caution (`--unmeasured-factor`): this bound decides whether to try
    at all, and a restore not tried is a job that cannot go on."""
    if bound == "final":
        config = replace(config, unmeasured_factor=1.0)
    return plan_save(deadline, obs, config, bound).nominal_at


def upload_attempt_s(obs: Observations, config: PolicyConfig) -> float:
    """How long one more attempt of an upload is expected to take (does a retry still fit before
    the cut-off?): the longest upload that completed, in this run or an earlier one, else
    `--upload-duration`. No safety factor: a retry that ends late is cut off, never worse than
    not trying."""
    measured = obs.longest_upload_s
    return measured if measured is not None else config.upload_duration_s


def upload_busy_until(obs: Observations, config: PolicyConfig) -> float | None:
    """When the running upload is expected to end (the next one starts after it), or None."""
    if obs.upload_started_at is None:
        return None
    return obs.upload_started_at + upload_estimate_s(obs, config)


def save_cost_s(obs: Observations, config: PolicyConfig) -> float:
    """How long a save stops training: the longest blocking part seen, else the expected save."""
    if obs.longest_blocking_s is not None:
        return obs.longest_blocking_s
    if obs.longest_save_s is not None:
        return obs.longest_save_s
    prior = prior_save_s(obs)
    return prior if prior is not None else config.save_duration_s


def default_rate(kind: CapacityKind | None) -> float:
    """The capacity kind's interruptions a day without notice, per node (per job when unknown)."""
    if kind == "spot":
        return SPOT_RATE_PER_DAY
    if kind in ("reserved", "on-demand"):
        return NODE_FAILURE_RATE_PER_DAY
    return UNKNOWN_RATE_PER_DAY


def job_evidence(obs: Observations) -> Evidence:
    """This job's own interruptions and exposure on the capacity it runs on now (the state file)."""
    return evidence(obs.prior.runs, obs.capacity.kind, obs.prior.runs_at)


def interruption_rate(obs: Observations, config: PolicyConfig) -> tuple[float, str]:
    """Interruptions a day that periodic saves guard against, and what the figure rests on:
    `--interruption-rate`, else the posterior mean of the capacity kind's default (spot: per
    instance; reserved or on-demand: node failures, per node; unknown: one a day) updated with the
    job's own history of runs (`esiwrap.core.history`), times the job's nodes."""
    if config.interruption_rate_per_day is not None:
        return config.interruption_rate_per_day, "--interruption-rate"
    capacity = obs.capacity
    nodes = max(1, capacity.nodes) if capacity.kind is not None else 1
    on = f" ({capacity.source})" if capacity.source else ""
    of_nodes = f" x {nodes} nodes" if nodes > 1 else ""
    share = unwarned_share(obs, config)
    default = default_rate(capacity.kind) * share
    seen = job_evidence(obs)
    learned = posterior_rate(default, seen, PRIOR_INTERRUPTIONS[capacity.kind])
    history = rate_basis(seen)
    if capacity.kind == "spot":
        what = f"spot capacity{on}: default {default_rate('spot'):g}/day per instance"
        notice = capacity.notice_s
        if notice is not None and share < 1.0:
            what += f", {share:.2g} of them without a usable warning (a {notice:g} s notice is watched)"
        elif notice is not None:
            what += f" (a {notice:g} s notice is watched, too short for a step plus a save)"
    elif capacity.kind in ("reserved", "on-demand"):
        what = f"node failures on {capacity.kind} capacity{on}: default 1 in {1 / default:.0f} node-days"
    else:
        what = f"the capacity's kind is unknown: default {default:g}/day"
    return learned * nodes, f"{what}, {history}{of_nodes}"


def unwarned_share(obs: Observations, config: PolicyConfig) -> float:
    """The share of the spot capacity's interruptions a periodic save must guard against: 1 unless
    a source watches for the cloud's notice on every node (`Capacity.notice_s`). A notice comes at
    any moment of a step; the save it asks for begins at the next boundary and must end within the
    notice, so it fails when the rest of the step is longer than the notice minus the save (and
    esiwrap's own lateness): that share of a step, at least NOTICE_MISSED_SHARE. The save is the
    measured one (x the final save's factor), else the insurance save's cautious estimate, so an
    unmeasured guess never talks the cadence down."""
    notice = obs.capacity.notice_s
    step = step_estimate_s(obs, config)
    if obs.capacity.kind != "spot" or notice is None or not step:
        return 1.0
    kind: SaveKind = "final" if obs.measured else "insurance"
    need = (save_estimate_s(obs, config, kind) + verify_estimate_s(obs, config)
            + upload_estimate_s(obs, config) + obs.lateness_s)
    return min(1.0, max(NOTICE_MISSED_SHARE, (step + need - notice) / step))


def periodic_interval_s(obs: Observations, config: PolicyConfig) -> float | None:
    """Young/Daly: the checkpoint interval that minimizes expected lost work plus checkpoint cost
    for the interruption rate (`interruption_rate`); None when the cadence is off."""
    rate_per_day, _ = interruption_rate(obs, config)
    if rate_per_day <= 0:
        return None
    return math.sqrt(2.0 * max(save_cost_s(obs, config), 1e-3) / (rate_per_day / SECONDS_PER_DAY))


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
    nominal_at: float = 0.0  # deadline - (step + save + upload + reserve): the plan while steps stay usual
    why: str = ""  # one phrase for people: why this save
    upload_estimate_s: float = 0.0  # `--upload`: the checkpoint is durable once its upload ended
    lateness_s: float = 0.0  # esiwrap's own lateness on this node (`Observations.lateness_s`)
    verify_estimate_s: float = 0.0  # a checkpoint counts once verified (before its upload)


def plan_save(deadline: float, obs: Observations, config: PolicyConfig, kind: SaveKind) -> SavePlan:
    """The insurance or a final save against `deadline`."""
    save = save_estimate_s(obs, config, kind, at=deadline)
    verify = verify_estimate_s(obs, config)
    upload = upload_estimate_s(obs, config)
    reserve = config.final_margin_s if kind == "final" else config.redundant_s
    late = obs.lateness_s  # the signal may go out late, the acknowledgement arrive late
    cutoff = deadline - save - verify - upload - reserve - late  # the durable end: save, verify, upload
    if kind == "final":
        step = final_step_estimate_s(obs, config, cutoff - (obs.checkpoint_at or cutoff))
    else:
        step = step_estimate_s(obs, config)
    signal_at = latest_signal_at(cutoff, step, obs.step_started_at)
    nominal_at = cutoff - step if step is not None else signal_at
    return SavePlan(kind, signal_at, step or 0.0, save, reserve, nominal_at,
                    _why(kind, obs, save, upload, verify), upload, late, verify)


def upload_waits_too_long(plan: SavePlan, deadline: float, obs: Observations, config: PolicyConfig) -> bool:
    """The plan's upload would start after the running one and end past the deadline: a save after
    the insurance save is then not worth taking (its checkpoint would never be durable)."""
    busy_until = upload_busy_until(obs, config)
    return busy_until is not None and busy_until + plan.upload_estimate_s + plan.reserve_s > deadline


def _why(kind: SaveKind, obs: Observations, save_s: float, upload_s: float = 0.0,
         verify_s: float = 0.0) -> str:
    verify = f" + its verification {verify_s:.0f}s" if verify_s >= 0.5 else ""
    upload = f" + its upload {upload_s:.0f}s" if upload_s else ""
    if kind == "final":
        with_verify = f"its verification, {verify_s:.0f}s" if verify else ""
        with_upload = f"its upload, {upload_s:.0f}s" if upload_s else ""
        also = " and ".join(part for part in (with_verify, with_upload) if part)
        return ("final: the last step boundary before the deadline that a measured save still fits"
                + (f" (with {also})" if also else ""))
    return (f"insurance: must land before the deadline; {save_basis(obs)}, planned as "
            f"{save_s:.0f}s{verify}{upload}")


def save_basis(obs: Observations) -> str:
    """What the save estimate rests on, in words: measured, the state file, the prior, or a guess."""
    if obs.saves:
        return "save measured"
    if obs.prior.saves:
        return "save measured by an earlier run (state file)"
    prior = prior_save_s(obs)
    if prior is not None and obs.checkpoint_bytes and obs.bandwidth_bps:
        return (f"no save measured yet, prior {prior:.0f}s from {_bytes(obs.checkpoint_bytes)} at "
                f"{obs.bandwidth_bps / 1e6:.0f} MB/s ({obs.bandwidth_source or 'probe'})")
    return "no save measured yet, a guess (--save-duration x --unmeasured-factor)"


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _periodic(obs: Observations, config: PolicyConfig, interval_s: float, now: float) -> SavePlan:
    step = step_estimate_s(obs, config) or 0.0
    due = (obs.checkpoint_at if obs.checkpoint_at is not None else now) + interval_s
    signal_at = latest_signal_at(due, step, obs.step_started_at)
    cost = save_cost_s(obs, config)
    rate, basis = interruption_rate(obs, config)
    why = (f"periodic: {interval_s / 60:.0f}m since the last checkpoint (Young/Daly for {rate:.3g} "
           f"interruption(s) a day: {basis}; a save stops training {cost:.0f}s)")
    return SavePlan("periodic", signal_at, step, cost, 0.0, due - step, why)


def measure_upload_early(obs: Observations, config: PolicyConfig) -> bool:
    """`--upload` and no upload measured (in this run or by an earlier one), none running, no
    checkpoint of this run yet, and the step known: save now, so that the upload's duration is
    learned while a miss is still impossible (a guessed upload is the one estimate no prior
    replaces). `next_save` takes it where the insurance save is further away than such a save
    and its guessed upload, and UPLOAD_CALIBRATION_MIN_S (else the insurance save is the first
    save anyway)."""
    return (config.uploads and obs.longest_upload_s is None and obs.upload_started_at is None
            and not obs.saves and bool(obs.intervals))


def _calibration(obs: Observations, config: PolicyConfig, now: float, upload: bool = False) -> SavePlan:
    why = ("calibration: no save measured yet, nothing known of its size, and the deadline is hours "
           "away; measure one now (it is a checkpoint too)")
    if upload:
        why = ("calibration: no upload measured yet (--upload-duration is a guess); save now so that "
               "its upload is measured while a miss is impossible (it is a checkpoint too)")
    return SavePlan("calibration", now, step_estimate_s(obs, config) or 0.0, config.save_duration_s,
                    0.0, now, why)


def next_save(
    deadline: float, obs: Observations, config: PolicyConfig, saves_done: int, now: float
) -> SavePlan | None:
    """The next save to ask for, or None when no further save fits.

    Before the insurance save (`saves_done == 0`): a calibration save if nothing was measured and
    the deadline is hours away; the final save if a recent checkpoint already insures the run;
    else a periodic save if the cadence says one is due well before the insurance save; else the
    insurance save, always (if its moment has passed, ask at once). After it, with `final_save`,
    a final save as long as its moment is still ahead.
    """
    if saves_done == 0:
        insurance = plan_save(deadline, obs, config, "insurance")
        horizon = calibration_horizon_s(obs, config)
        attached = obs.step_started_at is not None  # a trainer said what it knows (its size)
        early = max(UPLOAD_CALIBRATION_MIN_S, save_estimate_s(obs, config, "final")
                    + verify_estimate_s(obs, config) + upload_estimate_s(obs, config))
        if attached and measure_upload_early(obs, config) and insurance.nominal_at - now > early:
            return _calibration(obs, config, now, upload=True)  # (not when the insurance is next anyway)
        if horizon is not None and attached and deadline - now > horizon and obs.upload_started_at is None:
            return _calibration(obs, config, now)
        if recent_checkpoint_insures(insurance, obs, config, deadline):
            return next_save(deadline, obs, config, 1, now)
        interval = periodic_interval_s(obs, config)
        if interval is not None:
            periodic = _periodic(obs, config, interval, now)
            # The plans' nominal moments: their timers are brought forward while a step runs long
            # (halfway to the moment, far ahead of it), which would shrink the gap between them.
            if periodic.nominal_at < insurance.nominal_at - PERIODIC_SKIP_FRACTION * interval \
                    and insurance.signal_at > now:
                return periodic
        return insurance
    if not config.final_save:
        return None
    insurance = plan_save(deadline, obs, config, "insurance")
    if insurance.signal_at >= now and not recent_checkpoint_insures(insurance, obs, config, deadline) \
            and not upload_waits_too_long(insurance, deadline, obs, config):
        return insurance  # the last checkpoint is far back (an unmeasured guess): insure again
    plan = plan_save(deadline, obs, config, "final")
    return plan if plan.signal_at >= now and not upload_waits_too_long(plan, deadline, obs, config) else None


def final_fails_prob(insurance: SavePlan, deadline: float, obs: Observations, config: PolicyConfig) -> float:
    """The chance that the final save does not hold the work the insurance save would: the end
    comes early (EARLY_END_PROB), or an interruption without notice comes between the insurance
    moment and the deadline (the job's rate, `interruption_rate`)."""
    rate_per_day, _ = interruption_rate(obs, config)
    gap = max(0.0, deadline - insurance.signal_at)
    return 1.0 - (1.0 - EARLY_END_PROB) * math.exp(-rate_per_day / SECONDS_PER_DAY * gap)


def recent_checkpoint_insures(insurance: SavePlan, obs: Observations, config: PolicyConfig,
                              deadline: float | None = None) -> bool:
    """A checkpoint of this run (the trainer's own, a periodic one) is recent enough that the
    insurance save is worth less than it costs: the chance that the final save fails
    (`final_fails_prob`) times the work it would protect (since that checkpoint) is below the
    cost of a save. It takes the insurance save's place, and the final save is planned right
    away. With no checkpoint the insurance is always taken: a failed final save would be a miss."""
    if not obs.saves or obs.checkpoint_at is None:
        return False
    at = deadline if deadline is not None else insurance.signal_at + needed_s(insurance)
    protected = insurance.signal_at - obs.checkpoint_at
    return final_fails_prob(insurance, at, obs, config) * protected < save_cost_s(obs, config)


def replan(
    deadline: float,
    obs: Observations,
    config: PolicyConfig,
    saves_done: int,
    decided: SavePlan | None,
    now: float,
) -> SavePlan | None:
    """What the supervisor does on every input change (a step, an acknowledged save, a deadline).

    Before the insurance save (`saves_done == 0`) decide afresh with `next_save` every time: which
    save comes first (calibration, periodic, insurance) changes with what is measured and with the
    deadline. Once a final save is decided, its kind is kept and only its moment moves as the
    estimates and the deadline change.
    """
    if decided is None or saves_done == 0:
        return next_save(deadline, obs, config, saves_done, now)
    plan = plan_save(deadline, obs, config, decided.kind)
    if config.uploads and (plan.signal_at < now - plan.reserve_s
                           or upload_waits_too_long(plan, deadline, obs, config)):
        return None  # a late final save loses nothing, but one whose upload cannot end in time would
    return plan


def renewal_reopens_insurance(deadline: float, obs: Observations, config: PolicyConfig, now: float) -> bool:
    """A later deadline after a completed save: is there room for a fresh insurance save before it?

    If so the supervisor starts over (saves_done = 0) rather than only moving the final save, which
    would then come hours later with just the final margin of slack.
    """
    return plan_save(deadline, obs, config, "insurance").signal_at > now


def needed_s(plan: SavePlan) -> float:
    """How long before the deadline the plan needs its signal."""
    return (plan.step_estimate_s + plan.save_estimate_s + plan.verify_estimate_s + plan.upload_estimate_s
            + plan.reserve_s + plan.lateness_s)


def moved_enough(old: float | None, new: float) -> bool:
    """Log a re-plan only when it moves by more than a few seconds."""
    return old is None or abs(new - old) > RESCHEDULE_LOG_THRESHOLD_S
