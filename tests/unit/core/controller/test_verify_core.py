"""Verification in the decision core (fake clock, no processes): a checkpoint counts once it is
verified; an invalid one never counts, the valid one before it stays durable, a new save is asked
for while one can be; exit 75 needs a valid checkpoint; verification is planned and bounded."""

from __future__ import annotations

from dataclasses import replace

import pytest
from controller_driver import CHILD, Driver, exits, logs, signals, stop_when_due

from esiwrap.core import controller as core
from esiwrap.core.controller import ControllerConfig, Mode
from esiwrap.core.policy import (
    VERIFY_SAFETY_FACTOR,
    VERIFY_TIMEOUT_MIN_S,
    Observations,
    PolicyConfig,
    plan_save,
    verify_estimate_s,
)
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_NOT_UPLOADED, EXIT_SAVE_MISSED

POLICY = PolicyConfig(redundant_s=4.0, save_duration_s=1.0, final_margin_s=2.0, unmeasured_factor=1.0,
                      interruption_rate_per_day=0.0, verify=True)
VERIFYING = ControllerConfig(policy=POLICY, stop_grace_s=3.0)
NO_FINAL = replace(VERIFYING, policy=replace(POLICY, final_save=False))
UPLOADING = replace(VERIFYING, policy=replace(POLICY, uploads=True, upload_duration_s=2.0))
UPLOADER = 5151


def asked(d: Driver) -> list[core.VerifyCheckpoint]:
    return [a for a in d.actions if isinstance(a, core.VerifyCheckpoint)]


def answer(d: Driver, ok: bool = True, **fields: object) -> list[core.Action]:
    """The shell's answer to the last VerifyCheckpoint."""
    check = asked(d)[-1]
    defaults: dict[str, object] = {"format": "torch", "checked": "a torch zip", "bytes": 1000, "files": 1}
    if not ok:
        defaults.update(problem="latest.pt: the end-of-central-directory record is missing: cut short",
                        fix="the save did not finish; resume from the previous checkpoint")
    return d.feed(core.CheckpointVerified(check.step, check.path, ok, **{**defaults, **fields}))  # type: ignore[arg-type]


def insured(d: Driver, deadline_s: float, path: str = "/ckpt/{step}") -> int:
    """Steps of 1 s up to the planned insurance save, which takes 0.5 s; its step."""
    d.deadline(deadline_s)
    d.hello()
    step = 0
    while not logs(d.actions, "save_requested"):
        step += 1
        d.steps(step, 1, 1.0)
    step += 1
    d.steps(step, 1, 1.0)
    d.save(step, 0.5, path=path.format(step=step))
    return step


def by_hand(d: Driver, step: int, path: str = "/ckpt/{step}") -> int:
    """A save asked for by hand (SIGUSR1), taken at the next boundary; its step."""
    d.feed(core.SignalReceived("SIGUSR1"))
    d.steps(step + 1, 1, 1.0)
    d.save(step + 1, 0.5, path=path.format(step=step + 1))
    return step + 1


def early(config: ControllerConfig = VERIFYING) -> tuple[Driver, int]:
    """An hour before the deadline, a valid checkpoint saved by hand; the driver and its step."""
    d = Driver(config)
    d.deadline(3600)
    d.hello()
    d.steps(1, 3, 1.0)
    step = by_hand(d, 3)
    answer(d)
    return d, step


def test_a_completed_save_is_verified_before_it_counts() -> None:
    """The save's end asks for a verification of that checkpoint; it is durable only once valid,
    and `checkpoint_verified` says its format, what was checked and how long it took."""
    d = Driver(NO_FINAL)
    step = insured(d, 60)
    (check,) = asked(d)
    assert (check.step, check.path, check.previous) == (step, f"/ckpt/{step}", "")
    assert d.controller.uploads.durable is None and logs(d.actions, "checkpoint_verified") == []
    d.advance(0.25)
    answer(d)
    (verified,) = logs(d.actions, "checkpoint_verified")
    assert verified["step"] == step and verified["format"] == "torch" and verified["checked"] == "a torch zip"
    assert verified["seconds"] == pytest.approx(0.25) and verified["by"] == "built-in"
    assert d.controller.uploads.durable is not None and d.controller.uploads.durable.step == step
    stop_when_due(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_a_save_over_the_file_being_checked_replaces_that_check() -> None:
    """One file saved in place: the trainer's next save ends while the last one is still being
    checked. The file now holds the newer checkpoint: the old check is given up (not an invalid
    checkpoint) and the newer one is checked and counts."""
    d = Driver(NO_FINAL)
    first = insured(d, 60, path="/ckpt/latest.pt")
    d.advance(0.1)
    second = by_hand(d, first, path="/ckpt/latest.pt")
    assert [(c.step, c.path) for c in asked(d)] == [(first, "/ckpt/latest.pt"), (second, "/ckpt/latest.pt")]
    assert any(isinstance(a, core.StopVerify) for a in d.actions)
    answer(d)
    assert logs(d.actions, "checkpoint_invalid") == []
    (verified,) = logs(d.actions, "checkpoint_verified")
    assert verified["step"] == second
    assert d.controller.uploads.durable is not None and d.controller.uploads.durable.step == second


def test_the_upload_and_the_manifest_wait_for_the_verification() -> None:
    """With --upload, the upload starts once the checkpoint is valid, after its manifest (whose
    state names it as the job's durable checkpoint)."""
    d = Driver(replace(UPLOADING, manifests=True))
    step = insured(d, 120)
    assert not [a for a in d.actions if isinstance(a, (core.StartUpload, core.WriteManifest))]
    answer(d, bytes=4096, files=3, format="dcp")
    manifest, upload = [a for a in d.actions if isinstance(a, (core.StartUpload, core.WriteManifest))]
    assert isinstance(manifest, core.WriteManifest) and isinstance(upload, core.StartUpload)
    assert (manifest.step, manifest.path, manifest.bytes, manifest.files, manifest.format) == \
        (step, f"/ckpt/{step}", 4096, 3, "dcp")
    assert manifest.state.checkpoint is not None and manifest.state.checkpoint.step == step
    assert manifest.state.checkpoint_durable == "upload"
    assert upload.step == step


def test_an_invalid_checkpoint_never_counts_and_a_new_save_is_asked_for_at_once() -> None:
    """`checkpoint_invalid` (an error) says what is wrong and the fix; the valid checkpoint before
    it stays durable; the trainer is signalled again at once (reason `invalid`)."""
    d, first = early()
    d.steps(first + 1, 3, 1.0)
    second = by_hand(d, first + 3)
    assert asked(d)[-1].previous == f"/ckpt/{first}"
    before = len(signals(d.actions))
    answer(d, ok=False)
    (invalid,) = logs(d.actions, "checkpoint_invalid")
    assert invalid["level"] == "error" and invalid["step"] == second
    assert "cut short" in invalid["problem"] and invalid["fix"]
    assert invalid["durable_step"] == first and invalid["action"] == "save again now"
    assert d.controller.uploads.durable is not None and d.controller.uploads.durable.step == first
    again = logs(d.actions, "save_requested")[-1]
    assert again["reason"] == "invalid" and len(signals(d.actions)) == before + 1


def test_saves_are_asked_again_only_twice_in_a_row() -> None:
    """A trainer whose every save is broken is not asked again and again: after two invalid
    checkpoints in a row the third says why no save is asked for; the planned saves go on."""
    d, step = early()
    step = by_hand(d, step + 1)
    for _ in range(3):
        answer(d, ok=False)
        if logs(d.actions, "checkpoint_invalid")[-1]["action"] != "save again now":
            break
        step += 1
        d.steps(step, 1, 1.0)
        d.save(step, 0.5, path=f"/ckpt/{step}")
    actions = [e["action"] for e in logs(d.actions, "checkpoint_invalid")]
    assert actions[:2] == ["save again now"] * 2
    assert actions[2].startswith("none: 3 checkpoints in a row were invalid")


def test_exit_75_names_an_invalid_checkpoint_after_the_valid_one() -> None:
    """The last save is invalid and no other fits: esiwrap stops with 75 on the valid one before it,
    and the exit reason names both."""
    d = Driver(NO_FINAL)
    first = insured(d, 40)
    answer(d)
    d.steps(first + 1, 2, 1.0)
    d.feed(core.SignalReceived("SIGUSR1"))
    d.steps(first + 3, 1, 1.0)
    d.save(first + 3, 0.5, path=f"/ckpt/{first + 3}")
    answer(d, ok=False)
    stop_when_due(d)
    (done,) = exits(d.actions)
    assert done.code == EXIT_CHECKPOINTED
    assert f"resumes from step {first}" in done.reason and f"step {first + 3} is invalid" in done.reason


def test_exit_76_when_no_checkpoint_of_the_run_is_valid() -> None:
    d = Driver(NO_FINAL)
    step = insured(d, 30)
    answer(d, ok=False)
    stop_when_due(d)
    (done,) = exits(d.actions)
    assert done.code == EXIT_SAVE_MISSED
    assert "no checkpoint of this run is valid" in done.reason and f"step {step} is invalid" in done.reason


def test_exit_74_when_the_valid_checkpoints_upload_did_not_complete() -> None:
    d = Driver(replace(UPLOADING, policy=replace(UPLOADING.policy, final_save=False)))
    insured(d, 60)
    answer(d)
    d.feed(core.UploadStarted(UPLOADER))
    d.feed(core.UploadExited(UPLOADER, 1, stderr=("AccessDenied",)))
    stop_when_due(d)
    d.advance(120)
    assert exits(d.actions)[0].code == EXIT_NOT_UPLOADED


def test_the_stop_waits_for_a_verification_and_gives_it_up_before_the_deadline() -> None:
    """The child is gone and the last checkpoint is still being verified: esiwrap waits
    (verifying), gives it up before the deadline (StopVerify), and the checkpoint does not count."""
    d = Driver(NO_FINAL)
    step = insured(d, 25)
    stop_when_due(d)
    assert d.controller.mode is Mode.VERIFYING and not exits(d.actions)
    deadline = d.controller.deadline
    assert deadline is not None
    d.advance(60)
    assert any(isinstance(a, core.StopVerify) for a in d.actions)
    (invalid,) = logs(d.actions, "checkpoint_invalid")
    assert invalid["step"] == step and invalid["by"] == "cut-off"
    assert invalid["problem"].startswith("not verified:")
    (done,) = exits(d.actions)
    assert done.code == EXIT_SAVE_MISSED and d.wall < deadline.at
    assert "not verified" in done.reason or "invalid" in done.reason


def test_a_verification_at_the_stop_may_run_until_a_second_before_the_deadline() -> None:
    """Nothing needs a grace after the cut-off (the built-in check is abandoned, a --verify command
    gets SIGKILL): a check still running at the stop is waited for until 1 s before the deadline,
    and one that ends 1.5 s before it counts."""
    d = Driver(NO_FINAL)
    insured(d, 25)
    stop_when_due(d)
    deadline = d.controller.deadline
    assert deadline is not None and d.controller.mode is Mode.VERIFYING
    d.advance(deadline.at - d.wall - 1.5)
    assert not logs(d.actions, "checkpoint_invalid") and not exits(d.actions)
    answer(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED
    late = Driver(NO_FINAL)
    insured(late, 25)
    stop_when_due(late)
    late.advance(deadline.at - late.wall - 1.05)
    assert not logs(late.actions, "checkpoint_invalid")  # still waited for 1.05 s before it
    late.advance(0.1)  # the cut-off, 1 s before the deadline, falls inside this tenth of a second
    (invalid,) = logs(late.actions, "checkpoint_invalid")
    assert invalid["by"] == "cut-off" and any(isinstance(a, core.StopVerify) for a in late.actions)


def test_the_stop_waits_for_a_verification_that_ends_in_time() -> None:
    d = Driver(NO_FINAL)
    insured(d, 40)
    stop_when_due(d)
    assert d.controller.mode is Mode.VERIFYING
    d.advance(0.5)
    answer(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_a_verification_that_hangs_while_training_is_given_up() -> None:
    """A check stuck on a dead mount is given up after its timeout: the checkpoint is not valid."""
    d, _ = early()
    by_hand(d, 10)
    started = d.mono
    while not logs(d.actions, "checkpoint_invalid"):
        d.advance(5.0)
        d.feed(core.Step(CHILD, 100, 1.0))
    assert d.mono - started >= VERIFY_TIMEOUT_MIN_S
    assert any(isinstance(a, core.StopVerify) for a in d.actions)


def sigtermed() -> Driver:
    """Three steps of 1 s with a deadline an hour away, then SIGTERM: the save is asked for."""
    d = Driver(VERIFYING)
    d.deadline(3600)
    d.hello()
    d.steps(1, 3, 1.0)
    d.feed(core.SignalReceived("SIGTERM"))
    return d


def child_stopped(d: Driver) -> None:
    """The child died of the stop's SIGTERM and nothing of its tree is left."""
    d.feed(core.ChildExited(CHILD, None, "SIGTERM", 15))
    d.feed(core.TreeChecked(0))


def test_a_sigterm_save_stops_once_it_is_verified() -> None:
    """SIGTERM: the save at the next boundary, then its verification, then the stop (exit 75)."""
    d = sigtermed()
    d.steps(4, 1, 1.0)
    d.save(4, 0.5)
    assert not any(isinstance(a, core.StopChild) for a in d.actions)
    assert d.controller.mode is Mode.DRAINING
    answer(d)
    assert any(isinstance(a, core.StopChild) for a in d.actions)
    child_stopped(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_a_sigterm_save_that_is_invalid_is_saved_again() -> None:
    d = sigtermed()
    d.steps(4, 1, 1.0)
    d.save(4, 0.5)
    before = len(signals(d.actions))
    answer(d, ok=False)
    assert logs(d.actions, "save_requested")[-1]["reason"] == "invalid"
    assert [s.pids for s in signals(d.actions)[before:]] == [(CHILD,)]
    d.steps(5, 1, 0.5)
    d.save(5, 0.5)
    answer(d)
    child_stopped(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_the_last_save_waits_for_its_verification_before_the_stop() -> None:
    """No further save fits: the stop waits (training on) for the last checkpoint's verification;
    an invalid one is saved again before the stop, while there is time."""
    d = Driver(replace(NO_FINAL, policy=replace(NO_FINAL.policy, redundant_s=30.0)))
    step = insured(d, 120)
    assert not any(isinstance(a, core.StopChild) for a in d.actions)
    before = len(signals(d.actions))
    answer(d, ok=False)
    assert logs(d.actions, "save_requested")[-1]["reason"] == "invalid"
    assert [s.pids for s in signals(d.actions)[before:]] == [(CHILD,)]
    assert not any(isinstance(a, core.StopChild) for a in d.actions)  # the stop waits for it
    d.steps(step + 1, 1, 1.0)
    d.save(step + 1, 0.5, path=f"/ckpt/{step + 1}")
    answer(d)
    assert any(isinstance(a, core.StopChild) for a in d.actions)
    child_stopped(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_a_deleted_previous_checkpoint_is_warned_about_once() -> None:
    """The trainer deleted the last valid checkpoint before the next one was verified: one
    warning, with verl's setting in the fix; without --upload it no longer counts."""
    d, step = early()
    first = step
    for _ in (1, 2):
        step = by_hand(d, step)
        answer(d, previous_gone=True)
    (warning,) = logs(d.actions, "previous_checkpoint_deleted")
    assert warning["level"] == "warning" and warning["path"] == f"/ckpt/{first}"
    assert "max_actor_ckpt_to_keep" in warning["fix"] and "new path" in warning["fix"]


def test_a_checkpoint_with_no_path_counts_as_said_with_one_warning() -> None:
    d = Driver(VERIFYING)
    d.deadline(3600)
    d.hello()
    by_hand(d, 1, path="")
    assert asked(d) == []
    (warning,) = logs(d.actions, "checkpoint_not_verified")
    assert "saving(step, path)" in warning["fix"]
    assert d.controller.uploads.durable is not None


def test_without_verification_nothing_changes() -> None:
    """No verification configured: the save's end counts at once, as before."""
    d = Driver(replace(NO_FINAL, policy=replace(NO_FINAL.policy, verify=False)))
    insured(d, 60)
    assert asked(d) == [] and d.controller.uploads.durable is not None


def test_the_plan_counts_the_verification_in_the_durable_end() -> None:
    """signal_at moves earlier by the verification's estimate: the longest measured x the safety
    factor; before one is measured nothing for the built-in check (milliseconds), and
    --verify-duration x --unmeasured-factor for a --verify command."""
    obs = Observations(100)
    obs.record_step(1, 1.0, 0.0)
    plain = plan_save(1000.0, obs, replace(POLICY, verify=False), "insurance")
    assert plan_save(1000.0, obs, POLICY, "insurance").nominal_at == plain.nominal_at
    command = replace(POLICY, verify_command=True, unmeasured_factor=6.0, verify_duration_s=5.0)
    guessed = plan_save(1000.0, obs, command, "insurance")
    without = plan_save(1000.0, obs, replace(command, verify=False), "insurance")
    assert without.nominal_at - guessed.nominal_at == pytest.approx(30.0)
    assert guessed.verify_estimate_s == 30.0 and "its verification 30s" in guessed.why
    obs.verify_ended(0.2)
    assert verify_estimate_s(obs, POLICY) == pytest.approx(0.2 * VERIFY_SAFETY_FACTOR)
    assert verify_estimate_s(obs, command) == pytest.approx(0.2 * VERIFY_SAFETY_FACTOR)
    assert verify_estimate_s(obs, replace(POLICY, verify=False)) == 0.0


def test_the_valid_checkpoints_failed_upload_is_retried_though_a_newer_one_was_invalid() -> None:
    """A newer checkpoint that failed its checks does not replace the valid one: its failed upload
    is tried again."""
    d, first = early(UPLOADING)
    d.feed(core.UploadStarted(UPLOADER))
    second = by_hand(d, first + 2)
    answer(d, ok=False)
    d.feed(core.UploadExited(UPLOADER, 1))
    (planned,) = logs(d.actions, "upload_retry_planned")
    assert planned["step"] == first and second > first


def test_a_sigterm_save_whose_verification_outlasts_the_grace_stops_and_waits_for_it() -> None:
    """Acknowledged, not yet verified when --stop-grace is over: the stop begins (no save_missed),
    and the exit waits for the verification."""
    d = sigtermed()
    d.steps(4, 1, 1.0)
    d.save(4, 0.5)
    d.advance(VERIFYING.stop_grace_s)
    assert any(isinstance(a, core.StopChild) for a in d.actions) and not logs(d.actions, "save_missed")
    child_stopped(d)
    assert d.controller.mode is Mode.VERIFYING
    answer(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_a_child_that_exits_75_itself_keeps_its_code() -> None:
    """The child's own exit code is esiwrap's, verification or not: only esiwrap's own stop after a
    checkpoint is decided by what is valid."""
    d = Driver(VERIFYING)
    d.feed(core.ChildExited(CHILD, 75))
    d.feed(core.TreeChecked(0))
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_a_sigterm_save_stops_once_verified_though_training_went_on_meanwhile() -> None:
    """The trainer keeps stepping while its save is verified: the save asked for after the
    SIGTERM still counts, and the stop follows its verification."""
    d = sigtermed()
    d.steps(4, 1, 1.0)
    d.save(4, 0.5)
    d.steps(5, 2, 0.25)
    answer(d)
    assert any(isinstance(a, core.StopChild) for a in d.actions)
    child_stopped(d)
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED
