"""`esiwrap report`: what happened in a run, read back from its JSON-lines log.

Input is whatever holds the lines: a `--log-file`, `journalctl -o cat -u esiwrap@JOB` output
(the trainer's own output interleaved), `journalctl -o json` (the line is in MESSAGE), or a file
cut short when the instance went away. A line counts when it holds a JSON object with `event`,
`timestamp` and `run_id`; anything else, a truncated last line included, is skipped and counted.

A log can hold several runs (restarts of a unit, runs appended to one file), and several logs can
be given (one per instance): each run is reported on its own, in the order it started; `--last`
keeps only the last one. With more than one run, the job across them follows (`JobReport`): each
run's instance and deadline source, its exit, the work lost when it ended (training after its last
durable checkpoint, and the steps the next run redid because it started further back), the time
spent saving and uploading, and the totals.

The figures per run: the deadline, its source and every change; each save asked for, with the
planned and the actual signal time, the wait for the step boundary against the step estimate,
the save's duration against the save estimate, and the time left when it ended; the stop and
the exit code; and the work at risk: training time after the last completed checkpoint, up to
the end of the run (or, for a log that just stops, the deadline).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from esiwrap import events as ev
from esiwrap.core.policy import quantile
from esiwrap.errors import (
    EXIT_CHECKPOINTED,
    EXIT_FAILURE,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_NOT_RESTORED,
    EXIT_NOT_UPLOADED,
    EXIT_OK,
    EXIT_SAVE_MISSED,
    EXIT_USAGE,
)
from esiwrap.signals import signal_label, signal_number
from esiwrap.times import iso_epoch, iso_utc

Event = dict[str, Any]
_DECODER = json.JSONDecoder()
_NOT_IN_TIMELINE = frozenset({ev.STEP_OBSERVED})
_HEAD_KEYS = frozenset({"timestamp", "level", "event", "run_id"})
EXIT_MEANINGS = {
    EXIT_OK: "the command finished",
    EXIT_CHECKPOINTED: "stopped after a completed checkpoint: resume on the next instance",
    EXIT_NOT_UPLOADED: "checkpoint complete on local storage only: its upload did not finish",
    EXIT_SAVE_MISSED: "no acknowledged checkpoint before the deadline (or none that passed its checks)",
    EXIT_NOT_RESTORED: "not started: --restore could not bring the job's checkpoint back",
    EXIT_USAGE: "usage error",
    EXIT_FAILURE: "esiwrap failed, or the command exited with 1",
    EXIT_NOT_EXECUTABLE: "the command is not executable",
    EXIT_NOT_FOUND: "the command was not found",
}


# ---------------------------------------------------------------------- reading
@dataclass
class LogLines:
    events: list[Event] = field(default_factory=list)
    skipped: int = 0  # lines that were not esiwrap events (trainer output, a cut-off line)


def read_events(lines: Iterable[str]) -> LogLines:
    found = LogLines()
    for line in lines:
        event = event_of(line)
        if event is None:
            found.skipped += bool(line.strip())
        else:
            found.events.append(event)
    return found


def event_of(line: str) -> Event | None:
    """The esiwrap event in a line, wherever the object starts (a journal prefix is fine)."""
    start = line.find("{")
    if start < 0:
        return None
    try:
        obj, _ = _DECODER.raw_decode(line, start)
    except (ValueError, RecursionError):  # RecursionError: a line of `[[[[...`
        return None
    if not isinstance(obj, dict):
        return None
    if "event" not in obj and isinstance(obj.get("MESSAGE"), str):
        return event_of(obj["MESSAGE"])  # `journalctl -o json`: our line is the message
    if all(isinstance(obj.get(key), str) for key in ("event", "timestamp", "run_id")):
        try:
            iso_epoch(obj["timestamp"])
        except ValueError:
            return None
        return obj
    return None


def split_runs(events: Sequence[Event]) -> list[list[Event]]:
    """Events grouped by run_id, each in time order; runs in the order they started."""
    runs: dict[str, list[Event]] = {}
    for event in events:
        runs.setdefault(event["run_id"], []).append(event)
    ordered = [sorted(run, key=lambda e: iso_epoch(e["timestamp"])) for run in runs.values()]
    return sorted(ordered, key=lambda run: iso_epoch(run[0]["timestamp"]))


# ---------------------------------------------------------------------- figures
@dataclass
class SaveReport:
    kind: str
    reason: str
    outcome: str  # completed | failed | missed | not acknowledged
    requested_at: str
    first_planned_at: str | None = None  # the first plan for this save (it moves as steps are learned)
    planned_signal_at: str | None = None  # the plan when it fired
    signal_late_s: float | None = None  # requested minus planned: the loop's timer accuracy
    step_estimate_s: float | None = None
    save_estimate_s: float | None = None
    started_at: str | None = None
    step: int | None = None
    boundary_wait_s: float | None = None  # signal to save start: what the step estimate covers
    completed_at: str | None = None
    duration_s: float | None = None
    path: Any = None
    remaining_s: float | None = None  # time left before the deadline when the save ended


@dataclass
class RunReport:
    run_id: str
    started_at: str
    ended_at: str
    duration_s: float
    complete: bool  # the log reaches supervisor_exit
    command: list[str] | None = None
    deadline: dict[str, Any] | None = None
    deadline_changes: list[dict[str, Any]] = field(default_factory=list)
    deadline_unavailable: list[dict[str, Any]] = field(default_factory=list)
    saves: list[SaveReport] = field(default_factory=list)
    trainer_saves: list[dict[str, Any]] = field(default_factory=list)  # not asked for by esiwrap
    steps: dict[str, Any] = field(default_factory=dict)
    stop: dict[str, Any] | None = None
    child_exit: dict[str, Any] | None = None
    exit_code: int | None = None
    exit_meaning: str | None = None
    exit_reason: str | None = None
    work_at_risk: dict[str, Any] = field(default_factory=dict)
    uploads: list[dict[str, Any]] = field(default_factory=list)  # --upload: each upload's end
    resume: dict[str, Any] | None = None  # resumed / resume_missed: where the trainer started
    # each checkpoint's verification: checkpoint_verified / checkpoint_invalid
    verifications: list[dict[str, Any]] = field(default_factory=list)
    restore: dict[str, Any] | None = None  # --restore: restored, restore_failed or restore_skipped
    # the interruption rate the periodic saves assumed, and what it rests on (the last periodic plan)
    interruption_rate: str | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)


def summarize(events: Sequence[Event]) -> RunReport:
    """The figures of one run (its events, in time order)."""
    first, last = events[0], events[-1]
    start, end = iso_epoch(first["timestamp"]), iso_epoch(last["timestamp"])
    report = RunReport(
        run_id=first["run_id"], started_at=first["timestamp"], ended_at=last["timestamp"],
        duration_s=round(end - start, 3), complete=any(e["event"] == ev.SUPERVISOR_EXIT for e in events),
    )
    _deadlines(report, events, start)
    _saves(report, events)
    _steps(report, events)
    _ending(report, events)
    _uploads_and_resume(report, events)
    report.interruption_rate = _interruption_rate(events)
    report.work_at_risk = _work_at_risk(report, events, start, end)
    report.warnings = [_brief(e, start) for e in events
                       if e.get("level") in ("warning", "error", "critical")]
    report.timeline = [_brief(e, start) for e in events if e["event"] not in _NOT_IN_TIMELINE]
    return report


def _deadlines(report: RunReport, events: Sequence[Event], start: float) -> None:
    for e in events:
        name = e["event"]
        if name == ev.CHILD_STARTED and report.command is None:
            argv = e.get("argv")
            report.command = [str(a) for a in argv] if isinstance(argv, list) else None
        elif name == ev.DEADLINE_RESOLVED and report.deadline is None:
            report.deadline = {"at": e.get("deadline"), "source": e.get("source"),
                               "remaining_s": e.get("remaining_s"), "logged_at": e["timestamp"],
                               "after_start_s": round(iso_epoch(e["timestamp"]) - start, 3)}
        elif name == ev.DEADLINE_CHANGED:
            moved = _seconds_between(e.get("old"), e.get("new"))
            report.deadline_changes.append({"logged_at": e["timestamp"], "old": e.get("old"),
                                            "new": e.get("new"), "source": e.get("source"),
                                            "moved_s": moved})
        elif name == ev.DEADLINE_UNAVAILABLE:
            report.deadline_unavailable.append({"source": e.get("source"), "reason": e.get("reason")})


def _saves(report: RunReport, events: Sequence[Event]) -> None:
    first_plans: dict[str, Event] = {}  # kind -> the first save_scheduled since the last request
    current: SaveReport | None = None
    for e in events:
        name = e["event"]
        if name == ev.SAVE_SCHEDULED:
            first_plans.setdefault(str(e.get("kind")), e)
        elif name == ev.SAVE_REQUESTED:
            current = _new_save(e, first_plans.pop(str(e.get("kind")), None))
            report.saves.append(current)
        elif (name == ev.SAVE_STARTED and e.get("requested") and current is not None
              and current.started_at is None):
            current.started_at, current.step = e["timestamp"], e.get("step")
            current.boundary_wait_s = round(iso_epoch(e["timestamp"]) - iso_epoch(current.requested_at), 3)
        elif name == ev.SAVE_COMPLETED and not e.get("requested"):
            report.trainer_saves.append({"at": e["timestamp"], "step": e.get("step"),
                                         "duration_s": e.get("duration_s"), "path": e.get("path")})
        elif name == ev.SAVE_COMPLETED and current is not None:
            current.outcome, current.completed_at = "completed", e["timestamp"]
            current.step = e.get("step", current.step)
            current.duration_s, current.path = e.get("duration_s"), e.get("path")
            current.remaining_s = e.get("remaining_s")
            current = None
        elif name == ev.SAVE_FAILED and current is not None:
            current.outcome = "failed"  # the trainer retries at its next boundary: it may still complete
        elif name == ev.SAVE_MISSED and current is not None and current.outcome != "completed":
            current.outcome = "missed"
            current.remaining_s = e.get("remaining_s")


def _new_save(request: Event, first_plan: Event | None) -> SaveReport:
    """A save asked for; its plan as it stood when it fired (older logs: the last one logged)."""
    save = SaveReport(kind=str(request.get("kind")), reason=str(request.get("reason")),
                      outcome="not acknowledged", requested_at=request["timestamp"])
    if request.get("reason") != "deadline":
        return save
    plan = request if "planned_at" in request else (first_plan or {})
    if first_plan is not None:
        save.first_planned_at = first_plan.get("signal_at")
    save.planned_signal_at = plan.get("planned_at", plan.get("signal_at"))
    planned = _epoch_or_none(save.planned_signal_at)
    if planned is not None:
        save.signal_late_s = round(iso_epoch(request["timestamp"]) - planned, 3)
    save.step_estimate_s = plan.get("step_estimate_s")
    save.save_estimate_s = plan.get("save_estimate_s")
    return save


def _steps(report: RunReport, events: Sequence[Event]) -> None:
    durations = [float(e["duration_s"]) for e in events
                 if e["event"] == ev.STEP_OBSERVED and isinstance(e.get("duration_s"), (int, float))]
    steps: dict[str, Any] = {}
    if durations:  # only with --log-level debug
        ordered = sorted(durations)
        steps.update(observed=len(durations), mean_s=round(sum(durations) / len(durations), 3),
                     p99_s=round(quantile(ordered, 0.99), 3),
                     max_s=round(ordered[-1], 3))
    estimates = [e.get("step_estimate_s") for e in events if e["event"] == ev.SAVE_SCHEDULED]
    if estimates:
        steps["last_estimate_s"] = estimates[-1]
    pace = _pace_between_saves(report.saves)
    if pace is not None:
        steps["pace_between_saves_s"] = pace
    report.steps = steps


def _pace_between_saves(saves: Sequence[SaveReport]) -> float | None:
    """Seconds per step from the first to the last completed save, without the saves' own time."""
    done = [(s.step, s.started_at, s.completed_at, _number(s.duration_s)) for s in saves
            if s.outcome == "completed" and isinstance(s.step, int) and s.started_at and s.completed_at]
    if len(done) < 2 or done[-1][0] <= done[0][0]:
        return None
    (first_step, _, first_end, _), (last_step, last_start, _, _) = done[0], done[-1]
    span = iso_epoch(last_start) - iso_epoch(first_end) - sum(d[3] for d in done[1:-1])
    return round(span / (last_step - first_step), 3)


def _ending(report: RunReport, events: Sequence[Event]) -> None:
    for e in events:
        name = e["event"]
        if name == ev.CHILD_STOPPING and report.stop is None:
            report.stop = {"at": e["timestamp"], "signal": e.get("signal"), "reason": e.get("reason"),
                           "grace_s": e.get("grace_s"), "first": e.get("first") or []}
        elif name == ev.CHILD_STOP_SIGNALLED and report.stop is not None:
            report.stop["child_at"] = e["timestamp"]
        elif name == ev.CHILD_KILLED and report.stop is not None:
            report.stop["killed"] = e.get("pids")
        elif name == ev.CHILD_EXITED:
            report.child_exit = {"at": e["timestamp"], "code": e.get("code"), "signal": e.get("signal")}
        elif name == ev.SUPERVISOR_EXIT:
            report.exit_code, report.exit_reason = e.get("code"), e.get("reason")
            report.exit_meaning = exit_meaning(report.exit_code)


_RESTORE_OUTCOMES = {ev.RESTORED: "brought back", ev.RESTORE_FAILED: "failed", ev.RESTORE_SKIPPED: "skipped"}


def _uploads_and_resume(report: RunReport, events: Sequence[Event]) -> None:
    for e in events:
        name = e["event"]
        if name in (ev.UPLOAD_COMPLETED, ev.UPLOAD_FAILED):
            upload = {"at": e["timestamp"], "step": e.get("step"), "path": e.get("path"),
                      "outcome": "completed" if name == ev.UPLOAD_COMPLETED else "failed",
                      "duration_s": e.get("duration_s"), "attempt": e.get("attempt")}
            if name == ev.UPLOAD_FAILED:
                upload.update(code=e.get("code"), signal=e.get("signal"),
                              reason=e.get("reason") or e.get("error"), stderr=e.get("stderr"))
            report.uploads.append(upload)
        elif name in (ev.CHECKPOINT_VERIFIED, ev.CHECKPOINT_INVALID):
            report.verifications.append({
                "at": e["timestamp"], "step": e.get("step"), "path": e.get("path"),
                "outcome": "valid" if name == ev.CHECKPOINT_VERIFIED else "invalid",
                **{key: e.get(key) for key in ("format", "seconds", "by", "problem")
                   if e.get(key) is not None}})
        elif name in (ev.RESTORED, ev.RESTORE_FAILED, ev.RESTORE_SKIPPED):
            outcome = _RESTORE_OUTCOMES[name]
            found = (report.restore or {}).get("manifest_step")
            report.restore = {"at": e["timestamp"], "outcome": outcome,
                              **{key: e.get(key) for key in ("step", "path", "seconds", "attempt", "problem",
                                                             "reason") if e.get(key) is not None}}
            if found is not None:
                report.restore["manifest_step"] = found
        elif name == ev.MANIFEST_FOUND:
            report.restore = {**(report.restore or {}), "manifest_step": e.get("step")}
        elif name in (ev.RESUMED, ev.RESUME_MISSED) and report.resume is None:
            report.resume = {"from_checkpoint": name == ev.RESUMED, "at": e["timestamp"],
                             **{key: e.get(key) for key in ("checkpoint_step", "start_step",
                                                            "steps_redone", "causes")}}


def _interruption_rate(events: Sequence[Event]) -> str | None:
    """The rate the last periodic plan assumed, as its `why` says it: `Young/Daly for R
    interruption(s) a day: what it rests on; ...`."""
    for e in reversed(events):
        why = e.get("why")
        if e["event"] == ev.SAVE_SCHEDULED and e.get("kind") == "periodic" and isinstance(why, str) \
                and "Young/Daly for " in why:
            return why.split("Young/Daly for ", 1)[1].rsplit("; a save stops training", 1)[0]
    return None


def exit_meaning(code: Any) -> str | None:
    if not isinstance(code, int):
        return None
    if code in EXIT_MEANINGS:
        return EXIT_MEANINGS[code]
    if code > 128 and signal_number(str(code - 128)) is not None:
        return f"the command was killed by {signal_label(code - 128)}"
    return "the command's own exit code"


def _work_at_risk(report: RunReport, events: Sequence[Event], start: float, end: float) -> dict[str, Any]:
    """Training time after the last completed checkpoint, up to where the run's work ended."""
    saved = [e for e in events if e["event"] == ev.SAVE_COMPLETED]
    if any(e["event"] == ev.UPLOAD_STARTED for e in events):  # --upload: durable once uploaded
        uploaded = {e.get("step") for e in events if e["event"] == ev.UPLOAD_COMPLETED}
        saved = [e for e in saved if e.get("step") in uploaded]
    deadline = _final_deadline(report)
    if report.complete:
        until, until_what = end, "the end of the run"
    elif deadline is not None and deadline > end:
        until, until_what = deadline, "the deadline (the log stops before it)"
    else:
        until, until_what = end, "the last line of the log (it stops without supervisor_exit)"
    if deadline is not None and deadline < until:
        until, until_what = deadline, "the deadline"
    risk: dict[str, Any] = {"until": iso_utc(until), "until_what": until_what}
    if saved:
        last = saved[-1]
        since = iso_epoch(last["timestamp"])
        risk.update(since=last["timestamp"], since_what=f"checkpoint of step {last.get('step')}",
                    step=last.get("step"))
    else:
        since = start
        risk.update(since=iso_utc(start), since_what="the start of the run, no checkpoint in it")
    risk["seconds"] = round(max(0.0, until - since), 3)
    if report.child_exit and report.child_exit.get("code") == 0 and report.stop is None:
        risk["note"] = "the command finished by itself; what it wrote at the end is not counted"
    return risk


def _final_deadline(report: RunReport) -> float | None:
    if report.deadline_changes:
        value = report.deadline_changes[-1].get("new")
    elif report.deadline is not None:
        value = report.deadline.get("at")
    else:
        return None
    return _epoch_or_none(value)


def _seconds_between(old: Any, new: Any) -> float | None:
    old_at, new_at = _epoch_or_none(old), _epoch_or_none(new)
    if old_at is not None and new_at is not None:
        return round(new_at - old_at, 3)
    return None


def _epoch_or_none(value: Any) -> float | None:
    """A time field as epoch seconds; None when the log holds anything else there."""
    if not isinstance(value, str):
        return None
    try:
        return iso_epoch(value)
    except ValueError:
        return None


def _number(value: Any) -> float:
    """A duration field as a number; 0 when the log holds anything else there."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else 0.0


def _brief(event: Event, start: float) -> dict[str, Any]:
    fields = {k: v for k, v in event.items() if k not in _HEAD_KEYS}
    return {"at": event["timestamp"], "after_start_s": round(iso_epoch(event["timestamp"]) - start, 3),
            "level": event.get("level"), "event": event["event"], "fields": fields}


def report(lines: Iterable[str], *, last_only: bool = False) -> tuple[list[RunReport], int]:
    """Every run in the lines (or the last one), and how many lines were skipped."""
    runs, skipped = run_events(lines, last_only=last_only)
    return [summarize(run) for run in runs], skipped


def run_events(lines: Iterable[str], *, last_only: bool = False) -> tuple[list[list[Event]], int]:
    """Each run's events (or the last run's), and how many lines were skipped."""
    found = read_events(lines)
    runs = split_runs(found.events)
    return (runs[-1:] if last_only else runs), found.skipped


# ---------------------------------------------------------------------- the job across runs
@dataclass
class JobRun:
    """One run as the job sees it: where it ran, how it ended, what it cost and lost."""

    run_id: str
    started_at: str
    ended_at: str
    duration_s: float
    instance: str | None  # the cloud's instance id when a source named it, else the host name
    deadline_source: str | None
    exit_code: int | None
    exit_meaning: str | None
    start_step: int | None  # where its trainer started (resumed / resume_missed)
    last_step: int | None  # the last step it reached, as far as the log tells
    checkpoint_step: int | None  # its last durable checkpoint (with --upload: uploaded)
    lost_s: float  # training after that checkpoint, to the end of the run: lost when it ended
    lost_steps: int | None  # the same in steps, when the log has both
    steps_redone: int = 0  # steps the next run redid because it started before this checkpoint
    saving_s: float = 0.0
    uploading_s: float = 0.0
    saves: int = 0
    uploads_completed: int = 0
    uploads_failed: int = 0


@dataclass
class JobReport:
    runs: list[JobRun]
    started_at: str
    ended_at: str
    wall_s: float
    lost_s: float  # every run's lost training, summed
    lost_steps: int
    steps_redone: int
    saving_s: float
    uploading_s: float
    reclamations: int  # runs that ended with the capacity: stopped for a deadline, or the log stops


def job_report(reports: Sequence[RunReport], events: Sequence[Sequence[Event]]) -> JobReport:
    """The job across its runs (each run's report and events, in the order they started)."""
    runs = [_job_run(report, run) for report, run in zip(reports, events, strict=True)]
    for earlier, later in itertools.pairwise(runs):
        resume = next((r.resume for r in reports if r.run_id == later.run_id), None)
        redone = resume.get("steps_redone") if resume else None
        if isinstance(redone, int) and not isinstance(redone, bool):
            earlier.steps_redone = max(0, redone)
        elif later.start_step is not None and earlier.checkpoint_step is not None:
            earlier.steps_redone = max(0, earlier.checkpoint_step - later.start_step)
    start, end = reports[0].started_at, max((r.ended_at for r in reports), key=iso_epoch)
    return JobReport(
        runs=runs, started_at=start, ended_at=end, wall_s=round(iso_epoch(end) - iso_epoch(start), 3),
        lost_s=round(sum(r.lost_s for r in runs), 3),
        lost_steps=sum(r.lost_steps or 0 for r in runs), steps_redone=sum(r.steps_redone for r in runs),
        saving_s=round(sum(r.saving_s for r in runs), 3),
        uploading_s=round(sum(r.uploading_s for r in runs), 3),
        reclamations=sum(1 for r in reports if _reclaimed(r)),
    )


def _job_run(report: RunReport, events: Sequence[Event]) -> JobRun:
    exit_event = next((e for e in reversed(events) if e["event"] == ev.SUPERVISOR_EXIT), {})
    steps = [e.get("step") for e in events if e["event"] in (ev.STEP_OBSERVED, ev.SAVE_COMPLETED)]
    known = [s for s in steps if isinstance(s, int) and not isinstance(s, bool)]
    last_step = exit_event.get("last_step") if isinstance(exit_event.get("last_step"), int) else None
    if last_step is None and known:
        last_step = max(known)
    checkpoint = report.work_at_risk.get("step")
    checkpoint_step = checkpoint if isinstance(checkpoint, int) else None
    start_step = report.resume.get("start_step") if report.resume else None
    first = next((e.get("step") for e in events if e["event"] == ev.STEP_OBSERVED), None)
    if start_step is None and isinstance(first, int):
        start_step = max(0, first - 1)  # no checkpoint to check against: where its steps began
    lost_steps = None
    if last_step is not None:
        since = checkpoint_step if checkpoint_step is not None else start_step
        lost_steps = last_step - since if isinstance(since, int) else None
    saves = [e for e in events if e["event"] == ev.SAVE_COMPLETED]
    return JobRun(
        run_id=report.run_id, started_at=report.started_at, ended_at=report.ended_at,
        duration_s=report.duration_s, instance=_instance(events),
        deadline_source=(report.deadline_changes[-1].get("source") if report.deadline_changes
                         else (report.deadline or {}).get("source")),
        exit_code=report.exit_code, exit_meaning=report.exit_meaning,
        start_step=start_step if isinstance(start_step, int) else None, last_step=last_step,
        checkpoint_step=checkpoint_step, lost_s=float(report.work_at_risk.get("seconds") or 0.0),
        lost_steps=max(0, lost_steps) if lost_steps is not None else None,
        saving_s=round(sum(_number(e.get("duration_s")) for e in saves), 3),
        uploading_s=round(sum(_number(u.get("duration_s")) for u in report.uploads), 3),
        saves=len(saves),
        uploads_completed=sum(1 for u in report.uploads if u["outcome"] == "completed"),
        uploads_failed=sum(1 for u in report.uploads if u["outcome"] == "failed"),
    )


def _instance(events: Sequence[Event]) -> str | None:
    for e in events:
        named = isinstance(e.get("instance_id"), str)
        if named and e["event"] in (ev.DEADLINE_RESOLVED, ev.DEADLINE_CHANGED):
            return str(e["instance_id"])
    host = next((e.get("host") for e in events if e["event"] == ev.CHILD_STARTED), None)
    return str(host) if isinstance(host, str) and host else None


def _reclaimed(report: RunReport) -> bool:
    """The run ended because its capacity did: esiwrap stopped it for the deadline (a checkpoint,
    or none), or its log just stops."""
    return not report.complete or report.exit_code in (EXIT_CHECKPOINTED, EXIT_NOT_UPLOADED, EXIT_SAVE_MISSED)


def render_job(job: JobReport) -> str:
    out = [f"job  {_plural(len(job.runs), 'run')}, {job.started_at} -> {_clock(job.ended_at)} "
           f"({job.wall_s:g}s of wall time), {_plural(job.reclamations, 'reclamation')}"]
    for r in job.runs:
        ending = f"exit {r.exit_code}" if r.exit_code is not None else "log stops (instance gone?)"
        source = r.deadline_source or "none"
        out.append(_row("run", f"{r.run_id}  on {r.instance or '?'}, deadline from {source}, {ending}"))
        first = "?" if r.start_step is None else r.start_step
        last = "?" if r.last_step is None else r.last_step
        held = f"checkpoint step {r.checkpoint_step}" if r.checkpoint_step is not None else "no checkpoint"
        lost = f"lost {r.lost_s:g}s after it"
        if r.lost_steps is not None:
            lost += f" ({_plural(r.lost_steps, 'step')})"
        if r.steps_redone:
            lost += f" + {_plural(r.steps_redone, 'step')} redone by the next run"
        out.append(_row("", f"  steps {first}->{last}, {held}; {lost}"))
        out.append(_row("", f"  saving {r.saving_s:g}s ({_plural(r.saves, 'save')}), uploading "
                        f"{r.uploading_s:g}s ({r.uploads_completed} completed, {r.uploads_failed} failed)"))
    out.append(_row("totals", f"lost {job.lost_s:g}s of training ({_plural(job.lost_steps, 'step')}) "
                    f"when runs ended, {_plural(job.steps_redone, 'step')} redone after resuming; "
                    f"saving {job.saving_s:g}s, uploading {job.uploading_s:g}s"))
    return "\n".join(out)


# ---------------------------------------------------------------------- rendering
def to_json(runs: Sequence[RunReport], skipped: int, job: JobReport | None = None) -> str:
    document: dict[str, Any] = {"runs": [asdict(r) for r in runs], "skipped_lines": skipped}
    if job is not None:
        document["job"] = asdict(job)
    return json.dumps(document, indent=2)


def render_text(runs: Sequence[RunReport], skipped: int, job: JobReport | None = None) -> str:
    blocks = [_render_run(run) for run in runs]
    if job is not None:
        blocks.append(render_job(job))
    tail = f"({_plural(len(runs), 'run')}; {_plural(skipped, 'other line')} skipped)"
    return "\n\n".join([*blocks, tail]) + "\n"


def _render_run(run: RunReport) -> str:
    exit_text = (f"exit {run.exit_code} ({run.exit_meaning})" if run.exit_code is not None
                 else "no supervisor_exit: the log stops here (instance gone?)")
    out = [f"run {run.run_id}  {run.started_at} -> {_clock(run.ended_at)} ({run.duration_s:g}s), {exit_text}"]
    if run.command:
        out.append(_row("command", " ".join(run.command)))
    out += _render_restore(run)  # what came back before the command started
    out += _render_resume(run)  # where the run started, before what it did
    out += _render_deadline(run)
    out += _render_saves(run)
    if run.interruption_rate:
        out.append(_row("rate", run.interruption_rate))
    out += _render_steps(run)
    out += _render_stop(run)
    out += _render_verifications(run)
    out += _render_uploads(run)
    risk = run.work_at_risk
    out.append(_row("at risk", f"{risk['seconds']:g}s of training: from {_clock(risk['since'])} "
                    f"({risk['since_what']}) to {_clock(risk['until'])} ({risk['until_what']})"))
    if "note" in risk:
        out.append(_row("", risk["note"]))
    for warning in run.warnings:
        text = f"{_clock(warning['at'])} {warning['event']} {_fields(warning['fields'])}"
        out.append(_row("warning", text))
    out.append("  timeline")
    for item in run.timeline:
        out.append(f"    {item['after_start_s']:>9.3f}s  {_clock(item['at'])}  {item['event']:<20} "
                   f"{_fields(item['fields'])}".rstrip())
    return "\n".join(out)


def _render_deadline(run: RunReport) -> list[str]:
    if run.deadline is None:
        reasons = "; ".join(f"{u['source']}: {u['reason']}" for u in run.deadline_unavailable)
        return [_row("deadline", "none known" + (f" ({reasons})" if reasons else ""))]
    d = run.deadline
    rows = [_row("deadline", f"{d['at']} from {d['source']} (known {d['after_start_s']:g}s after start, "
                 f"{_num(d['remaining_s'])}s ahead)")]
    for change in run.deadline_changes:
        rows.append(_row("", f"{_clock(change['logged_at'])} changed to {change['new']} from "
                         f"{change['source']} ({_signed(change['moved_s'])}s)"))
    return rows


def _render_saves(run: RunReport) -> list[str]:
    if not run.saves and not run.trainer_saves:
        return [_row("saves", "none")]
    rows: list[str] = []
    for s in run.saves:
        head = f"{s.kind} ({s.reason}) {s.outcome}"
        if s.outcome == "completed":
            head += f", step {s.step}"
            if s.remaining_s is not None:
                head += f", {_num(s.remaining_s)}s before the deadline"
        elif s.step is not None:
            head += f" (the trainer began writing step {s.step})"
        rows.append(_row("save", head))
        signal = f"sent {_clock(s.requested_at)}"
        if s.planned_signal_at:
            signal = f"planned {_clock(s.planned_signal_at)}, {signal} ({_signed(s.signal_late_s)}s)"
            if s.first_planned_at and s.first_planned_at != s.planned_signal_at:
                signal += f"; first plan {_clock(s.first_planned_at)}"
        rows.append(_row("", f"  signal  {signal}"))
        if s.boundary_wait_s is not None:
            rows.append(_row("", f"  step    boundary {s.boundary_wait_s:g}s after the signal "
                             f"(step estimate {_num(s.step_estimate_s)}s)"))
        if s.duration_s is not None:
            estimate, done = _num(s.save_estimate_s), _clock(s.completed_at or "")
            rows.append(_row("", f"  write   {_num(s.duration_s)}s (save estimate {estimate}s), done {done}"))
    for t in run.trainer_saves:
        rows.append(_row("save", f"trainer's own, step {t['step']}, {_num(t['duration_s'])}s, "
                         f"done {_clock(t['at'])}"))
    return rows


def _render_resume(run: RunReport) -> list[str]:
    """`resumed` / `resume_missed` (a state file names the last durable checkpoint): where it started."""
    if run.resume is None:
        return []
    r = run.resume
    head = "from the checkpoint" if r["from_checkpoint"] else "RESUME MISSED"
    text = (f"{head}: started at step {r['start_step']}, the durable checkpoint holds step "
            f"{r['checkpoint_step']} ({r['steps_redone']} steps redone)")
    return [_row("resume", text), *(_row("", f"  likely: {cause}") for cause in r.get("causes") or [])]


def _render_restore(run: RunReport) -> list[str]:
    """--restore: what came back before the command started, or why nothing did."""
    r = run.restore
    if r is None or "outcome" not in r:
        return []
    step = r.get("manifest_step")
    found = f" (named by the newest manifest, step {step})" if step is not None else ""
    if r["outcome"] == "brought back":
        text = (f"step {r.get('step')} back to {r.get('path')} in {_num(r.get('seconds'))}s, attempt "
                f"{r.get('attempt')}{found}")
    elif r["outcome"] == "failed":
        text = f"FAILED, step {r.get('step')}, attempt {r.get('attempt')}: {r.get('problem')}"
    else:
        text = f"nothing to restore: {r.get('reason')}"
    return [_row("restore", text)]


def _render_verifications(run: RunReport) -> list[str]:
    rows = []
    for v in run.verifications:
        if v["outcome"] == "valid":
            what = v.get("format") or "unknown format"
            text = f"step {v['step']} valid ({what}, {_num(v.get('seconds'))}s)"
        else:
            text = f"step {v['step']} INVALID: {v.get('problem')}"
        rows.append(_row("verify", text))
    return rows


def _render_uploads(run: RunReport) -> list[str]:
    rows = []
    for u in run.uploads:
        text = f"step {u['step']} {u['outcome']} in {_num(u['duration_s'])}s, done {_clock(u['at'])}"
        if u["outcome"] == "failed":
            how = f"killed by {u['signal']}" if u.get("signal") else f"exit {u.get('code')}"
            text += f" ({u.get('reason') or how})"
        rows.append(_row("upload", text))
    return rows


def _render_steps(run: RunReport) -> list[str]:
    st = run.steps
    parts = []
    if "observed" in st:
        parts.append(f"{st['observed']} observed: mean {st['mean_s']:g}s, p99 {st['p99_s']:g}s, "
                     f"max {st['max_s']:g}s")
    if "pace_between_saves_s" in st:
        parts.append(f"{st['pace_between_saves_s']:g}s/step between saves")
    if "last_estimate_s" in st:
        parts.append(f"last estimate {_num(st['last_estimate_s'])}s")
    return [_row("steps", "; ".join(parts))] if parts else []


def _render_stop(run: RunReport) -> list[str]:
    rows = []
    if run.stop is not None:
        killed = f", SIGKILL to {run.stop['killed']}" if run.stop.get("killed") else ""
        first = [f"{t.get('signal')} to pid {t.get('pid')}" for t in run.stop.get("first", [])
                 if isinstance(t, dict)]
        if not first:
            what = f"{run.stop['signal']} to the command"
        elif run.stop.get("child_at"):
            what = (f"{', '.join(first)} first (the trainer below the command), then {run.stop['signal']} "
                    f"to the command at {_clock(run.stop['child_at'])}")
        else:
            what = f"{', '.join(first)} first (the trainer below the command); the command not signalled"
        rows.append(_row("stop", f"{_clock(run.stop['at'])} {what} ({run.stop['reason']}){killed}"))
    if run.child_exit is not None:
        how = (f"code {run.child_exit['code']}" if run.child_exit.get("signal") is None
               else f"killed by {run.child_exit['signal']}")
        rows.append(_row("child" if rows else "stop", f"{_clock(run.child_exit['at'])} exited, {how}"))
    if run.exit_code is not None:
        rows.append(_row("exit", f"{run.exit_code}: {run.exit_meaning} ({run.exit_reason})"))
    return rows


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _row(label: str, text: str) -> str:
    return f"  {label:<9} {text}"


def _clock(timestamp: Any) -> str:
    """The time of day of an ISO timestamp (the date is in the run's first line)."""
    text = timestamp if isinstance(timestamp, str) else _short(timestamp)
    return text.split("T", 1)[-1] if "T" in text else text


def _num(value: Any) -> str:
    return f"{value:g}" if _is_number(value) else "?"


def _signed(value: Any) -> str:
    return f"{value:+g}" if _is_number(value) else "?"


def _is_number(value: Any) -> bool:
    """A log value `:g` can format (not a bool, not an integer beyond any float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _fields(fields: dict[str, Any]) -> str:
    return " ".join(f"{k}={_short(v)}" for k, v in fields.items() if v is not None)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    text = text.replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def open_logs(paths: Sequence[str]) -> list[str]:
    """The lines of several logs (one per instance, say) as one log; a line that is in more than
    one of them (the same log given twice, a file and the journal) counts once."""
    if len(paths) == 1:
        return list(open_log(paths[0]))
    seen: set[str] = set()
    lines = []
    for path in paths:
        for line in open_log(path):
            key = line.strip()
            if key.startswith("{") and key in seen:
                continue
            seen.add(key)
            lines.append(line)
    return lines


def open_log(path: str) -> Iterable[str]:
    """Lines of a file, or of stdin for '-'; undecodable bytes are replaced, not fatal."""
    if path == "-":
        return iter(sys.stdin.buffer.read().decode("utf-8", "replace").splitlines())
    with open(os.path.expanduser(path), "rb") as handle:
        return iter(handle.read().decode("utf-8", "replace").splitlines())
