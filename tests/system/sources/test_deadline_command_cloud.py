"""`esiwrap deadline` as the diagnostic for the cloud sources: what each said, and the winner."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping

import pytest
from fakes.azure import FakeAzureMetadata
from fakes.fixtures import CREDENTIALS, SCHEDULED_ID, rfc3339_in
from fakes.gcp import FakeGcpMetadata
from fakes.metadata import FakeMetadata
from fakes.network import Blackhole
from fakes.volcengine_api import ACCESS_DENIED, FakeVolcengineApi

from esiwrap.errors import EXIT_NO_DEADLINE, EXIT_OK
from esiwrap.times import parse_iso

pytestmark = pytest.mark.system

ALL_CLOUD = "cli,env,volcengine,volcengine-spot,aws-spot"


def deadline(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith(("MLP_", "SAGEMAKER_"))}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "esiwrap", "deadline", *args], env=full,
                          capture_output=True, text=True, timeout=60)


def test_table_shows_value_raw_and_winner(cloud_env: dict[str, str], fake_api: FakeVolcengineApi) -> None:
    """The volcengine line carries the parsed UTC time and the raw string; it wins; exit 0."""
    raw = rfc3339_in(7200)
    fake_api.set_release(SCHEDULED_ID, raw)
    out = deadline("--sources", "env,volcengine,volcengine-spot", env=cloud_env)
    assert out.returncode == EXIT_OK, out.stderr
    lines = out.stdout.splitlines()
    volc = next(line for line in lines if line.startswith("volcengine "))
    assert repr(raw) in volc
    assert "volcengine-spot  unavailable: no spot interruption notice" in out.stdout
    assert lines[-1].startswith("deadline: ") and "from volcengine," in lines[-1]
    assert out.stderr == ""


def test_json_report(cloud_env: dict[str, str], fake_api: FakeVolcengineApi) -> None:
    """--json: every source with ok/raw/reason, the scheduled instance, and the winner."""
    raw = rfc3339_in(7200, offset_hours=0)
    fake_api.set_release(SCHEDULED_ID, raw)
    out = deadline("--json", "--sources", "volcengine,volcengine-spot", env=cloud_env)
    report = json.loads(out.stdout)
    by_name = {s["source"]: s for s in report["sources"]}
    assert by_name["volcengine"]["ok"] and by_name["volcengine"]["raw"] == raw
    assert by_name["volcengine"]["epoch"] == parse_iso(raw)
    assert by_name["volcengine"]["scheduled_instance_id"] == SCHEDULED_ID
    assert by_name["volcengine-spot"] == {"source": "volcengine-spot", "ok": False,
                                          "reason": "no spot interruption notice"}
    assert report["source"] == "volcengine"


def test_access_denied_is_one_line_and_exit_3(cloud_env: dict[str, str], fake_api: FakeVolcengineApi) -> None:
    """A denied API call: one line with the permissions to grant, no traceback, exit 3."""
    fake_api.state.failure = ACCESS_DENIED
    out = deadline("--sources", "volcengine", env=cloud_env)
    assert out.returncode == EXIT_NO_DEADLINE
    assert out.stdout.splitlines()[0].startswith("volcengine  unavailable: DescribeInstances: AccessDenied")
    assert "ecs:DescribeScheduledInstances" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_no_cloud_at_all_answers_within_seconds() -> None:
    """Off any cloud (metadata addresses unroutable): one line per source, exit 3, within the
    probes' own 1 s connect timeouts (the reasons name them; without them each probe would wait
    for the kernel to give up on its SYNs, two minutes, and deadline() gives up after one)."""
    with Blackhole() as hole:
        env = {**CREDENTIALS, "ESIWRAP_METADATA_URL": hole.url, "ESIWRAP_AWS_METADATA_URL": hole.url}
        out = deadline("--sources", ALL_CLOUD, env=env)
    assert out.returncode == EXIT_NO_DEADLINE
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == [
        "env:MLP", "env:SAGEMAKER", "volcengine", "volcengine-spot", "aws-spot"]
    assert "not on a Volcengine ECS instance?" in lines[2]
    assert "not on an AWS EC2 instance?" in lines[4]
    assert all(line.endswith("connect timed out after 1s)") for line in lines[2:5]), lines
    assert out.stderr == ""


def test_a_notice_beats_the_release_time(cloud_env: dict[str, str], fake_metadata: FakeMetadata) -> None:
    """Both known: the spot notice, earlier, is the winner."""
    notice = rfc3339_in(240)
    fake_metadata.set("/latest/spot_instance_termination_time", notice)
    out = deadline("--json", "--sources", "volcengine,volcengine-spot", env=cloud_env)
    report = json.loads(out.stdout)
    assert report["source"] == "volcengine-spot" and report["epoch"] == parse_iso(notice)


def test_azure_gcp_and_aws_each_answer(fake_azure: FakeAzureMetadata, fake_gcp: FakeGcpMetadata,
                                       fake_aws_metadata: FakeMetadata) -> None:
    """`esiwrap deadline` with the three new clouds' sources: Azure's Preempt NotBefore, GCP's
    preemption (first seen + 30 s) and AWS's rebalance warning, each with its capacity; the
    earliest rules."""
    event_id = fake_azure.schedule("Preempt", 600)
    fake_gcp.set("instance/preempted", "TRUE")
    fake_aws_metadata.set("/latest/meta-data/events/recommendations/rebalance",
                          json.dumps({"noticeTime": "2027-01-15T08:00:00Z"}))
    fake_aws_metadata.set("/latest/meta-data/instance-life-cycle", "spot")
    env = {"ESIWRAP_AZURE_METADATA_URL": fake_azure.url, "ESIWRAP_GCP_METADATA_URL": fake_gcp.url,
           "ESIWRAP_AWS_METADATA_URL": fake_aws_metadata.url}
    before = time.time()
    out = deadline("--json", "--sources", "azure,gcp,aws-spot", env=env)
    assert out.returncode == EXIT_OK, out.stderr
    report = json.loads(out.stdout)
    by_name = {s["source"]: s for s in report["sources"]}
    assert by_name["azure"]["event_id"] == event_id and by_name["azure"]["capacity"] == "spot"
    assert by_name["gcp"]["ok"] and before + 30 <= by_name["gcp"]["epoch"] <= time.time() + 30
    assert by_name["aws-spot"]["reason"] == "no spot interruption notice"
    assert by_name["aws-spot"]["capacity"] == "spot"
    assert "noticeTime 2027-01-15T08:00:00Z" in by_name["aws-spot"]["early_warning"]
    assert report["source"] == "gcp"
    table = deadline("--sources", "azure,gcp", env=env)
    assert table.stdout.splitlines()[0].startswith("azure ") and "from gcp," in table.stdout
