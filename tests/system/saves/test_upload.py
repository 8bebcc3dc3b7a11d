"""`--upload` end to end: the tiny PyTorch trainer under esiwrap, a real S3-compatible server on
loopback (moto's, `tests/lib/s3_store.py`) and the real `aws` CLI as the upload command.

Three runs start together (about 50 s in all), each with the deadline 45 s away:

* slow: the CLI's own `max_bandwidth` makes each upload take several times the save; the upload is
  part of the plan, exit 75 comes after `upload_completed` and before the deadline, and the store
  holds the checkpoint of the last save;
* failing: the bucket does not exist; the upload fails (exit code and the CLI's stderr in
  `upload_failed`), training goes on, and esiwrap exits 74, never 75;
* cut off: an upload far slower than esiwrap was told to expect cannot end before the deadline; it
  is cut off (its process group signalled, nothing of it left) and esiwrap exits 74 in time.
"""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, TINY_TRAINER, EsiwrapRun, Finished, processes_with_marker, wait_until
from s3_store import S3Store, store_with_bucket

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_NOT_UPLOADED
from esiwrap.times import iso_epoch

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
QUICK = ["--deadline", "+45s", "--stop-grace", "5", "--redundant-time", "6", "--save-duration", "1",
         "--final-margin", "2", "--unmeasured-factor", "1", "--log-level", "debug"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    with store_with_bucket(tmp_path_factory.mktemp("s3"), "ckpt") as s3:
        yield s3


@pytest.fixture(scope="module")
def runs(store: S3Store, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Finished]:
    tmp = tmp_path_factory.mktemp("upload")

    def start(name: str, bucket: str, upload_duration: str, bandwidth: str | None,
              *early: str) -> EsiwrapRun:
        trainer = [PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(tmp / name), "--step-seconds", "0.3",
                   "--save-seconds", "0.5", "--width", "512"]  # a checkpoint of about 3.3 MB
        return EsiwrapRun([*QUICK, *early, "--upload-duration", upload_duration,
                           "--upload", store.upload_command(bucket, f"{name}/{{step}}/latest.pt"),
                           "--", *trainer], env=store.env(name, bandwidth))

    started = {
        "slow": start("slow", "ckpt", "6", "1MB/s"),
        # saved early (a large reserve), so the CLI has time to fail however loaded the machine is
        "failing": start("failing", "no-such-bucket", "3", None, "--redundant-time", "20"),
        "cut": start("cut", "ckpt", "2", "20KB/s"),
    }
    finished = {}
    try:
        for name, run in started.items():
            code = run.finish(timeout=150)
            finished[name] = Finished(list(run.events), code, "\n".join(run.other_lines))
    finally:
        for run in started.values():
            run.kill()
    return finished


def test_exit_75_comes_after_the_upload_completed_and_the_store_holds_the_checkpoint(
        runs: dict[str, Finished], store: S3Store) -> None:
    """The upload takes several times the save; it is planned into the save's moment, completes
    before the deadline, esiwrap exits 75 only after it, and the object store holds the last
    checkpoint, the step the trainer saved."""
    import torch

    run = runs["slow"]
    assert run.code == EXIT_CHECKPOINTED, run.events[-3:]
    saved, uploaded = run.named("save_completed"), run.named("upload_completed")
    assert uploaded and uploaded[-1]["step"] == saved[-1]["step"]
    assert run.index("upload_completed") < run.index("supervisor_exit")
    upload_s = min(u["duration_s"] for u in uploaded)
    assert upload_s > 3 * max(s["duration_s"] for s in saved)  # the upload takes longer than the save
    # the plan made room for the upload before the deadline: the save was asked for that much earlier
    scheduled = run.named("save_scheduled")[0]
    assert "upload" in scheduled["why"]
    requested = run.named("save_requested")[0]
    assert requested["remaining_s"] > 6 + 6  # --redundant-time + --upload-duration
    deadline = run.deadline
    assert iso_epoch(uploaded[-1]["timestamp"]) < deadline
    assert iso_epoch(run.named("supervisor_exit")[0]["timestamp"]) < deadline
    step = saved[-1]["step"]
    key = f"slow/{step}/latest.pt"
    assert key in store.keys("ckpt")
    state = torch.load(io.BytesIO(store.read("ckpt", key)), weights_only=True)
    assert state["step"] == step


def test_a_failing_upload_never_stops_training_nor_leads_to_exit_75(runs: dict[str, Finished]) -> None:
    """The upload's exit code and the last lines of its stderr are in `upload_failed`; training
    goes on after it; esiwrap exits 74 (the checkpoint is on local storage only), never 75."""
    run = runs["failing"]
    failed = [f for f in run.named("upload_failed") if f["code"] not in (0, None)]
    assert failed, run.named("upload_failed")
    assert any("NoSuchBucket" in line for line in failed[0]["stderr"])
    after = run.events[run.index("upload_failed"):]
    assert any(e["event"] == "step_observed" for e in after)  # training went on
    assert not run.named("upload_completed")
    assert run.code == EXIT_NOT_UPLOADED
    reason = run.named("supervisor_exit")[0]["reason"]
    assert "upload did not finish" in reason and "no checkpoint of this run was uploaded" in reason
    assert "NoSuchBucket" in run.output  # its stderr reached esiwrap's


def test_an_upload_that_cannot_end_before_the_deadline_is_cut_off_in_time(runs: dict[str, Finished]) -> None:
    """An upload far slower than its estimate cannot fit: esiwrap stops waiting for it in time,
    cuts it off (its process group), says so in `upload_failed` and exits 74 before the deadline,
    with no process of the upload left."""
    run = runs["cut"]
    failed = run.named("upload_failed")
    assert failed and failed[-1]["reason"].startswith("cut off")
    assert failed[-1]["signal"] in ("SIGTERM", "SIGKILL") or failed[-1]["code"] not in (0, None)
    assert run.code == EXIT_NOT_UPLOADED
    assert iso_epoch(run.named("supervisor_exit")[0]["timestamp"]) < run.deadline
    assert wait_until(lambda: not processes_with_marker("cut/{step}") and not processes_with_marker(
        "s3://ckpt/cut/"), 10)


def test_upload_placeholders_are_quoted_and_the_checkpoint_is_in_the_environment(tmp_path: Path) -> None:
    """`{path}` reaches the command as one word however odd the path; `{step}` is the number, and
    ESIWRAP_CHECKPOINT_PATH / ESIWRAP_CHECKPOINT_STEP say the same."""
    from esiwrap.shell.upload_process import render

    odd = str(tmp_path / "it's a dir; rm -rf $HOME" / "latest.pt")
    line = render("printf '%s\\n' {path} {step} \"$ESIWRAP_CHECKPOINT_PATH\" \"$ESIWRAP_CHECKPOINT_STEP\"",
                  odd, 7)
    env = {**os.environ, "ESIWRAP_CHECKPOINT_PATH": odd, "ESIWRAP_CHECKPOINT_STEP": "7"}
    done = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.splitlines() == [odd, "7", odd, "7"]


def test_an_unknown_placeholder_is_a_usage_error() -> None:
    """A typo in --upload (`{stpe}`) stops esiwrap before the command starts: one line, exit 2."""
    argv = [PYTHON, "-m", "esiwrap", "--upload", "aws s3 cp {path} s3://b/{stpe}/", "--", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "{stpe}" in done.stderr and "{path}" in done.stderr
