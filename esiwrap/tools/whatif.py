"""`esiwrap report LOG --what-if 'OPTIONS'`: this run's measured steps and saves, replayed with other
settings through esiwrap's own decision core (`esiwrap.tools.replay`).

From one run's log: the step intervals (`step_observed`, logged with `--log-level debug`; without
them, steps at the pace the saves' plans measured), the save durations (`save_completed`), the
deadline and its changes as they were learned, the settings the run had (`child_started`'s
`settings`). The run's time starts when the first trainer attached. The capacity is taken to go at
the last deadline the run knew (a log cannot say whether it went earlier). Three outcomes side by
side: what happened, the replay with the run's own settings (how well the replay describes the run)
and the replay with the settings asked for.
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

    def to_dict(self) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            saves = [{"kind": k, "step": n, "durable_after_s": round(at, 3)} for k, n, at in s.saves]
            return {"saves": saves, "saved_step": s.saved_step, "lost_s": round(s.lost_s, 3),
                    "missed": s.missed}

        return {"options": self.options, "steps_measured": self.steps_measured,
                "saves_measured": self.saves_measured, "exact_steps": self.exact_steps,
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
    trace, exact, saves_measured = _trace(run, start, settings)
    return WhatIf(
        options=options, steps_measured=sum(1 for e in run if e["event"] == ev.STEP_OBSERVED),
        saves_measured=saves_measured, exact_steps=exact, actual=_actual(run, trace, start),
        as_run=_side(replay(trace, as_run)), what_if=_side(replay(trace, asked)),
    )


def render(result: WhatIf) -> str:
    rows = [("saves", _saves_text), ("checkpoint", _checkpoint_text), ("work lost", _lost_text),
            ("missed", lambda s: "yes" if s.missed else "no")]
    sides = (result.actual, result.as_run, result.what_if)
    head = ["", "actual", "replayed as run", f"what if {result.options}"]
    table = [head] + [[name, *(fmt(s) for s in sides)] for name, fmt in rows]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    steps = ("step times as logged" if result.exact_steps
             else "no step_observed (run with --log-level debug for step times): steps at the planned pace")
    lines = [f"  what if   {result.options}: replayed {result.steps_measured} steps and "
             f"{result.saves_measured} measured saves ({steps})"]
    lines += ["    " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
              for row in table]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- the trace
def _trace(run: Sequence[Event], start: float, settings: Mapping[str, Any]) -> tuple[Trace, bool, int]:
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
    pace = statistics.median(measured) if measured else _planned_pace(run)
    steps = list(measured)
    while sum(steps) <= max(reclaim_at, first_at) + pace:  # the steps the run did not live to make
        steps.append(pace)
    saves = _saves_by_step(run, len(steps), float(settings.get("--save-duration", 60.0)))
    uploads = None
    if settings.get("--upload"):  # --upload: a checkpoint's upload takes what the nearest one took
        guess = float(settings.get("--upload-duration", 60.0))
        uploads = _by_step(run, ev.UPLOAD_COMPLETED, len(steps), guess)
    trace = Trace("log", steps, saves, first_at, reclaim_at, changes, uploads=uploads, **_knowledge(run))
    return trace, bool(measured), sum(1 for e in run if e["event"] == ev.SAVE_COMPLETED)


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
    return known


def _deadline_of(event: Event) -> str:
    return str(event["deadline"] if event["event"] == ev.DEADLINE_RESOLVED else event["new"])


def _planned_pace(run: Sequence[Event]) -> float:
    estimates = [float(e["step_estimate_s"]) for e in run
                 if e["event"] == ev.SAVE_SCHEDULED and isinstance(e.get("step_estimate_s"), (int, float))
                 and e["step_estimate_s"] > 0]
    if not estimates:
        msg = "the log has neither step_observed nor a planned step time: run with --log-level debug"
        raise WhatIfError(msg)
    return statistics.median(estimates)


def _saves_by_step(run: Sequence[Event], count: int, guess_s: float) -> list[float]:
    """A save at step k takes what the measured save nearest to k took (the guess if none was)."""
    return _by_step(run, ev.SAVE_COMPLETED, count, guess_s)


def _by_step(run: Sequence[Event], event: str, count: int, guess_s: float) -> list[float]:
    measured = [(int(e["step"]), float(e["duration_s"])) for e in run
                if e["event"] == event and isinstance(e.get("step"), int)
                and isinstance(e.get("duration_s"), (int, float))]
    if not measured:
        return [guess_s] * count
    return [min(measured, key=lambda m: abs(m[0] - k))[1] for k in range(1, count + 1)]


# ---------------------------------------------------------------------------------- outcomes
def _actual(run: Sequence[Event], trace: Trace, start: float) -> Side:
    done = [e for e in run if e["event"] == ev.SAVE_COMPLETED and isinstance(e.get("step"), int)
            and iso_epoch(e["timestamp"]) - start <= trace.reclaim_at]
    saves = tuple((str(e.get("kind") or "own"), int(e["step"]), iso_epoch(e["timestamp"]) - start)
                  for e in done)
    saved = max((s[1] for s in saves), default=None)
    boundaries = trace.boundaries()
    progress = boundaries[saved - 1] if saved is not None and saved <= len(boundaries) else 0.0
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
    started = _first(run, ev.CHILD_STARTED)
    settings = started.get("settings")
    return dict(settings) if isinstance(settings, dict) else {}


def _first(run: Sequence[Event], *names: str) -> Event:
    for name in names:
        for event in run:
            if event["event"] == name:
                return event
    msg = f"the log has no {names[0]} event for this run"
    raise WhatIfError(msg)
