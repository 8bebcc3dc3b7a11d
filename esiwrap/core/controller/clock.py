"""The wall clock, checked against the monotonic one at every call of the controller.

Deadlines are on the wall clock, waits on the monotonic one, and the shell hands both in with
every input (`Now`). Between two calls both must move alike; when the wall clock moved more than
`CLOCK_JUMP_S` more or less than the monotonic one, it jumped: forward, the machine was paused or
snapshotted (its monotonic clock stood still while the host's time went on: seen on this project's
own CI, 40 s) or the wall clock was stepped (NTP); back, it was stepped. esiwrap follows the wall
clock (the deadline is on it), so the plan moves; `clock_jumped` says why, and the next plan's
`why` and an exit 76's diagnosis name the jump.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from esiwrap import events as ev
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import Now
from esiwrap.times import iso_utc

CLOCK_JUMP_S = 2.0  # a wall clock that moves this much more (or less) than the monotonic one jumped


class ClockJump(NamedTuple):
    jump_s: float  # + forward, - back
    at: float  # the wall time after it
    elapsed_s: float  # how far the monotonic clock moved meanwhile

    @property
    def likely_cause(self) -> str:
        if self.jump_s > 0:
            return ("the machine was paused or snapshotted (its monotonic clock stood still), or the wall "
                    "clock was stepped forward (NTP, a manual set)")
        return "the wall clock was stepped back (NTP, a manual set)"

    def words(self) -> str:
        return f"the wall clock jumped {self.jump_s:+.1f}s at {iso_utc(self.at)}"

    def fields(self) -> dict[str, Any]:
        return {"jump_s": rounded(self.jump_s), "at": iso_utc(self.at)}


class ClockCheck:
    """The last moment seen; `check` compares the next one with it."""

    def __init__(self, out: Outbox) -> None:
        self._out = out
        self._last: Now | None = None
        self.latest: ClockJump | None = None  # the newest jump, for the plan's why and a miss

    def check(self, now: Now) -> ClockJump | None:
        """The jump since the last call, logged (None: the clocks moved alike)."""
        last, self._last = self._last, now
        if last is None:
            return None
        elapsed = now.mono - last.mono
        jump = (now.wall - last.wall) - elapsed
        if abs(jump) <= CLOCK_JUMP_S:
            return None
        self.latest = found = ClockJump(jump, now.wall, elapsed)
        self._out.log("warning", ev.CLOCK_JUMPED, jump_s=rounded(jump),
                      direction="forward" if jump > 0 else "back",
                      wall_expected=iso_utc(last.wall + elapsed), wall_now=iso_utc(now.wall),
                      monotonic_elapsed_s=rounded(elapsed), likely_cause=found.likely_cause)
        return found
