"""The one line `systemctl status` shows for a job: pure text from what the supervisor knows.

It comes in two parts. The stable part (deadline, source, planned save, save in progress, stop)
changes rarely and is sent at once; the volatile part (time left, last step) changes all the time
and is refreshed at most every few seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from esiwrap.deadline.value import iso_utc


@dataclass(frozen=True)
class StatusFacts:
    now: float
    phase: str  # the controller's mode: running | … | stopping | killing | uploading
    deadline_at: float | None = None
    source: str | None = None
    deadline_pending: bool = False  # the sources have not all answered yet
    plan_kind: str | None = None
    signal_at: float | None = None  # the planned save signal, as last logged
    request_kind: str | None = None  # a save was asked for and is not acknowledged yet
    saving_step: int | None = None  # ...and the trainer has begun writing it
    last_saved_step: int | None = None
    last_step: int | None = None
    step_estimate_s: float | None = None
    stop_reason: str | None = None
    awaiting_ack: bool = False  # stopping after the save in progress (SIGTERM, late deadline)


def status_parts(facts: StatusFacts) -> tuple[str, str]:
    """(stable, volatile) halves of the status line."""
    stable = [_deadline(facts), *_save(facts)]
    if facts.last_saved_step is not None:
        stable.append(f"checkpoint at step {facts.last_saved_step}")
    volatile = []
    if facts.deadline_at is not None:
        volatile.append(f"{human_duration(facts.deadline_at - facts.now)} left")
    if facts.signal_at is not None and facts.request_kind is None and facts.phase == "running":
        volatile.append(f"save in {human_duration(facts.signal_at - facts.now)}")
    if facts.last_step is not None:
        pace = f" (~{facts.step_estimate_s:.3g}s/step)" if facts.step_estimate_s else ""
        volatile.append(f"step {facts.last_step}{pace}")
    return ", ".join(stable), ", ".join(volatile)


def _deadline(facts: StatusFacts) -> str:
    if facts.deadline_at is None:
        return "resolving the deadline" if facts.deadline_pending else "no deadline known"
    return f"deadline {iso_utc(facts.deadline_at, 'seconds')} ({facts.source})"


def _save(facts: StatusFacts) -> list[str]:
    if facts.phase in ("stopping", "killing"):
        return [f"stopping: {facts.stop_reason}"]
    if facts.phase == "uploading":
        return ["stopped; waiting for the last checkpoint's upload (--upload)"]
    parts = []
    if facts.awaiting_ack:
        parts.append("stop requested, waiting for the checkpoint")
    if facts.saving_step is not None:
        parts.append(f"writing {facts.request_kind} checkpoint of step {facts.saving_step}")
    elif facts.request_kind is not None:
        parts.append(f"{facts.request_kind} save requested")
    elif facts.phase == "continuing":
        parts.append("planned saves done, training continues")
    elif facts.signal_at is not None:
        parts.append(f"{facts.plan_kind} save at {iso_utc(facts.signal_at, 'seconds')}")
    return parts


def human_duration(seconds: float) -> str:
    """90 -> '90s', 2520 -> '42m', 18180 -> '5h03m', 190800 -> '2d05h'; negative: 'overdue 5s'."""
    if not math.isfinite(seconds) or abs(seconds) >= 1e10:  # centuries: not a duration to show
        return "?"
    if seconds < 0:
        return "overdue " + human_duration(-seconds)
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    if whole < 172800:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
