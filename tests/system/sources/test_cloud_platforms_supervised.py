"""The demo trainer under esiwrap with Azure, GCP or AWS's metadata fakes as the only deadline
sources: an announced end mid-run is saved before, and the run exits 75; an event withdrawn
leaves training alone; an early warning takes a save and training goes on."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from esiwrap_harness import EsiwrapRun, event_time, requested_saves, sources_only_args
from fakes.azure import FakeAzureMetadata
from fakes.fixtures import rfc3339_in
from fakes.gcp import FakeGcpMetadata
from fakes.metadata import FakeMetadata
from fakes.network import closed_port_url

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.sources.spot import AWS_REBALANCE_PATH, AWS_SPOT_PATH
from esiwrap.times import iso_epoch


def unavailable(run: EsiwrapRun, words: str) -> list[dict[str, object]]:
    return [e for e in run.events if e["event"] == "deadline_unavailable" and words in str(e["reason"])]


def no_tracebacks(run: EsiwrapRun) -> bool:
    return not any("Traceback" in line for line in run.other_lines)


def test_azure_spot_eviction_is_saved_before_not_before(esiwrap, tmp_path: Path) -> None:
    """A Preempt for this VM mid-run (the first call slow, as on a VM where the service starts):
    the deadline is its NotBefore, the save lands before it, exit 75."""
    with FakeAzureMetadata(priority="Spot", enable_delay_s=1.5) as fake:
        run = esiwrap(*sources_only_args(tmp_path, "azure"), env={"ESIWRAP_AZURE_METADATA_URL": fake.url})
        run.wait_event("trainer_attached", timeout=60)
        run.wait_event("deadline_unavailable", timeout=30, source="azure")
        event_id = fake.schedule("Preempt", 20)
        resolved = run.wait_event("deadline_resolved", timeout=30, source="azure")
        assert resolved["event_id"] == event_id and resolved["event_type"] == "Preempt"
        fake.answer_next(200, b"<html>proxy error</html>", times=4)  # four polls of garbage
        assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
        not_before = iso_epoch(str(resolved["deadline"]))
        saves = requested_saves(run)
        assert saves and event_time(saves[-1]) < not_before
        assert event_time(run.first("supervisor_exit")) < not_before
        assert not fake.approvals  # no --azure-ack: nothing approved
    garbled = unavailable(run, "unparsable")
    assert len(garbled) == 1 and garbled[0]["level"] == "warning"  # once, and the deadline stood
    assert "deadline_withdrawn" not in run.names()
    assert (tmp_path / "latest.pt").exists() and no_tracebacks(run)


def test_azure_ack_approves_the_event_once_the_checkpoint_is_complete(esiwrap, tmp_path: Path) -> None:
    """--azure-ack: the POST with this event's EventId comes after the save completed, when the
    checkpoint is on disk and the trainer has exited; `capacity_released` says so."""
    checkpoint = tmp_path / "latest.pt"
    with FakeAzureMetadata() as fake:
        fake.approval_hook = lambda ids: checkpoint.exists()
        env = {"ESIWRAP_AZURE_METADATA_URL": fake.url}
        run = esiwrap(*sources_only_args(tmp_path, "azure", "--azure-ack"), env=env)
        run.wait_event("trainer_attached", timeout=60)
        event_id = fake.schedule("Reboot", 20, source="User")
        run.wait_event("deadline_resolved", timeout=30, source="azure")
        assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
        approvals = fake.approvals_of(event_id)
    assert len(approvals) == 1 and approvals[0].event_ids == [event_id]
    assert approvals[0].hook_result is True  # the checkpoint was there when the POST came
    assert approvals[0].at > event_time(requested_saves(run)[-1])
    assert approvals[0].at > event_time(run.first("child_exited"))
    released = run.first("capacity_released")
    assert released["source"] == "azure" and released["ok"] is True and event_id in str(released["detail"])
    assert no_tracebacks(run)


def test_azure_event_cancelled_mid_run_leaves_training_alone(esiwrap, tmp_path: Path) -> None:
    """A Reboot is announced, then cancelled (gone from the document): `deadline_withdrawn`, and
    nothing stops at its old NotBefore; a SIGTERM later still ends with a checkpoint, exit 75."""
    with FakeAzureMetadata() as fake:
        run = esiwrap(*sources_only_args(tmp_path, "azure"), env={"ESIWRAP_AZURE_METADATA_URL": fake.url})
        run.wait_event("trainer_attached", timeout=60)
        event_id = fake.schedule("Reboot", 25)
        resolved = run.wait_event("deadline_resolved", timeout=30, source="azure")
        fake.remove(event_id)
        withdrawn = run.wait_event("deadline_withdrawn", timeout=30, source="azure")
        assert event_id in str(withdrawn["reason"])
        old_end = iso_epoch(str(resolved["deadline"]))
        with pytest.raises(AssertionError, match="no 'child_stopping'"):  # past the old end: no stop
            run.wait_event("child_stopping", timeout=max(1.0, old_end + 2 - time.time()))
        assert "supervisor_exit" not in run.names()
        run.signal(signal.SIGTERM)
        assert run.finish(timeout=60) == EXIT_CHECKPOINTED, run.names()
    assert no_tracebacks(run)


def test_gcp_preemption_is_saved_within_the_30_seconds(esiwrap, tmp_path: Path) -> None:
    """preempted turns TRUE mid-run: the hanging GET brings it within a second or two; the
    deadline is first seen + 30 s; the save lands before it; exit 75."""
    with FakeGcpMetadata() as fake:
        run = esiwrap(*sources_only_args(tmp_path, "gcp"), env={"ESIWRAP_GCP_METADATA_URL": fake.url})
        run.wait_event("trainer_attached", timeout=60)
        run.wait_event("deadline_unavailable", timeout=30, source="gcp")
        preempted_at = time.time()
        fake.set("instance/preempted", "TRUE")
        resolved = run.wait_event("deadline_resolved", timeout=30, source="gcp")
        assert event_time(resolved) - preempted_at < 3.0
        end = iso_epoch(str(resolved["deadline"]))
        assert preempted_at + 30 - 0.5 <= end <= event_time(resolved) + 30
        fake.answer_next(500, b"oops", times=8)  # the server fails for a few rounds
        assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
        assert any(r.hanging for r in fake.of("instance/preempted"))
    saves = requested_saves(run)
    assert saves and event_time(saves[-1]) < end and no_tracebacks(run)
    failed = [str(e["reason"]) for e in unavailable(run, "HTTP 500")]
    assert failed and len(failed) == len(set(failed))  # each reason once, however often it recurs
    assert "deadline_withdrawn" not in run.names()


def test_gcp_host_maintenance_with_a_declared_notice(esiwrap, tmp_path: Path) -> None:
    """TERMINATE_ON_HOST_MAINTENANCE with --gcp-maintenance-notice 20: first seen + 20 s."""
    with FakeGcpMetadata(preemptible=False) as fake:
        # azure too, refused (nothing listens at its URL): logged once, at info, however often asked
        env = {"ESIWRAP_GCP_METADATA_URL": fake.url, "ESIWRAP_AZURE_METADATA_URL": closed_port_url()}
        run = esiwrap(*sources_only_args(tmp_path, "gcp,azure", "--gcp-maintenance-notice", "20"), env=env)
        run.wait_event("trainer_attached", timeout=60)
        noticed_at = time.time()
        fake.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        resolved = run.wait_event("deadline_resolved", timeout=30, source="gcp")
        end = iso_epoch(str(resolved["deadline"]))
        assert noticed_at + 20 - 0.5 <= end <= event_time(resolved) + 20
        assert resolved["notice"] == "instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE"
        assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
    saves = requested_saves(run)
    assert saves and event_time(saves[-1]) < end
    refused = [e for e in run.events if e["event"] == "deadline_unavailable" and e["source"] == "azure"]
    assert len(refused) == 1 and refused[0]["level"] == "info"
    assert "connection refused" in str(refused[0]["reason"])


def test_aws_rebalance_takes_a_save_and_training_goes_on(esiwrap, tmp_path: Path,
                                                         fake_aws_metadata: FakeMetadata) -> None:
    """A rebalance recommendation: `early_warning`, a save (reason early_warning), training goes
    on; the interruption notice that follows is the deadline, saved before, exit 75."""
    env = {"ESIWRAP_AWS_METADATA_URL": fake_aws_metadata.url}
    run = esiwrap(*sources_only_args(tmp_path, "aws-spot"), env=env)
    run.wait_event("trainer_attached", timeout=60)
    run.wait_event("deadline_unavailable", timeout=30, source="aws-spot")
    fake_aws_metadata.set(AWS_REBALANCE_PATH, json.dumps({"noticeTime": rfc3339_in(0, offset_hours=0)}))
    warned = run.wait_event("early_warning", timeout=30, source="aws-spot")
    assert "EC2 rebalance recommendation" in str(warned["reason"]) and warned["action"] == "save now"
    requested = run.wait_event("save_requested", timeout=30, reason="early_warning")
    saved = run.wait_for(lambda e: e["event"] == "save_completed" and e.get("kind") == "early_warning",
                         timeout=30, what="the early warning's save")
    assert event_time(saved) >= event_time(requested)
    when = rfc3339_in(20, offset_hours=0)
    fake_aws_metadata.set(AWS_SPOT_PATH, json.dumps({"action": "terminate", "time": when}))
    resolved = run.wait_event("deadline_resolved", timeout=30, source="aws-spot")
    assert "child_stopping" not in run.names()[: run.names().index("deadline_resolved")]
    assert run.finish(timeout=90) == EXIT_CHECKPOINTED, run.names()
    assert len([e for e in run.events if e["event"] == "early_warning"]) == 1  # once, not every poll
    end = iso_epoch(str(resolved["deadline"]))
    assert event_time(requested_saves(run)[-1]) < end and no_tracebacks(run)
