"""`esiwrap report LOG --what-if 'OPTIONS'`: this run's measured steps and saves, replayed with other
settings through esiwrap's own decision core (`esiwrap.tools.replay`).

From one run's log: the step intervals (`step_observed`, logged with `--log-level debug`; without
them, steps at the pace between its first and last save, else the one its plans measured), the
save durations (`save_completed`), the deadline and its changes as they were learned, the
settings the run had (the first event with a `settings` field: `child_started`'s), what the state
file told it (`state_loaded`: the longest save and upload an earlier run measured). The run's
time starts when the first trainer attached, and its steps are numbered from the step the
trainer started at (`resumed` / `resume_missed`, else the first `step_observed`, else estimated
from the first save), so a resumed run's saves are the steps the trainer saved. The capacity is
taken to go at the last deadline the run knew (a log cannot say whether it went earlier). Three
outcomes side by side: what happened, the replay with the run's own settings (how well the replay
describes the run) and the replay with the settings asked for.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from esiwrap import events as ev
from esiwrap.errors import UsageError
from esiwrap.times import iso_epoch
from esiwrap.tools.replay import DeadlineChange, Outcome, Trace, replay

if TYPE_CHECKING:
    from esiwrap.core.controller import ControllerConfig

Event = dict[str, Any]
Configure = Callable[[Mapping[str, Any], str], "ControllerConfig"]
"""The controller's configuration from a run's settings (option flag -> value, as its log holds
them) with run options on top (`esiwrap.cli.options.config_with`); a bad option is a UsageError."""


class WhatIfError(ValueError):
    """The log cannot be replayed, or the options are not esiwrap's; the message says why."""


@dataclass(frozen=True)
class Side:
    """One column: which saves held which step, the checkpoint kept, the work lost."""

    saves: tuple[tuple[str, int, float], ...]  # (kind, step, seconds after the start it was durable)
    saved_step: int | None
    lost_s: float
    missed: bool


@dataclass(frozen=True)
class WhatIf:
    options: str
    steps_measured: int
    saves_measured: int
    exact_steps: bool
    actual: Side
    as_run: Side
    what_if: Side
    start_step: int = 0  # the step the trainer started at: the replay's first step is the next
    start_from: str = ""  # how that is known: AS_RESUMED, BEFORE_FIRST_STEP or ESTIMATED

    def to_dict(self) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            saves = [{"kind": k, "step": n, "durable_after_s": round(at, 3)} for k, n, at in s.saves]
            return {"saves": saves, "saved_step": s.saved_step, "lost_s": round(s.lost_s, 3),
                    "missed": s.missed}

        return {"options": self.options, "steps_measured": self.steps_measured,
                "saves_measured": self.saves_measured, "exact_steps": self.exact_steps,
                "start_step": self.start_step, "start_from": self.start_from,
                "actual": side(self.actual), "replayed_as_run": side(self.as_run),
                "what_if": side(self.what_if)}


def what_if(run: Sequence[Event], options: str, configure: Configure) -> WhatIf:
    """Replay one run's events with `options` (esiwrap's run options, as on its command line),
    read into the controller's configuration by `configure`."""
    settings = _run_settings(run)
    try:
        as_run, asked = configure(settings, ""), configure(settings, options)
    except UsageError as exc:
        raise WhatIfError(str(exc)) from None
    start = iso_epoch(_first(run, ev.TRAINER_ATTACHED, ev.CHILD_STARTED)["timestamp"])
    trace, exact, saves_measured, start_from = _trace(run, start, settings)
    return WhatIf(
        options=options, steps_measured=sum(1 for e in run if e["event"] == ev.STEP_OBSERVED),
        saves_measured=saves_measured, exact_steps=exact, actual=_actual(run, trace, start),
        as_run=_side(replay(trace, as_run)), what_if=_side(replay(trace, asked)),
        start_step=trace.start_step, start_from=start_from,
    )


def render(result: WhatIf) -> str:
    rows = [("saves", _saves_text), ("checkpoint", _checkpoint_text), ("work lost", _lost_text),
            ("missed", lambda s: "yes" if s.missed else "no")]
    sides = (result.actual, result.as_run, result.what_if)
    head = ["", "actual", "replayed as run", f"what if {result.options}"]
    table = [head] + [[name, *(fmt(s) for s in sides)] for name, fmt in rows]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    steps = ("step times as logged" if result.exact_steps
             else "no step_observed (run with --log-level debug for step times): steps at one pace, "
             "that between its saves")
    start = f" from step {result.start_step} ({result.start_from})" if result.start_step else ""
    lines = [f"  what if   {result.options}: replayed {result.steps_measured} steps{start} and "
             f"{result.saves_measured} measured saves ({steps})"]
    lines += ["    " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
              for row in table]
    lines.append("    work lost: the run's time up to the deadline that its checkpoint does not hold "
                 "(`at risk`: up to the run's end)")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- the trace
# How the step a run started at is known, most certain first (`WhatIf.start_from`).
AS_RESUMED = "as the trainer started"  # `resumed` / `resume_missed` (a state file)
BEFORE_FIRST_STEP = "before the first step logged"  # the first `step_observed` (debug)
ESTIMATED = "estimated from the first save"  # its step less the steps at the pace until it began


def _trace(run: Sequence[Event], start: float, settings: Mapping[str, Any]) -> tuple[Trace, bool, int, str]:
    learned = (ev.DEADLINE_RESOLVED, ev.DEADLINE_CHANGED)
    deadlines = [(iso_epoch(e["timestamp"]), iso_epoch(_deadline_of(e)))
                 for e in run if e["event"] in learned]
    if not deadlines:
        msg = "no deadline in this run: there is nothing to replay against"
        raise WhatIfError(msg)
    first_at = deadlines[0][1] - start
    changes = [DeadlineChange(max(0.0, at - start), new - start) for at, new in deadlines[1:]]
    reclaim_at = deadlines[-1][1] - start
    measured = [float(e["duration_s"]) for e in run
                if e["event"] == ev.STEP_OBSERVED and isinstance(e.get("duration_s"), (int, float))]
    pace = statistics.median(measured) if measured else _pace_between_saves(run) or _planned_pace(run)
    steps = list(measured)
    while sum(steps) <= max(reclaim_at, first_at) + pace:  # the steps the run did not live to make
        steps.append(pace)
    start_step, start_from = _start_step(run, start, pace)
    last = max(_steps_named(run), default=start_step)
    steps += [pace] * (last - start_step - len(steps))  # every step the log names is in the trace
    guess_s = float(settings.get("--save-duration", 60.0))
    saves = _by_step(run, ev.SAVE_COMPLETED, start_step, len(steps), guess_s)
    uploads = None
    if settings.get("--upload"):  # --upload: a checkpoint's upload takes what the nearest one took
        guess = float(settings.get("--upload-duration", 60.0))
        uploads = _by_step(run, ev.UPLOAD_COMPLETED, start_step, len(steps), guess)
    trace = Trace("log", steps, saves, first_at, reclaim_at, changes, uploads=uploads, start_step=start_step,
                  **_knowledge(run))
    return trace, bool(measured), sum(1 for e in run if e["event"] == ev.SAVE_COMPLETED), start_from


def _start_step(run: Sequence[Event], start: float, pace: float) -> tuple[int, str]:
    """The step the trainer started at (its first step is the next) and how that is known; 0 with
    "" when the log names no step."""
    for event in run:
        if event["event"] in (ev.RESUMED, ev.RESUME_MISSED) and _is_step(event.get("start_step")):
            return max(0, int(event["start_step"])), AS_RESUMED
    observed = next((e["step"] for e in run
                     if e["event"] == ev.STEP_OBSERVED and _is_step(e.get("step"))), None)
    if observed is not None:
        return max(0, int(observed) - 1), BEFORE_FIRST_STEP
    save = next((e for e in run if e["event"] in (ev.SAVE_STARTED, ev.SAVE_COMPLETED)
                 and _is_step(e.get("step"))), None)
    if save is None:
        return 0, ""
    began = iso_epoch(save["timestamp"]) - start - float(save.get("duration_s") or 0.0)
    return max(0, int(save["step"]) - max(1, round(began / pace))), ESTIMATED


def _steps_named(run: Sequence[Event]) -> list[int]:
    return [int(e["step"]) for e in run if e["event"] in (ev.STEP_OBSERVED, ev.SAVE_COMPLETED)
            and _is_step(e.get("step"))]


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _knowledge(run: Sequence[Event]) -> dict[str, Any]:
    """What the run knew before its first save: the checkpoint's size (the hellos), the storage's
    speed (the first probe that measured one), the capacity's kind (the deadline's source) and the
    notice a source watched for."""
    known: dict[str, Any] = {}
    sizes = [float(e["checkpoint_bytes"]) for e in run if e["event"] == ev.TRAINER_ATTACHED
             and isinstance(e.get("checkpoint_bytes"), (int, float)) and e["checkpoint_bytes"] > 0]
    if sizes:
        known["checkpoint_bytes"] = sum(sizes)
    speeds = [float(e["bandwidth_mb_s"]) * 1e6 for e in run if e["event"] == ev.STORAGE_PROBED
              and isinstance(e.get("bandwidth_mb_s"), (int, float)) and e["bandwidth_mb_s"] > 0]
    if speeds:
        known["probe_bps"] = min(speeds)
    kinds = [e.get("capacity") for e in run if e["event"] in (ev.DEADLINE_RESOLVED, ev.DEADLINE_CHANGED)]
    for kind in ("spot", "reserved", "on-demand"):
        if kind in kinds:
            known["capacity"] = kind
            break
    notices = [e["notice_s"] for e in run if e["event"] in (ev.DEADLINE_RESOLVED, ev.DEADLINE_CHANGED)
               and isinstance(e.get("notice_s"), (int, float)) and e["notice_s"] > 0]
    if notices:
        known["notice_s"] = float(notices[-1])  # the notice watched when the deadline last moved
    loaded = next((e for e in run if e["event"] == ev.STATE_LOADED), {})
    for field_, prior in (("longest_save_s", "prior_saves"), ("longest_upload_s", "prior_uploads")):
        longest = loaded.get(field_)
        if isinstance(longest, (int, float)) and longest > 0:  # what plans took from the state file
            known[prior] = (float(longest),)
    return known


def _deadline_of(event: Event) -> str:
    return str(event["deadline"] if event["event"] == ev.DEADLINE_RESOLVED else event["new"])


def _pace_between_saves(run: Sequence[Event]) -> float | None:
    """The time a step took between the first save begun and the last, less the saves' own: what
    the run did between two known steps (the plans' step estimates are a high quantile)."""
    begun = [(iso_epoch(e["timestamp"]), int(e["step"])) for e in run
             if e["event"] == ev.SAVE_STARTED and _is_step(e.get("step"))]
    if len(begun) < 2 or begun[-1][1] <= begun[0][1]:
        return None
    (first_at, first), (last_at, last) = begun[0], begun[-1]
    saving = sum(float(e["duration_s"]) for e in run if e["event"] == ev.SAVE_COMPLETED
                 and _is_step(e.get("step")) and first <= e["step"] < last
                 and isinstance(e.get("duration_s"), (int, float)))
    pace = (last_at - first_at - saving) / (last - first)
    return pace if pace > 0 else None


def _planned_pace(run: Sequence[Event]) -> float:
    estimates = [float(e["step_estimate_s"]) for e in run
                 if e["event"] == ev.SAVE_SCHEDULED and isinstance(e.get("step_estimate_s"), (int, float))
                 and e["step_estimate_s"] > 0]
    if not estimates:
        msg = "the log has neither step_observed nor a planned step time: run with --log-level debug"
        raise WhatIfError(msg)
    return statistics.median(estimates)


def _by_step(run: Sequence[Event], event: str, start_step: int, count: int, guess_s: float) -> list[float]:
    """For each of the trace's steps (start_step + 1 on): a save (an upload) of that step takes what
    the measured one nearest to it took, the guess if none was."""
    measured = [(int(e["step"]), float(e["duration_s"])) for e in run
                if e["event"] == event and isinstance(e.get("step"), int)
                and isinstance(e.get("duration_s"), (int, float))]
    if not measured:
        return [guess_s] * count
    steps = range(start_step + 1, start_step + count + 1)
    return [min(measured, key=lambda m: abs(m[0] - k))[1] for k in steps]


# ---------------------------------------------------------------------------------- outcomes
def _actual(run: Sequence[Event], trace: Trace, start: float) -> Side:
    done = [e for e in run if e["event"] == ev.SAVE_COMPLETED and isinstance(e.get("step"), int)
            and iso_epoch(e["timestamp"]) - start <= trace.reclaim_at]
    saves = tuple((str(e.get("kind") or "own"), int(e["step"]), iso_epoch(e["timestamp"]) - start)
                  for e in done)
    saved = max((s[1] for s in saves), default=None)
    boundaries = trace.boundaries()
    index = trace.index(saved) if saved is not None else -1
    progress = boundaries[index] if 0 <= index < len(boundaries) else 0.0  # its step's boundary, this run
    return Side(saves, saved, trace.reclaim_at - progress, saved is None)


def _side(outcome: Outcome) -> Side:
    saves = tuple((w.kind or "own", w.step, w.durable) for w in outcome.completed)
    return Side(saves, outcome.saved_step, outcome.lost_s, outcome.missed)


def _saves_text(side: Side) -> str:
    return ", ".join(f"{kind} {step}" for kind, step, _ in side.saves) or "none"


def _checkpoint_text(side: Side) -> str:
    if side.saved_step is None:
        return "none"
    at = max(at for _, step, at in side.saves if step == side.saved_step)
    return f"step {side.saved_step} at +{at:.1f}s"


def _lost_text(side: Side) -> str:
    return f"{side.lost_s:.1f}s" + (" (all of it)" if side.missed else "")


# ---------------------------------------------------------------------------------- settings
def _run_settings(run: Sequence[Event]) -> dict[str, Any]:
    """The run options the run had, by flag: the `settings` event's field of the same name (an
    older esiwrap put it in `child_started`)."""
    _first(run, ev.CHILD_STARTED)
    field = ev.SETTINGS
    settings: dict[str, Any] = next((e[field] for e in run if e["event"] in (ev.SETTINGS, ev.CHILD_STARTED)
                                     and isinstance(e.get(field), dict)), {})
    return dict(settings)


def _first(run: Sequence[Event], *names: str) -> Event:
    for name in names:
        for event in run:
            if event["event"] == name:
                return event
    msg = f"the log has no {names[0]} event for this run"
    raise WhatIfError(msg)
