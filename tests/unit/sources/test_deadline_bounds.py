"""Deadlines out of the plausible range (before 2000, or more than 10 years ahead) never reach the
supervisor: `--deadline` refuses them with one line (exit 2), every other source is unavailable
with a reason, and training goes on. Formatting a time never raises."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from dataclasses import dataclass

import pytest
from esiwrap_harness import PYTHON, SIGNAL_ECHO
from fakes.fixtures import SCHEDULED_ID
from fakes.metadata import FakeMetadata
from fakes.volcengine_api import FakeVolcengineApi
from snapshots import snapshot

from esiwrap.core.values import Deadline
from esiwrap.errors import EXIT_NO_DEADLINE, EXIT_USAGE, SourceUnavailable
from esiwrap.shell.systemd.status_line import human_duration, status_parts
from esiwrap.sources.chain import ask
from esiwrap.sources.local import MLP_VAR, SAGEMAKER_VAR, env_sources
from esiwrap.sources.metadata import AWS, VOLCENGINE, MetadataClient
from esiwrap.sources.spot import (
    AWS_NOTICE_S,
    AWS_SPOT_PATH,
    VOLCENGINE_NOTICE_S,
    VOLCENGINE_SPOT_PATH,
    aws_spot,
    volcengine_spot,
)
from esiwrap.times import EARLIEST, HORIZON_S, TimeParseError, implausible, iso_epoch, iso_utc, parse_when

NOW = 1_790_000_000.0
FAR_FUTURE_RFC3339 = "9999-12-31T23:59:59-12:00"  # parses; its UTC year is 10000
OUT_OF_RANGE_EPOCHS = ["99999999999999999999", "1e300", "90", "946684799"]


@pytest.mark.parametrize("value", [1e17, 1e300, -1e20, 253402344000.0, math.inf, -math.inf, math.nan])
def test_iso_utc_never_raises(value: float) -> None:
    """A time with no calendar date (year 10000, 1e300, NaN) is written as an epoch, not raised."""
    assert iso_utc(value).startswith("epoch ")
    assert Deadline(at=value, source="x").iso() == iso_utc(value)


def test_iso_utc_keeps_the_usual_form_in_range() -> None:
    """Within years 1..9999 the format is unchanged: ISO-8601 UTC with milliseconds."""
    assert iso_utc(1_796_083_200.5) == "2026-12-01T00:00:00.500Z"
    assert iso_utc(253402300799.0) == "9999-12-31T23:59:59.000Z"


def test_one_iso_form_at_two_precisions_and_read_back() -> None:
    """`iso_utc` writes milliseconds (logs, reports) or seconds (the systemd status line), both
    ending in Z; `iso_epoch` reads either back (a naive time is UTC) and refuses anything else."""
    assert iso_utc(1_796_083_200.5, "seconds") == "2026-12-01T00:00:00Z"
    assert iso_utc(1e300, "seconds") == iso_utc(1e300) == "epoch 1e+300"
    assert iso_epoch("2026-12-01T00:00:00.500Z") == iso_epoch("2026-12-01T00:00:00.500") == 1_796_083_200.5
    assert iso_epoch("2026-12-01T08:00:00+08:00") == 1_796_083_200.0
    for nonsense in ("yesterday", "", "epoch 1e+300"):
        with pytest.raises(ValueError):
            iso_epoch(nonsense)


def test_status_line_formatters_never_raise() -> None:
    """The systemd status line copes with any number: no date, no duration, no exception."""
    facts = snapshot(NOW, "running", deadline_at=1e300, deadline_source="x", next_save_kind="insurance",
                     next_save_at=math.nan, step_estimate_s=math.inf, last_step=1)
    stable, volatile = status_parts(facts)
    assert "epoch 1e+300" in stable and "? left" in volatile
    assert human_duration(math.nan) == "?" and human_duration(-math.inf) == "?"


@pytest.mark.parametrize(
    ("at", "verdict"),
    [(EARLIEST, None), (NOW - 86400, None), (NOW + HORIZON_S, None),
     (EARLIEST - 1, "before 2000-01-01"), (NOW + HORIZON_S + 1, "more than 10 years ahead"),
     (math.nan, "not a finite time"), (math.inf, "not a finite time")],
)
def test_plausible_range(at: float, verdict: str | None) -> None:
    """From 2000-01-01 to ten years ahead; a past deadline after 2000 is plausible (learned late)."""
    problem = implausible(at, NOW)
    assert problem is None if verdict is None else verdict in (problem or "")


def test_bare_small_number_suggests_a_relative_time() -> None:
    """`--deadline 90` meant "in 90 seconds": refused (it would be 1970), with +90s suggested."""
    with pytest.raises(TimeParseError, match=r"1970-01-01T00:01:30.000Z is before 2000-01-01; "
                                             r"for 90 seconds from now write \+90s"):
        parse_when("90", NOW)


@pytest.mark.parametrize("text", ["99999999999999999999", "1e300", "+99999999d", FAR_FUTURE_RFC3339,
                                  "1999-12-31T23:59:59Z", "0001-01-01T00:00:00+01:00", "+1e400"])
def test_out_of_range_text_is_a_parse_error(text: str) -> None:
    """Every form out of range is a TimeParseError with a message, never an overflow."""
    with pytest.raises(TimeParseError) as caught:
        parse_when(text, NOW)
    assert str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("raw", OUT_OF_RANGE_EPOCHS)
def test_env_out_of_range_is_unavailable_with_reason(raw: str) -> None:
    """MLP_/SAGEMAKER_ variables out of range: the source is unavailable, a warning with the reason."""
    sources = env_sources({MLP_VAR: raw, SAGEMAKER_VAR: raw}, 1800.0)
    for answer in (ask(s, NOW) for s in sources):
        assert answer.deadline is None and not answer.expected
        assert repr(raw) in answer.reason
        assert "before 2000-01-01" in answer.reason or "more than 10 years ahead" in answer.reason


@dataclass
class _Misbehaving:
    """A source that breaks its contract in one of several ways."""

    how: str
    name: str = "broken"
    period_s: float | None = None

    def resolve(self, now: float) -> Deadline:
        if self.how == "far":
            return Deadline(at=1e300, source=self.name, raw="1e300")
        if self.how == "nan":
            return Deadline(at=math.nan, source=self.name, raw="nan")
        if self.how == "type":
            return "tomorrow"  # type: ignore[return-value]
        if self.how == "overflow":
            raise OverflowError("timestamp out of range for platform time_t")
        if self.how == "bad-str":
            raise _Unprintable
        raise SourceUnavailable("not here\nreally", expected=True)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(("how", "reason"), [
    ("far", "'1e300' is not a plausible deadline"), ("nan", "not a finite time"),
    ("type", "unexpected answer str"), ("overflow", "unexpected OverflowError: timestamp out of range"),
    ("bad-str", "unexpected _Unprintable: _Unprintable"), ("reason", "not here really"),
])
def test_ask_is_the_boundary(how: str, reason: str) -> None:
    """Whatever a source returns or raises, `ask` turns it into an Answer with a one-line reason."""
    answer = ask(_Misbehaving(how), NOW)
    assert answer.deadline is None
    assert reason in answer.reason and "\n" not in answer.reason


def _esiwrap(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    skipped = ("MLP_", "SAGEMAKER_", "ESIWRAP_DEADLINE")
    full = {k: v for k, v in os.environ.items() if not k.startswith(skipped)}
    full.update(env)
    return subprocess.run([PYTHON, "-m", "esiwrap", *args], capture_output=True, text=True, env=full,
                          timeout=60)


@pytest.mark.system
@pytest.mark.parametrize(("value", "expected"), [
    ("90", "for 90 seconds from now write +90s"),
    ("99999999999999999999", "more than 10 years ahead"),
    ("1e300", "more than 10 years ahead"),
    (FAR_FUTURE_RFC3339, "beyond the year 9999"),
])
def test_deadline_flag_out_of_range_is_a_usage_error(value: str, expected: str) -> None:
    """`--deadline` out of range: one line naming the flag and the value, exit 2, child never run."""
    done = _esiwrap("--deadline", value, "--", "sh", "-c", "echo started")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.startswith(f"esiwrap: --deadline {value!r}: ") and expected in done.stderr
    assert done.stderr.count("\n") == 1 and "started" not in done.stdout


@pytest.mark.system
def test_deadline_env_out_of_range_is_a_usage_error() -> None:
    """ESIWRAP_DEADLINE is the same option: the same one line, naming the variable."""
    done = _esiwrap("--", "true", ESIWRAP_DEADLINE="90")
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("esiwrap: ESIWRAP_DEADLINE '90': ") and "+90s" in done.stderr


@pytest.mark.parametrize("raw", ["99999999999999999999", "1e300"])
def test_env_garbage_does_not_stop_training(esiwrap, raw: str) -> None:
    """The run goes on: `deadline_unavailable` with the reason, no supervisor failure, and the
    child's own exit code at the end (it exits 0 when it gets the forwarded SIGHUP)."""
    run = esiwrap("--sources", "env", "--",
                  PYTHON, str(SIGNAL_ECHO), "--echo", "SIGHUP", "--exit-on", "SIGHUP",
                  env={MLP_VAR: raw})
    unavailable = run.wait_event("deadline_unavailable", 30, source="env:MLP")
    assert "more than 10 years ahead" in unavailable["reason"] and unavailable["level"] == "warning"
    run.wait_stdout("ready")
    run.signal(1)  # SIGHUP: forwarded; the child exits 0
    assert run.finish(30) == 0
    assert "supervisor_failed" not in run.names() and "deadline_resolved" not in run.names()


def test_far_future_auto_release_at_does_not_stop_training(esiwrap, cloud_env: dict[str, str],
                                                           fake_api: FakeVolcengineApi) -> None:
    """An AutoReleaseAt that parses but lies in the year 10000 (UTC): the volcengine source is
    unavailable with the raw string in the reason; training goes on."""
    fake_api.set_release(SCHEDULED_ID, FAR_FUTURE_RFC3339)
    run = esiwrap("--sources", "volcengine", "--",
                  PYTHON, str(SIGNAL_ECHO), "--echo", "SIGHUP", "--exit-on", "SIGHUP", env=cloud_env)
    unavailable = run.wait_event("deadline_unavailable", 30, source="volcengine")
    assert repr(FAR_FUTURE_RFC3339) in unavailable["reason"] and "implausible" in unavailable["reason"]
    run.wait_stdout("ready")
    run.signal(1)
    assert run.finish(30) == 0
    assert "supervisor_failed" not in run.names()


@pytest.mark.system
def test_deadline_command_far_future_has_no_traceback(cloud_env: dict[str, str],
                                                      fake_api: FakeVolcengineApi) -> None:
    """`esiwrap deadline` shows the reason in its table and exits 3 (no deadline), no traceback."""
    fake_api.set_release(SCHEDULED_ID, FAR_FUTURE_RFC3339)
    done = _esiwrap("deadline", "--sources", "volcengine", **cloud_env)
    assert done.returncode == EXIT_NO_DEADLINE, done.stderr
    assert "Traceback" not in done.stderr
    assert "volcengine  unavailable: scheduled instance" in done.stdout and "implausible" in done.stdout


def test_plausible_values_still_work() -> None:
    """A normal epoch, a relative time and ISO with an offset pass unchanged."""
    now = time.time()
    assert parse_when("+2h", now) == now + 7200
    assert parse_when("1796083200", now) == 1796083200.0
    assert parse_when("2026-12-01T08:00:00+08:00", now) == 1796083200.0


def test_spot_notice_with_an_out_of_range_time_still_counts(fake_metadata: FakeMetadata) -> None:
    """A spot notice is real even when its time is garbage: the time counts as unreadable, and
    the deadline is when the notice was first seen plus the cloud's warning."""
    fake_metadata.set(VOLCENGINE_SPOT_PATH, FAR_FUTURE_RFC3339)
    now = time.time()
    answer = ask(volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0), now)
    assert answer.deadline is not None, answer.reason
    assert answer.deadline.at == now + VOLCENGINE_NOTICE_S
    assert "more than 10 years ahead" in answer.deadline.detail["time_error"]


def test_aws_notice_from_1970_still_counts(fake_aws_metadata: FakeMetadata) -> None:
    """The same for AWS: a notice whose time is before 2000 is a notice with an unreadable time."""
    notice = {"action": "terminate", "time": "1970-01-01T00:00:00Z"}
    fake_aws_metadata.set(AWS_SPOT_PATH, json.dumps(notice))
    now = time.time()
    answer = ask(aws_spot(MetadataClient(fake_aws_metadata.url, AWS), 300.0), now)
    assert answer.deadline is not None and answer.deadline.at == now + AWS_NOTICE_S
    assert "before 2000-01-01" in answer.deadline.detail["time_error"]


def test_a_nodes_answer_is_held_to_the_same_range_as_every_source() -> None:
    """What arrives from another node passes the plausibility of `bounds` at arrival, nothing
    looser or stricter: 2000-01-01 on, at most ten years ahead."""
    from esiwrap.sources import remote

    def arrived(at: float) -> bool:
        fields = {"source": "node:1a2b3c4d/env:MLP", "at": at, "raw": str(at), "lead_s": 0.0, "detail": {}}
        return remote.from_fields(fields, NOW) is not None

    assert arrived(EARLIEST) and arrived(NOW + HORIZON_S)
    assert not arrived(EARLIEST - 1) and not arrived(NOW + HORIZON_S + 1) and not arrived(math.inf)
