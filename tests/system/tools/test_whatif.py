"""`esiwrap report LOG --what-if OPTIONS`: a real run's measured steps and saves, replayed through the
decision core with other settings; the replay agrees with the run and with the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, TINY_TRAINER, EsiwrapRun
from fakes.fixtures import CREDENTIALS, INSTANCE_ID, REGION, SCHEDULED_ID, rfc3339_in
from fakes.metadata import FakeMetadata
from fakes.volcengine_api import FakeVolcengineApi

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from runners import run_esiwrap
from traces import DeadlineChange, Scenario

from esiwrap.core.policy import PolicyConfig
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_USAGE
from esiwrap.times import iso_epoch

pytestmark = pytest.mark.system

WHAT_IF = "--redundant-time 1 --final-margin 0.5"


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run of the demo trainer with step times in the log (debug). Its deadline, 20 s
    away, comes from the Volcengine fakes once the trainer has attached: however long torch takes
    to start on a busy node, the run has 20 s of steps and saves to replay."""
    tmp = tmp_path_factory.mktemp("whatif")
    log = tmp / "run.jsonl"
    items = {"/latest/instance_id": INSTANCE_ID, "/latest/region_id": REGION}
    with FakeMetadata(items) as imds, FakeVolcengineApi() as api:
        api.add_instance(INSTANCE_ID, SCHEDULED_ID, expired_at=rfc3339_in(86400))
        api.set_release(SCHEDULED_ID, "")  # no release time yet: no deadline
        env = {**CREDENTIALS, "ESIWRAP_METADATA_URL": imds.url, "ESIWRAP_VOLCENGINE_ENDPOINT": api.url}
        run = EsiwrapRun([
            "--sources", "volcengine", "--refresh", "1", "--redundant-time", "4", "--save-duration", "1",
            "--final-margin", "1", "--log-level", "debug", "--log-file", str(log), "--", PYTHON,
            str(TINY_TRAINER), "--ckpt-dir", str(tmp / "ckpt"), "--step-seconds", "0.3"], env=env)
        try:
            run.wait_event("trainer_attached", timeout=120)
            api.set_release(SCHEDULED_ID, rfc3339_in(20))
            code = run.finish(timeout=120)
        finally:
            run.kill()
    assert code == EXIT_CHECKPOINTED, run.names()
    return log


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "esiwrap", "report", *args], capture_output=True, text=True,
                          timeout=60)


def test_the_replay_with_the_runs_own_settings_is_the_run(run_log: Path) -> None:
    """Replayed with the settings it ran with (logged in child_started), the run keeps the step it
    kept (within one step: the real timer may fire a little late on a loaded machine)."""
    done = report(str(run_log), "--json", "--what-if", WHAT_IF)
    assert done.returncode == 0, done.stderr
    (replayed,) = json.loads(done.stdout)["what_if"]
    assert replayed["exact_steps"] and replayed["steps_measured"] > 20
    actual, as_run = replayed["actual"], replayed["replayed_as_run"]
    assert actual["saved_step"] is not None and not actual["missed"]
    assert abs(as_run["saved_step"] - actual["saved_step"]) <= 1
    assert as_run["saves"][0]["kind"] == "insurance"


def test_the_what_if_is_what_the_simulator_says_on_the_same_durations(run_log: Path) -> None:
    """The what-if column equals benchmarks/simulate.py's esiwrap on a scenario built from the
    log's own step and save times, the deadline taken from the first trainer's hello, and what the
    run knew before its first save: the checkpoint's size, the probed speed, the capacity."""
    done = report(str(run_log), "--json", "--what-if", WHAT_IF)
    (replayed,) = json.loads(done.stdout)["what_if"]
    events = [json.loads(line) for line in run_log.read_text().splitlines()]
    start = iso_epoch(next(e for e in events if e["event"] == "trainer_attached")["timestamp"])
    deadline = iso_epoch(next(e for e in events if e["event"] == "deadline_resolved")["deadline"]) - start
    steps = [e["duration_s"] for e in events if e["event"] == "step_observed"]
    median = sorted(steps)[len(steps) // 2]
    while sum(steps) <= deadline + median:
        steps.append(median)
    saved = [(e["step"], e["duration_s"]) for e in events if e["event"] == "save_completed"]
    saves = [min(saved, key=lambda s: abs(s[0] - k))[1] for k in range(1, len(steps) + 1)]
    hello = next(e for e in events if e["event"] == "trainer_attached")
    probed = next(e for e in events if e["event"] == "storage_probed")
    resolved = next(e for e in events if e["event"] == "deadline_resolved")
    scenario = Scenario("log", steps, saves, deadline, deadline, list[DeadlineChange](),
                        checkpoint_bytes=hello["checkpoint_bytes"], probe_bps=probed["bandwidth_mb_s"] * 1e6,
                        capacity=resolved["capacity"])
    settings = next(e for e in events if e["event"] == "settings")["settings"]
    config = PolicyConfig(redundant_s=1.0, final_margin_s=0.5, save_duration_s=settings["--save-duration"])
    outcome = run_esiwrap(scenario, config)
    assert replayed["what_if"]["saved_step"] == outcome.saved_step
    assert replayed["what_if"]["lost_s"] == pytest.approx(outcome.lost_s, abs=1e-3)
    assert [s["step"] for s in replayed["what_if"]["saves"]] == [w.step for w in outcome.completed]


def test_the_text_report_shows_the_three_columns(run_log: Path) -> None:
    done = report(str(run_log), "--what-if", WHAT_IF)
    assert done.returncode == 0, done.stderr
    assert f"what if {WHAT_IF}" in done.stdout and "replayed as run" in done.stdout
    assert "work lost" in done.stdout and "missed" in done.stdout


@pytest.mark.parametrize("options", ["--redundant-time soon", "--no-such-option 3", "-- python x.py"])
def test_options_that_are_not_esiwraps_are_one_line_and_exit_2(run_log: Path, options: str) -> None:
    done = report(str(run_log), "--what-if", options)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("esiwrap: ") and done.stderr.count("\n") == 1, done.stderr
