"""Named timers: each part says what it waits for, and one order says which fires first.

A part returns its `Timer`s for the current mode (`timers(...)` on each part); the controller asks
them all, sleeps until the earliest (`wait_s`) and fires the due one that comes first in
`FIRING_ORDER` (`first_due`), again until none is due. Wall-clock timers are deadlines and the
moments planned against them; monotonic ones are waits and grace periods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

from esiwrap.core.controller.protocol import Now

Clock = Literal["wall", "mono"]
TimerName = Literal[
    "upload retry", "upload cut-off", "linger", "ack wait", "stop", "child stop", "deadline",
    "unattached stop", "save signal", "storage probe", "upload decision", "heartbeat", "overstay",
    "verify cut-off", "restore cut-off", "restore retry",
]

FIRING_ORDER: tuple[TimerName, ...] = (
    "upload retry",  # any mode: a failed upload's next attempt
    "upload cut-off",  # UPLOADING: the last upload's wait, then its SIGTERM and SIGKILL
    "verify cut-off",  # any mode: a verification that runs too long (VERIFYING: past the cut-off) is given up
    "restore cut-off",  # STARTING: the restore must end for the insurance save to fit
    "restore retry",  # STARTING: a failed restore's next attempt
    "linger",  # CONTINUING (--after-save linger): the latest moment the stop may begin
    "ack wait",  # DRAINING: the wait for the save's acknowledgement
    "stop",  # STOPPING, KILLING: the grace period, the wait after SIGKILL
    "child stop",  # STOPPING: the trainers stopped first exited, the child has not: its stop signal
    "deadline",  # RUNNING, SAVE_REQUESTED: the deadline itself
    "unattached stop",  # SAVE_REQUESTED: the latest graceful stop with no trainer to save
    "save signal",  # RUNNING: the planned save's signal
    "storage probe",  # RUNNING: measure the storage again while no save is measured
    "upload decision",  # RUNNING: the latest stop while the plan waits for an upload's end
    "heartbeat",  # until exited, with a state file: this run's record refreshed (its exposure)
    "overstay",  # until exited: still here a minute past the deadline, ask the sources again
)
"""Which due timer fires first: the order the supervisor has always fired them in."""

_RANK = {name: rank for rank, name in enumerate(FIRING_ORDER)}


class Timer(NamedTuple):
    name: TimerName
    clock: Clock
    at: float  # on its clock


def _now_on(clock: Clock, now: Now) -> float:
    return now.wall if clock == "wall" else now.mono


def wait_s(timers: Iterable[Timer], now: Now) -> float | None:
    """Seconds from `now` until the earliest timer (0: due now), or None when there is none."""
    waits = [timer.at - _now_on(timer.clock, now) for timer in timers]
    return max(0.0, min(waits)) if waits else None


def first_due(timers: Iterable[Timer], now: Now) -> Timer | None:
    """The due timer that fires first, or None when none is due."""
    due = [timer for timer in timers if _now_on(timer.clock, now) >= timer.at]
    return min(due, key=lambda timer: _RANK[timer.name], default=None)
