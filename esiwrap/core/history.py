"""The job's history of runs (kept in `--state-file`) and what esiwrap learns from it: the rate at
which this job's capacity is interrupted, and whether the job still makes progress.

Each run of a job adds one `RunRecord`: when it started, when it was last seen alive, how many
nodes it spanned, the capacity's kind and the deadline's source, how it ended, and the durable
step when it started and when it ended. A run that vanishes (the instance taken away with no
notice, esiwrap killed) cannot write its end: the next run finds its record still open, seen
on its own host or not refreshed for STALE_AFTER_S, and closes it as an interruption without
notice (`interrupted`).

**The interruption rate** is the posterior mean of a Gamma prior updated with the job's own
counts. The prior is centred on the capacity kind's default (`policy.default_rate`: spot 8 a day
per instance, reserved or on-demand one node failure in 264 node-days, unknown one a day per job)
and is worth `a = PRIOR_INTERRUPTIONS[kind]` interruptions of exposure at that rate, `a / default`
node-days: for spot 0.05, 9 node-minutes (spot pools differ by orders of magnitude, so the job's
own runs must outweigh the default within a run or two); for reserved and on-demand 1, 264
node-days (node failure rates are much alike across clusters). With `k` interruptions without
notice in `E` node-days of the same capacity kind:

    rate per node-day = (a + k) / (a / default + E)

times the job's nodes. Runs weigh by their age: a run that ended `t` seconds ago counts (its
interruption and its exposure) with 0.5 ** (t / HALF_LIFE_S), 12 hours: interruptions come in
bursts, so a fresh one weighs fully and a storm that is over fades within a day (BENCHMARKS.md,
"Jobs": 12 h against 2 days on the calm and the stormy pool).

**The no-progress guard** (`no_progress`) looks at the last runs: N consecutive runs whose
durable step did not advance mean the next one will not either (a slot shorter than a step plus a
save, a trainer that never resumes, uploads that always fail). A run interrupted without notice
before it could save is bad luck, not a broken job: it is left out.

Everything here is pure: times are arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from esiwrap.core.values import CapacityKind, finite_number

Ending = Literal["running", "announced", "interrupted", "child", "other", "no_progress", "killed"]
ENDINGS: tuple[Ending, ...] = (
    "running", "announced", "interrupted", "child", "other", "no_progress", "killed")
KINDS: tuple[CapacityKind, ...] = ("spot", "reserved", "on-demand")
KEEP_RUNS = 50  # the newest runs kept in the state file
HEARTBEAT_S = 60.0  # a running esiwrap refreshes its record this often (its exposure so far)
STALE_AFTER_S = 3 * HEARTBEAT_S  # an open record not refreshed for this long: that run vanished
# The prior is worth this many interruptions of exposure at the kind's default. Spot pools differ by
# orders of magnitude (0.002 to 17 a day per instance): a weak prior, which a few runs outweigh.
# Node failures of reserved and on-demand capacity are much alike from cluster to cluster.
PRIOR_INTERRUPTIONS: dict[CapacityKind | None, float] = {
    "spot": 0.05,
    "reserved": 1.0, "on-demand": 1.0, None: 1.0}
HALF_LIFE_S = 12 * 3600.0  # a run's weight halves with every this much age (bursts: BENCHMARKS.md)
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class RunRecord:
    """One run of the job, as the state file keeps it."""

    started_at: float
    seen_at: float  # the last time it was known alive: its end, once it ended
    run_id: str = ""
    nodes: int = 1
    capacity: CapacityKind | None = None
    source: str = ""  # the deadline's source
    ending: Ending = "running"
    start_step: int | None = None  # the job's durable step when the run started
    end_step: int | None = None  # ...when it ended (or was last seen)
    saves: int = 0  # checkpoints it completed
    uploads: int = 0  # uploads it completed (`--upload`)
    uploads_failed: int = 0
    host: str = ""  # the instance it ran on
    deadline_at: float | None = None  # the deadline it knew when last seen (None: none known)

    @property
    def hours(self) -> float:
        return max(0.0, self.seen_at - self.started_at) / 3600.0

    @property
    def exposure_node_days(self) -> float:
        return max(1, self.nodes) * self.hours / 24.0

    @property
    def progressed(self) -> bool:
        """Its durable step advanced past the one it started from."""
        if self.end_step is None:
            return False
        return self.start_step is None or self.end_step > self.start_step


def close_vanished(runs: Sequence[RunRecord], now: float, host: str = "",
                   killed: str = "") -> tuple[RunRecord, ...]:
    """Open records of runs that are gone: on this host (a new run here means the last one here
    ended), or not refreshed for STALE_AFTER_S. They vanished with no notice (`interrupted`) unless
    their known deadline was near (`vanished_ending`), except the run `killed` names: its esiwrap
    was killed on a machine that lived on (the state file's lock says so), which is no
    interruption of the capacity. An open record of another host seen recently is a run still
    going there (another node of the job)."""
    def vanished(run: RunRecord) -> bool:
        same_host = bool(host) and run.host == host
        return run.ending == "running" and (same_host or now - run.seen_at > STALE_AFTER_S)

    def closed(run: RunRecord) -> RunRecord:
        if killed and run.run_id == killed and run.ending == "running":
            return replace(run, ending="killed")
        return replace(run, ending=vanished_ending(run)) if vanished(run) else run

    return tuple(closed(r) for r in runs)


ANNOUNCED_WITHIN_S = 600.0  # a SIGTERM this close to a known deadline is that deadline's reclamation


def vanished_ending(run: RunRecord) -> Ending:
    """A run that vanished within ANNOUNCED_WITHIN_S of its known deadline, or after it, went with
    that deadline's reclamation (`announced`: capacity taken a little early, a clock a little off);
    anything else vanished without notice (`interrupted`)."""
    near = run.deadline_at is not None and run.deadline_at - run.seen_at <= ANNOUNCED_WITHIN_S
    return "announced" if near else "interrupted"


def ending_of(cause: str, deadline_in_s: float | None) -> Ending:
    """How a run ended, from why the controller stopped it (`controller.StopCause`) and how far
    the known deadline was (None: no deadline known): the deadline's reclamation (`announced`: the
    planned saves done, the deadline come, or a SIGTERM near it), a stop from outside with no
    deadline near (`interrupted`: Slurm's preemption, a Kubernetes eviction), the child's own end,
    or other (another node's save, a stop by hand, esiwrap's own failure)."""
    if cause == "child":
        return "child"
    if cause == "sigterm":
        near = deadline_in_s is not None and deadline_in_s <= ANNOUNCED_WITHIN_S
        return "announced" if near else "interrupted"
    return "announced" if cause == "deadline" else "other"


# ---------------------------------------------------------------------------------- the rate
@dataclass(frozen=True)
class Evidence:
    """The job's own weighted counts for one capacity kind."""

    interruptions: float = 0.0
    node_days: float = 0.0
    runs: int = 0


def evidence(runs: Sequence[RunRecord], kind: CapacityKind | None, now: float,
             half_life_s: float = HALF_LIFE_S) -> Evidence:
    """The interruptions without notice and the node-days of exposure of the ended runs on this
    kind of capacity, each weighted by its age (0.5 per `half_life_s`). Unknown capacity counts
    job-days (no nodes: the default rate is per job)."""
    count = days = 0.0
    n = 0
    for run in runs:
        if run.ending == "running" or run.capacity != kind:
            continue
        weight = 0.5 ** (max(0.0, now - run.seen_at) / half_life_s) if half_life_s > 0 else 1.0
        exposure = run.exposure_node_days if kind is not None else run.hours / 24.0
        days += weight * exposure
        count += weight * (1.0 if run.ending == "interrupted" else 0.0)
        n += 1
    return Evidence(count, days, n)


def posterior_rate(default_per_day: float, seen: Evidence, prior_interruptions: float) -> float:
    """The Gamma posterior's mean rate per node-day (per job-day for unknown capacity): a prior of
    `prior_interruptions` at `default_per_day` updated with the job's own counts."""
    if default_per_day <= 0:
        return 0.0
    shape = prior_interruptions + seen.interruptions
    exposure = prior_interruptions / default_per_day + seen.node_days
    return shape / exposure if exposure > 0 else default_per_day


def rate_basis(seen: Evidence) -> str:
    """What the learned rate rests on, in words (for the periodic save's `why` and the report)."""
    if seen.runs == 0:
        return "no earlier run of this job on it"
    return (f"+ this job's {seen.interruptions:.3g} interruption(s) without notice in "
            f"{seen.node_days:.3g} node-days over {seen.runs} earlier run(s) (state file)")


# ---------------------------------------------------------------------------------- the guard
@dataclass(frozen=True)
class NoProgress:
    """The guard's verdict: these runs made no progress; the likely cause and the fix."""

    runs: tuple[RunRecord, ...]
    cause: str
    fix: str

    def fields(self) -> dict[str, Any]:
        return {
            "runs": [{"run_id": r.run_id or None, "hours": round(r.hours, 3), "ending": r.ending,
                      "start_step": r.start_step, "end_step": r.end_step, "saves": r.saves,
                      "uploads": r.uploads, "uploads_failed": r.uploads_failed} for r in self.runs],
            "steps": sorted({s for r in self.runs for s in (r.start_step, r.end_step) if s is not None}),
            "cause": self.cause, "fix": self.fix,
        }


def no_progress(runs: Sequence[RunRecord], limit: int, step_s: float | None = None,
                save_s: float | None = None) -> NoProgress | None:
    """The last `limit` runs (ended, newest last) all failed to advance the durable step, and none
    of them was stopped by this guard (a run the guard stopped ends the streak: a job started again
    by hand after the fix runs): a verdict, else None. Runs interrupted without notice that made
    no progress are left out. `limit` 0 disables the guard."""
    if limit <= 0:
        return None
    # A run taken away without notice before it could save says nothing of the job (bad luck, not
    # a broken job): it neither counts nor ends the count.
    ended = [r for r in runs if r.ending not in ("running", "interrupted") or r.progressed]
    streak: list[RunRecord] = []
    for run in reversed(ended):
        if run.progressed or run.ending == "no_progress":
            break
        streak.append(run)
        if len(streak) == limit:
            break
    if len(streak) < limit:
        return None
    streak.reverse()
    cause, fix = _likely_cause(streak, step_s, save_s)
    return NoProgress(tuple(streak), cause, fix)


def _likely_cause(runs: Sequence[RunRecord], step_s: float | None, save_s: float | None) -> tuple[str, str]:
    cycle = (step_s or 0.0) + (save_s or 0.0)
    if any(r.uploads_failed and not r.uploads for r in runs) and any(r.saves for r in runs):
        return ("uploads failing: checkpoints completed, their uploads did not",
                "run the --upload command by hand on a checkpoint and fix what it says (credentials, "
                "bucket, network), or give uploads more time (--upload-duration)")
    if any(r.saves for r in runs):
        return ("resume failing: the runs saved, but never beyond the step the job had reached: the "
                "trainer starts over from an earlier step",
                "make the trainer resume from the last checkpoint (the resume_missed warnings name "
                "what to check), and copy an uploaded checkpoint back before it starts")
    longest = max((r.hours for r in runs), default=0.0) * 3600.0
    cycle_text = f" ({cycle:.0f}s measured)" if cycle > 0 else ""
    return (f"slot shorter than a step plus a save{cycle_text}: the longest run lasted {longest:.0f}s and "
            "completed no checkpoint",
            "ask for longer slots (a longer time limit, a longer reservation), save more often or "
            "faster (smaller or asynchronous checkpoints), or shorten the step")


# ---------------------------------------------------------------------------------- the file
def record_to_json(run: RunRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"started_at": round(run.started_at, 3), "seen_at": round(run.seen_at, 3),
                           "nodes": run.nodes, "ending": run.ending}
    for key in ("run_id", "host", "capacity", "source", "start_step", "end_step"):
        value = getattr(run, key)
        if value not in (None, ""):
            out[key] = value
    for key in ("saves", "uploads", "uploads_failed"):
        if getattr(run, key):
            out[key] = getattr(run, key)
    if run.deadline_at is not None:
        out["deadline_at"] = round(run.deadline_at, 3)
    return out


def record_from_json(obj: object) -> RunRecord | None:
    """A record from the state file; None when it is not one (it is dropped, the rest still count)."""
    if not isinstance(obj, dict):
        return None
    started, seen = obj.get("started_at"), obj.get("seen_at")
    if not (finite_number(started) and finite_number(seen)) or float(seen) < float(started):
        return None
    ending = obj.get("ending")
    capacity = obj.get("capacity")
    if ending not in ENDINGS or (capacity is not None and capacity not in KINDS):
        return None
    counts = {k: obj.get(k, 0) for k in ("nodes", "saves", "uploads", "uploads_failed")}
    steps = {k: obj.get(k) for k in ("start_step", "end_step")}
    if not all(_count(v) for v in counts.values()) or not all(v is None or _count(v) for v in steps.values()):
        return None
    run_id, source, host = (obj.get(k, "") for k in ("run_id", "source", "host"))
    deadline = obj.get("deadline_at")
    return RunRecord(float(started), float(seen), run_id if isinstance(run_id, str) else "",
                     max(1, counts["nodes"]), capacity, source if isinstance(source, str) else "", ending,
                     steps["start_step"], steps["end_step"], counts["saves"], counts["uploads"],
                     counts["uploads_failed"], host if isinstance(host, str) else "",
                     float(deadline) if finite_number(deadline) else None)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
