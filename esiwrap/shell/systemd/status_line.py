"""The one line `systemctl status` shows for a job: pure text from the controller's `Snapshot`
(the one view of its state, which also feeds the metrics and `esiwrap status`).

It comes in two parts. The stable part (deadline, source, planned save, save in progress, stop)
changes rarely and is sent at once; the volatile part (time left, last step) changes all the time
and is refreshed at most every few seconds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from esiwrap.times import iso_utc

if TYPE_CHECKING:
    from esiwrap.core.snapshot import Snapshot


def status_parts(snapshot: Snapshot) -> tuple[str, str]:
    """(stable, volatile) halves of the status line, as of the snapshot's time."""
    s = snapshot
    stable = [_deadline(s), *_save(s)]
    if s.last_checkpoint_step is not None:
        stable.append(f"checkpoint at step {s.last_checkpoint_step}")
    volatile = []
    if s.deadline_at is not None:
        volatile.append(f"{human_duration(s.deadline_at - s.time)} left")
    if s.next_save_at is not None and s.requested_save_kind is None and s.phase == "running":
        volatile.append(f"save in {human_duration(s.next_save_at - s.time)}")
    if s.last_step is not None:
        pace = f" (~{s.step_estimate_s:.3g}s/step)" if s.step_estimate_s else ""
        volatile.append(f"step {s.last_step}{pace}")
    return ", ".join(stable), ", ".join(volatile)


def _deadline(s: Snapshot) -> str:
    if s.deadline_at is None:
        return "resolving the deadline" if s.deadline_pending else "no deadline known"
    return f"deadline {iso_utc(s.deadline_at, 'seconds')} ({s.deadline_source})"


def _save(s: Snapshot) -> list[str]:
    if s.phase in ("stopping", "killing"):
        return [f"stopping: {s.stop_reason}"]
    if s.phase == "uploading":
        return ["stopped; waiting for the last checkpoint's upload (--upload)"]
    if s.phase == "verifying":
        return ["stopped; verifying the last checkpoint"]
    if s.phase == "starting":
        return ["restoring the checkpoint before the command starts (--restore)"]
    parts = []
    if s.phase == "draining":  # stopping after the save in progress (SIGTERM, a late deadline)
        parts.append("stop requested, waiting for the checkpoint")
    if s.saving_step is not None:
        parts.append(f"writing {s.requested_save_kind} checkpoint of step {s.saving_step}")
    elif s.requested_save_kind is not None:
        parts.append(f"{s.requested_save_kind} save requested")
    elif s.phase == "continuing":
        parts.append("planned saves done, training continues")
    elif s.next_save_at is not None:
        parts.append(f"{s.next_save_kind} save at {iso_utc(s.next_save_at, 'seconds')}")
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
