"""Resume anywhere, end to end: the tiny PyTorch trainer under esiwrap, a real S3-compatible server
on loopback (moto's, `tests/lib/s3_store.py`) and the real `aws` CLI for every command.

* instance 1: uploads each verified checkpoint and its manifest (`{manifest}`, copied last);
* instance 2 has nothing: its checkpoint directory and its state file are gone. `--restore-manifests`
  copies the job's manifests back, the newest complete one names the checkpoint and brings the
  job's state back; `--restore` copies the checkpoint, esiwrap verifies it, the command starts and
  resumes from it with `steps_redone: 0`;
* instance 3 keeps the state file (shared storage) and has no checkpoint: it restores from the
  state file alone, with the restore's measured time in the plan;
* instance 4's restore fails (the bucket is wrong): it is retried within the deadline's plan, then
  esiwrap exits 66 and the trainer never starts.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, TINY_TRAINER, EsiwrapRun, Finished
from s3_store import AWS, S3Store, store_with_bucket

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_NOT_RESTORED

pytestmark = [pytest.mark.system, pytest.mark.timeout(400)]
# The insurance save only (after the calibration save that measures the upload): what is tested is
# the way back, not how close to the deadline a final save's two `aws` calls can end on a busy node.
QUICK = ["--deadline", "+30s", "--stop-grace", "5", "--redundant-time", "10", "--save-duration", "1",
         "--no-final-save", "--unmeasured-factor", "1", "--upload-duration", "2", "--log-level", "debug"]
PREFIX = "s3://ckpt/job"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    with store_with_bucket(tmp_path_factory.mktemp("s3"), "ckpt") as s3:
        yield s3


def commands(store: S3Store, prefix: str = PREFIX) -> list[str]:
    """The options a user writes: the worked example of docs/uploads-and-resumes.md."""
    aws = f"{shlex.quote(AWS)} --endpoint-url {store.url} s3 cp --only-show-errors"
    return [
        "--upload", f"{aws} {{path}} {prefix}/{{step}}/latest.pt && {aws} {{manifest}} "
                    f"{prefix}/{{step}}/esiwrap-manifest.json",
        "--restore", f"{aws} {prefix}/{{step}}/latest.pt {{path}}",
        "--restore-manifests", f"{aws} --recursive {prefix}/ {{dir}} --exclude '*' "
                               "--include '*/esiwrap-manifest.json'",
    ]


def run(store: S3Store, instance: Path, *options: str, name: str = "run") -> Finished:
    esiwrap = EsiwrapRun([*QUICK, *options, "--state-file", str(instance / "state" / "esiwrap-state.json"),
                          "--", PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(instance / "ckpt"),
                          "--step-seconds", "0.3"], env=store.env(name))
    try:
        code = esiwrap.finish(timeout=150)
    finally:
        esiwrap.kill()
    return Finished(list(esiwrap.events), code, esiwrap.stdout.decode("utf-8", "replace"))


def fresh(instance: Path) -> Path:
    """A new instance: nothing on its disk but an empty directory for the state file."""
    shutil.rmtree(instance, ignore_errors=True)
    (instance / "state").mkdir(parents=True)
    return instance


@pytest.fixture(scope="module")
def job(store: S3Store, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Finished]:
    base = tmp_path_factory.mktemp("instances")
    instance = fresh(base / "instance")
    done = {"first": run(store, instance, *commands(store), name="first")}
    fresh(instance)  # the instance is gone: checkpoint directory and state file with it
    done["bucket only"] = run(store, instance, *commands(store), name="second")
    shutil.rmtree(instance / "ckpt")  # the state file survives (shared storage), the checkpoint not
    done["state file"] = run(store, instance, *commands(store), name="third")
    done["state"] = Finished([json.loads((instance / "state" / "esiwrap-state.json").read_text())], 0, "")
    shutil.rmtree(instance / "ckpt")
    done["failing"] = run(store, instance, *commands(store, "s3://no-such-bucket/job"), name="fourth")
    return done


def test_the_first_instance_uploads_each_checkpoint_with_its_manifest_last(
        job: dict[str, Finished], store: S3Store) -> None:
    first = job["first"]
    assert first.code == EXIT_CHECKPOINTED
    uploaded = [e["step"] for e in first.named("upload_completed")]
    assert uploaded and uploaded[-1] == first.exit["durable_step"]
    (skipped,) = first.named("restore_skipped")  # --restore-manifests found none: the first run
    assert skipped["level"] == "warning" and skipped["reason"].startswith("no complete manifest was found")
    keys = store.keys("ckpt")
    for step in uploaded:
        assert f"job/{step}/latest.pt" in keys and f"job/{step}/esiwrap-manifest.json" in keys
    manifest = json.loads(store.read("ckpt", f"job/{uploaded[-1]}/esiwrap-manifest.json"))
    assert manifest["format"] == "esiwrap-manifest/1" and manifest["step"] == uploaded[-1]
    assert manifest["verified"] == "torch" and manifest["bytes"] > 0
    assert manifest["checksum"].startswith("sha256:")
    checkpoint = manifest["state"]["checkpoint"]
    assert (checkpoint["step"], checkpoint["path"], checkpoint["durable"]) == \
        (uploaded[-1], manifest["path"], "upload")


def test_an_empty_instance_restores_from_the_bucket_alone_and_resumes_without_redoing_a_step(
        job: dict[str, Finished]) -> None:
    first, second = job["first"], job["bucket only"]
    (found,) = second.named("manifest_found")
    # the newest checkpoint all in the store: the last uploaded (or one whose upload was cut off
    # after its manifest, copied last, got there: then it is complete too)
    durable = found["step"]
    assert durable >= first.exit["durable_step"] and found["state"] is True
    assert found["written_by"] == first.events[0]["run_id"]
    (restored,) = second.named("restored")
    assert restored["step"] == durable and restored["format"] == "torch" and restored["bytes"] > 0
    assert restored["seconds"] > 0
    # the command starts only once the checkpoint is back and verified
    assert second.index("restored") < second.index("child_started")
    (resumed,) = second.named("resumed")
    assert resumed["checkpoint_step"] == durable == resumed["start_step"] and resumed["steps_redone"] == 0
    assert not second.named("resume_missed")
    assert f"starting at step {durable}" in second.output
    assert second.code == EXIT_CHECKPOINTED
    # the job's state came back with the checkpoint: the first run is in its history
    loaded = second.named("trainer_attached")
    assert loaded and second.named("save_scheduled")


def test_with_the_state_file_kept_only_the_checkpoint_is_restored(job: dict[str, Finished]) -> None:
    second, third = job["bucket only"], job["state file"]
    assert not third.named("manifest_found")  # the state file names the checkpoint
    (started,) = third.named("restore_started")
    assert started["step"] == second.exit["durable_step"] and started["expected_s"] is not None
    (resumed,) = third.named("resumed")
    assert resumed["steps_redone"] == 0 and third.code == EXIT_CHECKPOINTED
    state = job["state"].events[0]
    assert [r["run_id"] for r in state["runs"]] == [job[n].events[0]["run_id"] for n in
                                                      ("first", "bucket only", "state file")]
    assert len(state["restores"]) == 2 and all(s > 0 for s in state["restores"])
    assert state["verifies"] and state["checkpoint"]["step"] == third.exit["durable_step"]


def test_a_restore_that_fails_stops_with_66_and_never_starts_training(job: dict[str, Finished]) -> None:
    failing = job["failing"]
    assert failing.code == EXIT_NOT_RESTORED
    failed = failing.named("restore_failed")
    assert failed[0]["action"] == "retry in 5 s" and failed[0]["code"] not in (0, None)
    assert any("NoSuchBucket" in line or "does not exist" in line for line in failed[0]["stderr"]), failed[0]
    assert failed[-1]["action"] == f"exit {EXIT_NOT_RESTORED}"
    assert not failing.named("child_started") and "tiny_trainer" not in failing.output
    assert "--restore could not bring back" in failing.exit["reason"]
