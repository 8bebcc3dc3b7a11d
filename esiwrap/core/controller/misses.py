"""Why no save was acknowledged: what the run knew, for the log of an exit 76 (`save_missed`)."""

from __future__ import annotations

from typing import Any

from esiwrap.core.controller.clock import ClockJump
from esiwrap.core.controller.outbox import rounded
from esiwrap.core.controller.protocol import Now
from esiwrap.core.controller.saves import SaveRequest
from esiwrap.core.policy import Observations, SavePlan
from esiwrap.times import iso_utc


def miss_facts(request: SaveRequest | None, plan: SavePlan | None, obs: Observations, now: Now,
               never_came: list[str], last_report_mono: float | None = None,
               jump: ClockJump | None = None) -> dict[str, Any]:
    """The last plan, the signal (when, to whom, how late), what was late (the last step report's
    age on the monotonic clock: a wall clock that jumped would lie), what never came, and the
    clock's last jump if there was one."""
    if request is not None and request.plan is not None:
        plan = request.plan
    return {
        "last_plan": None if plan is None else {
            "kind": plan.kind, "signal_at": iso_utc(plan.signal_at),
            "step_estimate_s": rounded(plan.step_estimate_s),
            "save_estimate_s": rounded(plan.save_estimate_s),
            "upload_estimate_s": rounded(plan.upload_estimate_s), "reserve_s": rounded(plan.reserve_s),
            "lateness_s": rounded(plan.lateness_s), "why": plan.why},
        "signal": None if request is None else {
            "reason": request.reason, "requested_at": iso_utc(request.requested_at),
            "late_s": rounded(request.requested_at - request.plan.signal_at) if request.plan else None,
            "pids": sorted(request.signalled), "step_reports_since": request.boundaries},
        "late": {"timers_max_s": rounded(obs.timer_late.max_s),
                 "reports_max_s": rounded(obs.report_delay.max_s),
                 "last_step_report_s_ago": rounded(now.mono - last_report_mono)
                 if last_report_mono is not None else None},
        "never_came": never_came,
        "clock_jump": jump.fields() if jump is not None else None,
    }


def never_came(request: SaveRequest | None, now: Now, *, attached_once: bool, savers: set[int],
               last_error: tuple[float, str] | None, cannot_save: list[str] | None = None) -> list[str]:
    """What the save waited for and did not get, first the one that decided. `cannot_save`: what
    trainers said of why they cannot save on request, when none saves (the verl hook)."""
    found: list[str] = []
    if last_error is not None:
        at, error = last_error
        found.append(f"the trainer reported a failed save {now.wall - at:.1f}s ago: "
                     f"{error or 'no error text'}")
    found.insert(0, cannot_save[0] if cannot_save else _decisive(request, now, attached_once, savers))
    return found


def _decisive(request: SaveRequest | None, now: Now, attached_once: bool, savers: set[int]) -> str:
    if not attached_once:
        return ("no trainer said hello: esiwrap.trainer.install() was never called (or the process was "
                "not esiwrap's descendant), so no process could take the save signal")
    if request is None:
        return ("no save was asked for: the deadline came before the plan's moment (learned too late, or "
                "moved earlier)")
    if not request.signalled:
        return "the save signal went to no process: no trainer was attached when the save was due"
    if not request.begun and request.boundaries:
        return (f"no save_begin: the trainer reported {request.boundaries} step(s) after the save signal "
                "without saving (is esi.save_requested() checked at each boundary?)")
    if not request.begun:
        return (f"no step boundary came after the save signal ({now.wall - request.requested_at:.1f}s "
                "before the deadline): the step in progress ran longer than the plan allowed")
    if not request.done:
        started = request.save_started_at or request.requested_at
        return (f"save_begin came {now.wall - started:.1f}s before the deadline, save_end never came: the "
                "save took longer than planned")
    return f"save_end came from some ranks, not from {sorted(savers - set(request.done))}"
