"""The demo trainer under esiwrap with only the cloud fakes as deadline sources: release times,
renewals and spot notices move the deadline while training runs, and the save lands in time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from esiwrap_harness import EsiwrapRun, event_time, requested_saves, sources_only_args
from fakes.fixtures import CREDENTIALS, SCHEDULED_ID, rfc3339_in
from fakes.metadata import FakeMetadata
from fakes.volcengine_api import ACCESS_DENIED, FakeVolcengineApi

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.times import parse_iso

SPOT_ITEM = "/latest/spot_instance_termination_time"
AWS_SPOT_ITEM = "/latest/meta-data/spot/instance-action"


def no_tracebacks(run: EsiwrapRun) -> bool:
    return not any("Traceback" in line for line in run.other_lines)


def test_end_to_end_saves_before_the_release_time(esiwrap, tmp_path: Path, cloud_env: dict[str, str],
                                                  fake_api: FakeVolcengineApi) -> None:
    """Only the fakes know the deadline: resolved from auto_release_at, saved before it, exit 75.
    The API starts denying access mid-run: logged once (not every refresh), the known deadline
    stands, training is not hurt."""
    raw = rfc3339_in(35)  # room for torch's import on a loaded machine
    fake_api.set_release(SCHEDULED_ID, raw)
    run = esiwrap(*sources_only_args(tmp_path, "volcengine,volcengine-spot"), env=cloud_env)
    resolved = run.wait_event("deadline_resolved", timeout=30)
    assert resolved["source"] == "volcengine" and resolved["raw"] == raw
    assert resolved["scheduled_instance_id"] == SCHEDULED_ID
    fake_api.state.failure = ACCESS_DENIED
    assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
    saves = requested_saves(run)
    assert saves and event_time(saves[-1]) < parse_iso(raw)
    assert (tmp_path / "latest.pt").exists()
    denied = [e for e in run.events if e["event"] == "deadline_unavailable" and e["source"] == "volcengine"]
    assert len(denied) == 1 and denied[0]["level"] == "warning"
    assert "lack ecs:DescribeInstances" in str(denied[0]["reason"])
    assert sum(c.action == "DescribeInstances" for c in fake_api.calls) > 5  # asked every second
    assert no_tracebacks(run)


def test_renewal_later_then_earlier(esiwrap, tmp_path: Path, cloud_env: dict[str, str],
                                    fake_api: FakeVolcengineApi) -> None:
    """auto_release_at moves later (a renewal), then earlier: both are deadline_changed, the save
    follows the last one."""
    fake_api.set_release(SCHEDULED_ID, rfc3339_in(60))
    run = esiwrap(*sources_only_args(tmp_path, "volcengine"), env=cloud_env)
    first = run.wait_event("deadline_resolved", timeout=30, source="volcengine")
    later = rfc3339_in(3600)
    fake_api.set_release(SCHEDULED_ID, later)
    renewed = run.wait_event("deadline_changed", timeout=30, raw=later)
    assert parse_iso(str(renewed["new"])) > parse_iso(str(first["deadline"]))
    run.wait_event("trainer_attached", timeout=60)
    earlier = rfc3339_in(14)
    fake_api.set_release(SCHEDULED_ID, earlier)
    moved = run.wait_event("deadline_changed", timeout=30, raw=earlier)
    assert moved["source"] == "volcengine"
    assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
    saves = requested_saves(run)
    assert saves and event_time(saves[-1]) < parse_iso(earlier)
    scheduled = [e for e in run.events if e["event"] == "save_scheduled"]
    assert scheduled and parse_iso(str(scheduled[-1]["signal_at"])) < parse_iso(earlier)


def test_spot_notice_mid_run_moves_the_deadline_and_saves(esiwrap, tmp_path: Path,
                                                          cloud_env: dict[str, str],
                                                          fake_metadata: FakeMetadata) -> None:
    """Released in an hour, then a spot notice: the deadline moves earlier, the save follows."""
    run = esiwrap(*sources_only_args(tmp_path, "volcengine,volcengine-spot"), env=cloud_env)
    run.wait_event("deadline_resolved", timeout=30, source="volcengine")
    run.wait_event("trainer_attached", timeout=60)
    notice = rfc3339_in(20)
    fake_metadata.set(SPOT_ITEM, notice)
    changed = run.wait_event("deadline_changed", timeout=30, source="volcengine-spot")
    assert changed["raw"] == notice
    assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
    saves = requested_saves(run)
    assert saves and event_time(saves[-1]) < parse_iso(notice)
    assert event_time(run.first("save_requested")) >= event_time(changed)


@pytest.mark.usefixtures("volcengine_credentials")
def test_aws_spot_notice_mid_run_with_no_volcengine_around(esiwrap, tmp_path: Path,
                                                           fake_aws_metadata: FakeMetadata) -> None:
    """No deadline at first; the Volcengine metadata is unreachable (logged once per source, at
    info, however often asked); an AWS instance-action notice becomes the deadline; the save lands."""
    env = {**CREDENTIALS, "ESIWRAP_AWS_METADATA_URL": fake_aws_metadata.url}
    run = esiwrap(*sources_only_args(tmp_path, "volcengine,volcengine-spot,aws-spot"), env=env)
    run.wait_event("deadline_unavailable", timeout=30, source="aws-spot",
                   reason="no spot interruption notice")
    run.wait_event("trainer_attached", timeout=60)
    when = rfc3339_in(20, offset_hours=0)
    fake_aws_metadata.set(AWS_SPOT_ITEM, json.dumps({"action": "terminate", "time": when}))
    resolved = run.wait_event("deadline_resolved", timeout=30, source="aws-spot")
    assert resolved["raw"] == when and resolved["action"] == "terminate"
    assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
    saves = requested_saves(run)
    assert saves and event_time(saves[-1]) < parse_iso(when)
    unavailable = [e for e in run.events if e["event"] == "deadline_unavailable"]
    assert sorted(str(e["source"]) for e in unavailable) == ["aws-spot", "volcengine", "volcengine-spot"]
    assert all(e["level"] == "info" for e in unavailable)
    assert no_tracebacks(run)


def test_renewal_after_the_save_plans_a_new_one(esiwrap, tmp_path: Path, cloud_env: dict[str, str],
                                                fake_api: FakeVolcengineApi) -> None:
    """--after-save continue: saved and training on; a renewal plans and takes a new save."""
    run = esiwrap(*sources_only_args(tmp_path, "volcengine", "--after-save", "continue"), env=cloud_env)
    run.wait_event("trainer_attached", timeout=60)
    fake_api.set_release(SCHEDULED_ID, rfc3339_in(12))
    run.wait_event("training_continues", timeout=60)
    first = requested_saves(run)
    assert len(first) == 1
    renewed = rfc3339_in(15)
    fake_api.set_release(SCHEDULED_ID, renewed)
    run.wait_event("deadline_changed", timeout=30, raw=renewed)
    run.wait_for(lambda e: e["event"] == "save_completed" and bool(e.get("requested"))
                 and e is not first[0], timeout=60, what="a second save")
    second = requested_saves(run)[1]
    assert event_time(second) < parse_iso(renewed)
    assert int(str(second["step"])) > int(str(first[0]["step"]))
