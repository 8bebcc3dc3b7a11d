"""Moments in time as people and clouds write them: one home for reading and writing them.

* writing: `iso_utc` (the one way esiwrap writes a moment: logs, reports, systemd status),
  `iso_epoch` (a log read back), `utc_datetime`;
* plausibility: the range every deadline must fall in before anything plans with it
  (`implausible`): not before 2000-01-01 (an earlier value is a unit mistake: `--deadline 90` read
  as epoch seconds is 1970-01-01T00:01:30Z), not more than 10 years ahead (an epoch in
  microseconds, `1e300`, the year 9999 would break the clock arithmetic further on). A deadline
  between 2000 and now is plausible: it was learned too late, and the supervisor saves at once;
* parsing: epoch seconds or milliseconds (told apart by magnitude), ISO-8601 / RFC 3339 with an
  offset or `Z`, and relative `+90s`, `+15m`, `+2h`, `+1d` (relative to `now`, an argument).
  `parse_when` also holds the result to the plausible range; every parser returns a float or
  raises `TimeParseError`, whatever the text.

Pure functions of their arguments: time enters as `now`.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Literal

EARLIEST = 946_684_800.0  # 2000-01-01T00:00:00Z
HORIZON_YEARS = 10
HORIZON_S = HORIZON_YEARS * 365.25 * 86400.0


# ---------------------------------------------------------------------------------- writing
def iso_utc(epoch_s: float, timespec: Literal["milliseconds", "seconds"] = "milliseconds") -> str:
    """Epoch seconds as ISO-8601 UTC, e.g. 2026-11-30T02:15:11.123Z (`timespec="seconds"`:
    2026-11-30T02:15:11Z): the one way esiwrap writes a moment (logs, reports, systemd status).

    Never raises: a value with no calendar date between the years 1 and 9999 (or not a number)
    is written as `epoch <value>`.
    """
    moment = utc_datetime(epoch_s)
    if moment is None:
        return f"epoch {epoch_s!r}"
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def iso_epoch(timestamp: str) -> float:
    """Epoch seconds of an ISO-8601 timestamp, as `iso_utc` writes it (a log read back); a naive
    time is UTC. ValueError for anything else. (A deadline a person typed is `parse.parse_iso`:
    stricter, with messages that say how to fix it.)"""
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    except (OverflowError, TypeError, AttributeError) as exc:
        raise ValueError(str(exc)) from None


def utc_datetime(epoch_s: float) -> datetime | None:
    """The UTC moment, or None where `datetime` (years 1..9999) or the platform cannot hold it."""
    try:
        return datetime.fromtimestamp(epoch_s, tz=timezone.utc)
    except (OverflowError, OSError, ValueError, TypeError):
        return None


# ---------------------------------------------------------------------------------- plausibility
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


# ---------------------------------------------------------------------------------- parsing
MAX_DURATION_S = HORIZON_S  # longer than any run; keeps every timer finite

_HINT = "use ISO-8601 like 2026-09-14T20:30:00+08:00, epoch seconds, or +2h"
_RELATIVE = re.compile(r"^\+\s*(\d+(?:\.\d+)?)\s*([smhd]?)$", re.IGNORECASE)
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
# Epoch values at or above this are milliseconds: 1e11 s is the year 5138, 1e11 ms is 1973.
_MS_THRESHOLD = 1e11
_ISO_SHAPE = re.compile(r"^\d{4}-\d{1,2}-\d{1,2}")


class TimeParseError(ValueError):
    """The text is not a moment in time; the message says why and what would be."""


def parse_epoch(text: str) -> float:
    """Epoch seconds or milliseconds (floats and surrounding whitespace tolerated)."""
    stripped = text.strip()
    if not _NUMBER.match(stripped):
        msg = "not a number of epoch seconds or milliseconds"
        raise TimeParseError(msg)
    value = float(stripped)
    if not math.isfinite(value) or value <= 0:
        msg = "not a positive epoch time"
        raise TimeParseError(msg)
    return value / 1000.0 if value >= _MS_THRESHOLD else value


def parse_duration(text: str) -> float:
    """Seconds, with an optional unit: `90`, `90s`, `15m`, `2h`, `1d`."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", text, re.IGNORECASE)
    if not match:
        msg = "not a duration; use seconds like 90, or 90s, 15m, 2h"
        raise TimeParseError(msg)
    seconds = float(match.group(1)) * _UNIT_S[match.group(2).lower()]
    if seconds > MAX_DURATION_S:  # also the infinity that float() makes of 400 digits
        msg = f"too long; at most {MAX_DURATION_S:g} seconds (10 years)"
        raise TimeParseError(msg)
    return seconds


def parse_iso(text: str) -> float:
    """ISO-8601 / RFC 3339 with an offset or `Z`; a naive time is refused (which zone would it be?)."""
    stripped = text.strip()
    normalized = stripped[:-1] + "+00:00" if stripped[-1:] in ("z", "Z") else stripped
    try:
        moment = datetime.fromisoformat(_trim_fraction(normalized))
    except ValueError as exc:
        msg = f"{_explain(exc)}; {_HINT}"
        raise TimeParseError(msg) from None
    if moment.tzinfo is None:
        example = stripped if "T" in stripped or " " in stripped else stripped + "T00:00:00"
        msg = f"no UTC offset; add one, e.g. {example}+08:00 or {example}Z"
        raise TimeParseError(msg)
    try:
        return moment.timestamp()
    except (OverflowError, ValueError):  # e.g. 0001-01-01T00:00:00+01:00 is before the year 1 in UTC
        msg = f"out of range; {_HINT}"
        raise TimeParseError(msg) from None


def parse_when(text: str, now: float) -> float:
    """Any accepted form of a deadline, as epoch seconds within the plausible range (`bounds`).
    `now` anchors relative forms and the range."""
    at = _parse_any(text, now)
    problem = implausible(at, now)
    if problem is not None:
        raise TimeParseError(_with_suggestion(problem, text.strip(), now))
    return at


def _parse_any(text: str, now: float) -> float:
    stripped = text.strip()
    if not stripped:
        msg = f"empty value; {_HINT}"
        raise TimeParseError(msg)
    relative = _RELATIVE.match(stripped)
    if relative:
        return now + float(relative.group(1)) * _UNIT_S[relative.group(2).lower()]
    if stripped.startswith("+"):
        msg = "not a relative time; write +90s, +15m or +2h"
        raise TimeParseError(msg)
    if _NUMBER.match(stripped):
        return parse_epoch(stripped)
    if _ISO_SHAPE.match(stripped):
        return parse_iso(stripped)
    msg = f"not a time; {_HINT}"
    raise TimeParseError(msg)


def _with_suggestion(problem: str, text: str, now: float) -> str:
    """The range problem, and for a small bare number the relative form that was probably meant."""
    if _NUMBER.match(text):
        seconds = float(text)
        if 0 < seconds < EARLIEST and seconds <= HORIZON_S:
            return f"read as epoch seconds, {problem}; for {text} seconds from now write +{text}s"
        return f"read as an epoch time, {problem}; use epoch seconds like {int(now) + 7200}, or +2h"
    if text.startswith("+"):
        return f"{problem}; write at most +{int(HORIZON_S // 86400)}d"
    return f"{problem}; {_HINT}"


def _trim_fraction(text: str) -> str:
    """Python 3.10's fromisoformat takes 3 or 6 fractional digits only; clouds send 1 to 9."""
    match = re.match(r"^(.*T\d{2}:\d{2}:\d{2})\.(\d+)(.*)$", text)
    if not match:
        return text
    head, fraction, tail = match.groups()
    return f"{head}.{fraction[:6].ljust(6, '0')}{tail}"


def _explain(exc: ValueError) -> str:
    reason = str(exc)
    if "offset" in reason:
        return "UTC offset must be between -23:59 and +23:59"
    if "day is out of range" in reason:
        return "day is out of range for the month"
    if "month" in reason:
        return "month must be 1..12"
    if "hour" in reason:
        return "hour must be 0..23"
    if "minute" in reason:
        return "minute must be 0..59"
    if "second" in reason:
        return "second must be 0..59"
    return "not a valid ISO-8601 time"
