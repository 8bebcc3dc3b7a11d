"""`--restore` in the decision core (fake clock, no processes): before the command starts, the
job's durable checkpoint is looked for, brought back, verified and retried within a bound; a
restore that fails stops the run (exit 66) unless `--restore-optional`; with no state file, the
newest complete manifest names the checkpoint and brings the job's state back."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from controller_driver import T0, Driver, exits, logs

from esiwrap.core import controller as core
from esiwrap.core import manifest as manifests
from esiwrap.core.controller import Checkpoint, Controller, ControllerConfig, Mode
from esiwrap.core.controller.job import Job
from esiwrap.core.policy import PolicyConfig
from esiwrap.core.state import JobState
from esiwrap.core.values import Answer, Deadline
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_NOT_RESTORED

POLICY = PolicyConfig(redundant_s=60.0, save_duration_s=10.0, unmeasured_factor=1.0, verify=True,
                      interruption_rate_per_day=0.0)
RESTORE = ControllerConfig(policy=POLICY, restore=True, state_file="/shared/state.json")
CHECKPOINT = Checkpoint(1200, T0 - 3600.0, "/ckpt/global_step_1200")
MANIFESTS = replace(RESTORE, restore_manifests=True)
RESTORER = 6161


def job(state: JobState | None = None) -> Job:
    found = state if state is not None else JobState(steps=(10.0,) * 5, saves=(30.0,), updated_at=T0 - 600.0,
                                                    checkpoint=CHECKPOINT, checkpoint_durable="upload")
    return Job(found, T0, run_id="r2", host="new-instance")


def launch(config: ControllerConfig = RESTORE, found: Job | None = None,
           deadline_s: float | None = None) -> Driver:
    d = Driver(start=False, controller=Controller(config, job=found or job()))
    d.feed(core.Launch())
    if deadline_s is not None:  # the shell asks its sources once the command is held
        d.feed(core.DeadlineAnswers((Answer("cli", deadline=Deadline(T0 + deadline_s, "cli")),)))
    return d


def of(d: Driver, kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in d.actions if isinstance(a, kind)]


def came_back(d: Driver, code: int | None = 0, after_s: float = 20.0) -> None:
    """The restore command runs for `after_s` and ends with `code`."""
    d.feed(core.RestoreStarted(RESTORER))
    d.advance(after_s)
    d.feed(core.RestoreExited(RESTORER, code, stderr=() if code == 0 else ("fatal error: 403 Forbidden",)))


def verified(d: Driver, ok: bool = True) -> None:
    check = of(d, core.VerifyCheckpoint)[-1]
    d.feed(core.CheckpointVerified(check.step, check.path, ok, format="verl", bytes=5 << 30, files=12,
                                   problem="" if ok else "latest_checkpointed_iteration.txt is missing"))


def test_a_checkpoint_on_this_instance_is_not_restored() -> None:
    d = launch()
    assert d.controller.mode is Mode.STARTING
    assert of(d, core.LookForCheckpoint) == [core.LookForCheckpoint(CHECKPOINT.path)]
    d.feed(core.CheckpointLooked(CHECKPOINT.path, True))
    (skipped,) = logs(d.actions, "restore_skipped")
    assert skipped["step"] == 1200 and "on this instance" in skipped["reason"]
    assert of(d, core.StartCommand) and of(d, core.StartRestore) == []
    assert d.controller.mode is Mode.RUNNING


def test_a_missing_checkpoint_is_restored_verified_and_then_the_command_starts() -> None:
    """`restored` (step, path, seconds, bytes) comes after the verification of what came back; the
    command starts after it, and not before."""
    d = launch()
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    assert of(d, core.StartRestore) == [core.StartRestore(1200, CHECKPOINT.path, 1)]
    came_back(d)
    assert of(d, core.StartCommand) == [] and of(d, core.VerifyCheckpoint)[-1].path == CHECKPOINT.path
    d.advance(1.0)
    verified(d)
    (restored,) = logs(d.actions, "restored")
    assert restored["step"] == 1200 and restored["path"] == CHECKPOINT.path
    assert restored["seconds"] == pytest.approx(21.0) and restored["bytes"] == 5 << 30
    assert len(of(d, core.StartCommand)) == 1 and d.controller.mode is Mode.RUNNING
    assert d.controller.obs.restores == [pytest.approx(21.0)]  # measured, kept in the state file
    d.feed(core.ChildStarted(4242, ("python", "train.py")))
    assert of(d, core.KeepState)[-1].state.restores == (pytest.approx(21.0),)


def test_a_failed_restore_is_retried_then_exits_66_and_never_starts_the_command() -> None:
    d = launch()
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    came_back(d, 1, after_s=1.0)
    d.advance(5.0)
    came_back(d, 1, after_s=1.0)
    d.advance(30.0)
    came_back(d, 1, after_s=1.0)
    attempts = [a.attempt for a in of(d, core.StartRestore)]
    assert attempts == [1, 2, 3]
    failed = logs(d.actions, "restore_failed")
    assert [f["action"] for f in failed] == ["retry in 5 s", "retry in 30 s", f"exit {EXIT_NOT_RESTORED}"]
    assert failed[0]["stderr"] == ["fatal error: 403 Forbidden"] and failed[0]["code"] == 1
    (done,) = exits(d.actions)
    assert done.code == EXIT_NOT_RESTORED and "step 1200" in done.reason and "3 attempt" in done.reason
    assert of(d, core.StartCommand) == [] and d.controller.mode is Mode.EXITED


def test_what_came_back_invalid_is_a_failed_attempt() -> None:
    d = launch()
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    came_back(d)
    verified(d, ok=False)
    (failed,) = logs(d.actions, "restore_failed")
    assert "not valid" in failed["problem"] and "latest_checkpointed_iteration.txt" in failed["problem"]
    assert failed["action"] == "retry in 5 s"


def test_restore_optional_starts_the_command_when_the_bound_is_spent() -> None:
    d = launch(replace(RESTORE, restore_optional=True))
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    for wait in (5.0, 30.0, 0.0):
        came_back(d, 2, after_s=1.0)
        d.advance(wait)
    assert logs(d.actions, "restore_failed")[-1]["action"] == \
        "start the command without it (--restore-optional)"
    assert of(d, core.StartCommand) and not exits(d.actions)


def test_the_restore_is_planned_against_the_deadline() -> None:
    """With the deadline known, the restore must end while the insurance save still fits: it is
    cut off then, and the bound is spent (no retry)."""
    d = launch(deadline_s=400.0)
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    d.feed(core.RestoreStarted(RESTORER))
    (started,) = logs(d.actions, "restore_started")
    cutoff = started["cutoff_in_s"]
    # the insurance save: a step (10 s), the save (30 s x 1.25), and --redundant-time (60 s); the
    # built-in check counts from its first measurement
    assert cutoff == pytest.approx(400.0 - 10.0 - 37.5 - 60.0, abs=0.01)
    d.advance(cutoff + 1.0)
    assert of(d, core.StopRestore) == [core.StopRestore("SIGKILL")]
    assert logs(d.actions, "restore_failed")[-1]["problem"].startswith("cut off")
    assert exits(d.actions)[0].code == EXIT_NOT_RESTORED


def test_a_slot_too_short_for_the_insurance_save_still_restores_while_a_final_save_fits() -> None:
    """60 s left: the insurance save's moment (a step, the save and --redundant-time 60 s before the
    deadline) has passed, but a save with --final-margin (5 s) still fits: the restore runs, cut
    off where that final save could no longer be signalled; the run then saves at once."""
    d = launch(deadline_s=60.0)
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    assert of(d, core.StartRestore) == [core.StartRestore(1200, CHECKPOINT.path, 1)]
    d.feed(core.RestoreStarted(RESTORER))
    (started,) = logs(d.actions, "restore_started")
    assert started["cutoff_for"] == "the final save"
    assert started["cutoff_in_s"] == pytest.approx(60.0 - 10.0 - 31.5 - 5.0, abs=0.01)  # save 30 s x 1.05
    d.advance(2.0)
    d.feed(core.RestoreExited(RESTORER, 0))
    verified(d)
    assert logs(d.actions, "restored") and of(d, core.StartCommand)


def test_an_insurance_moment_a_few_seconds_ahead_does_not_cut_a_first_restore_short() -> None:
    """The insurance save's moment is 10 s ahead and no restore was ever measured: a transfer's
    guess (--upload-duration, 60 s) would not end by then, so the restore is bounded by a final
    save's room, not cut off 10 s in."""
    d = launch(deadline_s=117.5)
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    d.feed(core.RestoreStarted(RESTORER))
    (started,) = logs(d.actions, "restore_started")
    assert started["cutoff_for"] == "the final save"
    assert started["cutoff_in_s"] == pytest.approx(117.5 - 10.0 - 31.5 - 5.0, abs=0.01)


def test_no_attempt_starts_when_not_even_a_final_save_fits() -> None:
    d = launch(deadline_s=30.0)
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    assert of(d, core.StartRestore) == []
    assert logs(d.actions, "restore_failed")[-1]["problem"] == "no time left for a restore"
    assert exits(d.actions)[0].code == EXIT_NOT_RESTORED


def test_manifests_are_fetched_though_the_plans_guesses_leave_the_insurance_no_time() -> None:
    """A new instance with no state file, the deadline 300 s away and --redundant-time 270: before
    the manifests bring the job's measured save back, the insurance save is planned on the guess
    (x the unmeasured factor) and its moment has passed. The manifests, a few small files, are
    fetched all the same, bounded by the deadline alone, and the restore is then planned on the
    measured save: still no room for the insurance, so it is bounded by a final save's."""
    guessing = replace(MANIFESTS, policy=replace(POLICY, redundant_s=270.0, save_duration_s=60.0,
                                                 unmeasured_factor=6.0))
    d = Driver(start=False, controller=Controller(guessing, job=Job(None, T0)))
    d.feed(core.Launch())
    d.feed(core.DeadlineAnswers((Answer("cli", deadline=Deadline(T0 + 300.0, "cli")),)))
    assert of(d, core.FetchManifests) == [core.FetchManifests(1)]
    d.advance(290.0)  # still fetching: 5 s before the deadline (--final-margin) it would be cut off
    assert logs(d.actions, "restore_failed") == []
    d.advance(5.0)
    assert logs(d.actions, "restore_failed")[-1]["problem"] == "cut off: it did not end before the deadline"


def test_manifests_come_back_and_the_restore_is_planned_on_the_measured_save() -> None:
    """The same instance, the manifests back in a second: the restore's cut-off is planned on the
    save the job measured (42 s) and still leaves no room for the insurance: a final save's."""
    guessing = replace(MANIFESTS, policy=replace(POLICY, redundant_s=270.0, save_duration_s=60.0,
                                                 unmeasured_factor=6.0))
    d = Driver(start=False, controller=Controller(guessing, job=Job(None, T0)))
    d.feed(core.Launch())
    d.feed(core.DeadlineAnswers((Answer("cli", deadline=Deadline(T0 + 300.0, "cli")),)))
    d.advance(1.0)
    d.feed(core.ManifestsFetched(0, manifests=(manifest(1100, T0 - 4000),)))
    d.feed(core.CheckpointLooked("/ckpt/global_step_1100", False))
    d.feed(core.RestoreStarted(RESTORER))
    (started,) = logs(d.actions, "restore_started")
    assert started["cutoff_for"] == "the final save"  # 42 s measured: still no room for the insurance
    d.advance(3.0)
    d.feed(core.RestoreExited(RESTORER, 0))
    verified(d)
    assert logs(d.actions, "restored") and of(d, core.StartCommand) and not exits(d.actions)


def test_a_sigterm_while_restoring_stops_the_restore_and_exits_75() -> None:
    """The job's checkpoint is where it was (in the store): exit 75, so the platform resumes it."""
    d = launch()
    d.feed(core.CheckpointLooked(CHECKPOINT.path, False))
    d.feed(core.RestoreStarted(RESTORER))
    d.feed(core.SignalReceived("SIGTERM"))
    assert of(d, core.StopRestore) == [core.StopRestore("SIGKILL")]
    (done,) = exits(d.actions)
    assert done.code == EXIT_CHECKPOINTED and done.cause == "sigterm" and "restoring" in done.reason


def test_the_first_run_has_nothing_to_restore() -> None:
    d = Driver(start=False, controller=Controller(RESTORE, job=Job(None, T0)))
    assert d.feed(core.Launch()) == [core.Log("info", "restore_skipped", {
        "reason": "the job has no durable checkpoint yet (no state file names one): its first run starts "
                  "from scratch"})]
    assert d.controller.mode is Mode.RUNNING


def manifest(step: int, written_at: float, run_id: str = "r1") -> manifests.Manifest:
    state = JobState(steps=(7.0,) * 3, saves=(42.0,), verifies=(0.5,), updated_at=written_at,
                     checkpoint=Checkpoint(step, written_at, f"/ckpt/global_step_{step}"),
                     checkpoint_durable="upload")
    text = manifests.render(step, f"/ckpt/global_step_{step}", written_at, run_id=run_id, state=state)
    return manifests.parse(text, written_at + 60.0, f"{step}/esiwrap-manifest.global_step_{step}.json")


def test_with_no_state_file_the_newest_manifest_names_the_checkpoint_and_brings_the_state() -> None:
    d = Driver(start=False, controller=Controller(MANIFESTS, job=Job(None, T0)))
    d.feed(core.Launch())
    assert of(d, core.FetchManifests) == [core.FetchManifests(1)]
    d.feed(core.ManifestsFetched(0, manifests=(manifest(900, T0 - 9000), manifest(1100, T0 - 4000)),
                                 rejected=(("1200/esiwrap-manifest.global_step_1200.json",
                                            "its checksum does not match its contents"),)))
    (found,) = logs(d.actions, "manifest_found")
    assert found["step"] == 1100 and found["manifests"] == 2 and found["state"] is True
    assert found["rejected"][0]["file"].startswith("1200/")
    assert of(d, core.LookForCheckpoint) == [core.LookForCheckpoint("/ckpt/global_step_1100")]
    assert d.controller.job.resume_from == Checkpoint(1100, T0 - 4000, "/ckpt/global_step_1100")
    assert d.controller.obs.longest_save_s == 42.0 and list(d.controller.obs.intervals) == [7.0] * 3
    d.feed(core.CheckpointLooked("/ckpt/global_step_1100", False))
    assert of(d, core.StartRestore)[-1].step == 1100


def test_no_manifest_found_starts_the_first_run_with_a_warning() -> None:
    d = Driver(start=False, controller=Controller(MANIFESTS, job=Job(None, T0)))
    d.feed(core.Launch())
    d.feed(core.ManifestsFetched(0))
    (skipped,) = logs(d.actions, "restore_skipped")
    assert skipped["level"] == "warning" and "no complete manifest" in skipped["reason"]
    assert of(d, core.StartCommand)


def test_a_manifest_is_complete_only_with_its_checksum() -> None:
    text = manifests.render(5, "/ckpt/latest.pt", T0, run_id="r", bytes_=10, files=1, verified="torch")
    obj = json.loads(text)
    assert obj["checksum"] == manifests.checksum(obj) and obj["name"] == "latest.pt"
    assert manifests.parse(text, T0).step == 5
    with pytest.raises(manifests.ManifestRejected, match="checksum"):
        manifests.parse(text.replace('"step": 5', '"step": 6'), T0)
    with pytest.raises(manifests.ManifestRejected, match="not JSON"):
        manifests.parse(text[: len(text) // 2], T0)
    assert manifests.file_name("/ckpt/global_step_7/") == "esiwrap-manifest.global_step_7.json"


def test_the_state_file_keeps_verifications_and_restores_and_reads_as_before_without_them() -> None:
    from esiwrap.core import state

    plain = state.render(JobState(steps=(1.0,), updated_at=T0))
    assert "verifies" not in plain and "restores" not in plain
    kept = state.parse(state.render(JobState(verifies=(0.01,), restores=(95.2,), updated_at=T0)), T0)
    assert kept.verifies == (0.01,) and kept.restores == (95.2,)
    assert kept.prior().verifies == (0.01,) and kept.prior().restores == (95.2,)


def test_the_run_that_wrote_the_manifest_is_not_taken_for_an_interruption() -> None:
    """Its record in the manifest is still open (it was uploading): closed as `other`, so a job
    whose only survivor is a bucket does not learn an interruption from every run."""
    from esiwrap.core.history import RunRecord

    state = JobState(updated_at=T0 - 4000, runs=(RunRecord(T0 - 8000, T0 - 4000, "r1", ending="running"),))
    found = manifests.parse(manifests.render(3, "/ckpt/3", T0 - 4000, run_id="r1", state=state), T0)
    d = Driver(start=False, controller=Controller(MANIFESTS, job=Job(None, T0, run_id="r2")))
    d.feed(core.Launch())
    d.feed(core.ManifestsFetched(0, manifests=(found,)))
    assert d.controller.job.found is not None
    assert [(r.run_id, r.ending) for r in d.controller.job.found.runs] == [("r1", "other")]
