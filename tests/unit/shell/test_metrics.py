"""The Snapshot value, its JSON, and its Prometheus text as a real parser reads it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from full_snapshot import NOW, snapshot
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from esiwrap.core.snapshot import PHASES, Snapshot
from esiwrap.shell.metrics import FAMILIES, escape_label, render


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], family: str, **labels: str) -> float:
    matches = [s.value for s in fams[family].samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (family, labels, fams[family].samples)
    return float(matches[0])


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)
maybe_float = st.none() | finite
maybe_int = st.none() | st.integers(min_value=0, max_value=2**40)
text = st.text(max_size=40)
snapshots = st.builds(
    Snapshot, time=finite, run_id=text, pid=st.integers(1, 2**22), child_pid=maybe_int,
    phase=st.sampled_from(PHASES), deadline_at=maybe_float, deadline_source=st.none() | text,
    next_save_at=maybe_float, next_save_kind=st.none() | text, next_save_reason=st.none() | text,
    step_estimate_s=maybe_float, save_estimate_s=maybe_float, last_step=maybe_int,
    last_checkpoint_at=maybe_float, last_checkpoint_step=maybe_int, work_at_risk_s=maybe_float,
    saves_completed=st.integers(0, 10**6), saves_failed=st.integers(0, 10**6),
    saves_missed=st.integers(0, 10**6), trainers=st.integers(0, 4096),
)


@given(snapshots)
def test_snapshot_json_round_trips(s: Snapshot) -> None:
    """Whatever the supervisor puts in, the status file gives the same value back."""
    assert Snapshot.from_json(s.to_json()) == s


def test_non_finite_floats_are_written_as_null() -> None:
    """JSON has no NaN: an unknown or overflowing figure becomes null, read back as None."""
    s = snapshot(work_at_risk_s=math.nan, step_estimate_s=math.inf)
    data = json.loads(s.to_json())
    assert data["work_at_risk_s"] is None and data["step_estimate_s"] is None
    assert Snapshot.from_json(s.to_json()).work_at_risk_s is None


@pytest.mark.parametrize(("change", "message"), [
    ({"pid": "4242"}, "field 'pid'"),
    ({"pid": True}, "field 'pid'"),
    ({"deadline_at": "soon"}, "field 'deadline_at'"),
    ({"time": None}, "field 'time' is null"),
])
def test_from_json_names_the_bad_field(change: dict[str, Any], message: str) -> None:
    """A status file from something else (or a newer esiwrap) fails with the field's name."""
    data = json.loads(snapshot().to_json())
    data.update(change)
    with pytest.raises(ValueError, match=message):
        Snapshot.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="not JSON"):
        Snapshot.from_json("{half")


def test_missing_optional_fields_are_unknown_and_extra_fields_are_ignored() -> None:
    """Reading is lenient where it is safe: an older writer's missing optional field is None."""
    data = json.loads(snapshot().to_json())
    del data["next_save_reason"]
    data["a_newer_field"] = 1
    assert Snapshot.from_json(json.dumps(data)).next_save_reason is None


def test_every_series_parses_with_the_values_of_the_snapshot() -> None:
    """prometheus_client's parser reads every family, with esiwrap's names, types and labels."""
    fams = families(render(snapshot(), NOW + 10.0, "0.1.0"))
    run = {"run_id": "3f2a9c0d1e2f"}
    assert value(fams, "esiwrap_deadline_timestamp_seconds", source="volcengine", **run) == NOW + 2460
    assert value(fams, "esiwrap_deadline_remaining_seconds", **run) == 2450.0  # at the scrape
    assert value(fams, "esiwrap_next_save_timestamp_seconds", kind="insurance") == NOW + 1680
    assert value(fams, "esiwrap_step_estimate_seconds") == 1.25
    assert value(fams, "esiwrap_save_estimate_seconds") == 45.0
    assert value(fams, "esiwrap_last_step") == 1300
    assert value(fams, "esiwrap_last_checkpoint_timestamp_seconds") == NOW - 360
    assert value(fams, "esiwrap_last_checkpoint_step") == 1200
    assert value(fams, "esiwrap_work_at_risk_seconds") == 372.5  # grew with the 10 s of training
    assert value(fams, "esiwrap_trainers") == 1
    assert value(fams, "esiwrap_snapshot_timestamp_seconds") == NOW
    assert value(fams, "esiwrap_info", pid="4242", child_pid="4250", version="0.1.0") == 1
    # counters: the family is named without _total, its sample with it
    assert fams["esiwrap_saves_completed"].type == "counter"
    assert value(fams, "esiwrap_saves_completed") == 2
    assert value(fams, "esiwrap_saves_failed") == 1
    assert value(fams, "esiwrap_saves_missed") == 0
    phases = {s.labels["phase"]: s.value for s in fams["esiwrap_phase"].samples}
    assert phases == {p: (1.0 if p == "running" else 0.0) for p in PHASES}
    parsed = {f.name + ("_total" if f.type == "counter" else "") for f in fams.values()}
    assert parsed == {f.name for f in FAMILIES}
    assert all(f.documentation for f in fams.values())


def test_unknown_values_leave_their_series_out() -> None:
    """No deadline, no plan, no checkpoint: those series are absent, not zero or NaN."""
    s = snapshot(deadline_at=None, deadline_source=None, next_save_at=None, next_save_kind=None,
                 last_checkpoint_at=None, last_checkpoint_step=None, work_at_risk_s=None, child_pid=None)
    fams = families(render(s, NOW, ""))
    for name in ("esiwrap_deadline_timestamp_seconds", "esiwrap_deadline_remaining_seconds",
                 "esiwrap_next_save_timestamp_seconds", "esiwrap_last_checkpoint_timestamp_seconds",
                 "esiwrap_last_checkpoint_step", "esiwrap_work_at_risk_seconds"):
        assert fams[name].samples == [], name
    assert value(fams, "esiwrap_info", child_pid="") == 1


def test_label_values_are_escaped() -> None:
    """A source name with a quote, a backslash or a newline cannot break the format."""
    source = 'node:a"b\\c\nd/volcengine-spot'
    assert escape_label(source) == 'node:a\\"b\\\\c\\nd/volcengine-spot'
    fams = families(render(snapshot(deadline_source=source), NOW, ""))
    assert fams["esiwrap_deadline_timestamp_seconds"].samples[0].labels["source"] == source


def test_a_phase_this_version_does_not_know_is_still_exported() -> None:
    """The controller may grow a phase: it is the one set to 1, next to the known ones at 0."""
    fams = families(render(snapshot(phase="resting"), NOW, ""))
    phases = {s.labels["phase"]: s.value for s in fams["esiwrap_phase"].samples}
    assert phases["resting"] == 1.0 and sum(phases.values()) == 1.0
