"""Every accepted form of a moment in time, and the malformed ones with their messages."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from freezegun import freeze_time

from esiwrap.times import TimeParseError, parse_duration, parse_epoch, parse_iso, parse_when

NOW = 1_790_000_000.0  # an anchor for relative forms; parse_when never reads the clock itself
EPOCH_2026 = datetime(2026, 9, 14, 12, 30, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1790000000", 1_790_000_000.0),
        ("1790000000.5", 1_790_000_000.5),
        ("  1790000000\n", 1_790_000_000.0),
        ("1790000000000", 1_790_000_000.0),  # milliseconds, told apart by magnitude
        ("1790000000123.0", 1_790_000_000.123),
        ("1.79e9", 1_790_000_000.0),
    ],
)
def test_epoch_seconds_and_milliseconds(text: str, expected: float) -> None:
    """Epoch values in seconds or milliseconds, floats and whitespace tolerated."""
    assert parse_epoch(text) == pytest.approx(expected)
    assert parse_when(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    [
        "2026-09-14T20:30:00+08:00",
        "2026-09-14T12:30:00Z",
        "2026-09-14T12:30:00z",
        "2026-09-14T12:30:00.000Z",
        "2026-09-14T12:30:00.000000000Z",  # nanoseconds, as some APIs send
        "2026-09-14 12:30:00+00:00",
        "2026-09-14T14:30:00+0200",
        "2026-09-14T07:30:00-05:00",
    ],
)
def test_iso_with_offset(text: str) -> None:
    """ISO-8601 / RFC 3339 with any offset or Z is the same instant."""
    assert parse_iso(text) == pytest.approx(EPOCH_2026)
    assert parse_when(text, NOW) == pytest.approx(EPOCH_2026)


@pytest.mark.parametrize(
    ("text", "offset_s"),
    [("+90s", 90), ("+90", 90), ("+15m", 900), ("+2h", 7200), ("+1d", 86400), ("+1.5h", 5400),
     ("+ 10s", 10), ("+2H", 7200)],
)
def test_relative_forms_are_anchored_to_now(text: str, offset_s: float) -> None:
    """+90s, +15m, +2h, +1d count from the `now` argument."""
    assert parse_when(text, NOW) == NOW + offset_s


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("tomorrow", "not a time"),
        ("2026-13-01T00:00:00Z", "month must be 1..12"),
        ("2026-02-30T00:00:00Z", "day is out of range"),
        ("2026-09-14T25:00:00Z", "hour must be 0..23"),
        ("2026-09-14T12:61:00Z", "minute must be 0..59"),
        ("2026-09-14T12:30:00", "no UTC offset"),
        ("2026-09-14", "no UTC offset"),
        ("2026-09-14T12:30:00+25:00", "UTC offset must be"),
        ("+5x", "not a relative time"),
        ("+", "not a relative time"),
        ("+-5m", "not a relative time"),
        ("-5", "not a positive epoch time"),
        ("0", "not a positive epoch time"),
        ("nan", "not a time"),
        ("inf", "not a time"),
        ("12:30", "not a time"),
        ("1790000000s", "not a time"),
        ("2026-09-14T12:30:00 UTC", "not a valid"),
    ],
)
def test_malformed_values_say_why(text: str, reason: str) -> None:
    """Malformed input raises TimeParseError whose message says what is wrong."""
    with pytest.raises(TimeParseError, match=reason):
        parse_when(text, NOW)


def test_naive_time_message_suggests_an_offset() -> None:
    """A time without an offset is refused with an example that has one."""
    with pytest.raises(TimeParseError) as info:
        parse_when("2026-09-14T12:30:00", NOW)
    assert "2026-09-14T12:30:00+08:00" in str(info.value)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200),
                                               (" 1.5 ", 1.5)])
def test_durations(text: str, seconds: float) -> None:
    """Option durations take seconds or a unit."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-1", "abc", "5 minutes", "1e3"])
def test_bad_durations(text: str) -> None:
    """Anything else is not a duration."""
    with pytest.raises(TimeParseError):
        parse_duration(text)


@freeze_time("2026-11-30 02:00:00", tz_offset=0)
def test_cli_source_anchors_relative_deadline_at_launch() -> None:
    """`--deadline +2h` means two hours from launch, however late the source is asked."""
    import time

    from esiwrap.sources.local import CliSource

    launched = time.time()
    source = CliSource("+2h", anchor=launched)
    assert source.resolve(launched + 600).at == launched + 7200
    assert source.period_s is None
