"""The range a deadline must fall in before anything plans with it.

Every value, whatever its source, must lie between `EARLIEST` and `HORIZON_S` from now:

* not before 2000-01-01T00:00:00Z: no capacity esiwrap supervises was bought before it, so an
  earlier value is a unit mistake (`--deadline 90` read as epoch seconds is 1970-01-01T00:01:30Z),
  never a real expiry. A deadline between 2000 and now is plausible: it was learned too late, and
  the supervisor saves at once;
* not more than 10 years ahead: the longest reservations sold (3-5 year subscriptions) end well
  within it, while a value beyond it is garbage (an epoch in microseconds, `1e300`, the year
  9999) that would also break the clock arithmetic and date formatting further on.

Pure functions of their arguments: time enters as `now`.
"""

from __future__ import annotations

import math

from esiwrap.deadline.value import iso_utc, utc_datetime

EARLIEST = 946_684_800.0  # 2000-01-01T00:00:00Z
HORIZON_YEARS = 10
HORIZON_S = HORIZON_YEARS * 365.25 * 86400.0


def implausible(at: float, now: float) -> str | None:
    """Why `at` (epoch seconds) cannot be a deadline seen at `now`; None when it can."""
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return f"{at!r} is not a finite time"
    if at < EARLIEST:
        return f"{describe(at)} is before 2000-01-01"
    if at > now + HORIZON_S:
        return f"{describe(at)} is more than {HORIZON_YEARS} years ahead"
    return None


def describe(at: float) -> str:
    """The moment for a message: ISO-8601 UTC, where a calendar date exists."""
    if utc_datetime(at) is not None:
        return iso_utc(at)
    return f"epoch {at:.6g} (beyond the year 9999)" if at > 0 else f"epoch {at:.6g} (before the year 1)"
