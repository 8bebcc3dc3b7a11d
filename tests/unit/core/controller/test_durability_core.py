"""The pure parts of issue 19: uploads in the decision core and the plan, the resume check, the
state file's new fields, and the filesystem classification (fake clock, no processes)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from controller_driver import CHILD, Driver, exits, logs, stop_when_due

from esiwrap.core import controller as core
from esiwrap.core import state
from esiwrap.core.controller import Checkpoint, Controller, ControllerConfig, Mode
from esiwrap.core.policy import (
    UPLOAD_SAFETY_FACTOR,
    Observations,
    PolicyConfig,
    plan_save,
    upload_estimate_s,
)
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_NOT_UPLOADED
from esiwrap.shell.durability import classify, find_mount, parse_mountinfo

UPLOADS = ControllerConfig(
    policy=PolicyConfig(redundant_s=4.0, save_duration_s=1.0, final_margin_s=2.0, unmeasured_factor=1.0,
                        interruption_rate_per_day=0.0, uploads=True, upload_duration_s=5.0),
    stop_grace_s=3.0)
UPLOADER = 5151


def started_upload(d: Driver, pid: int = UPLOADER) -> core.StartUpload:
    (start,) = [a for a in d.actions if isinstance(a, core.StartUpload)][-1:]
    d.feed(core.UploadStarted(pid))
    return start


def insured(d: Driver, deadline_s: float) -> None:
    """Steps of 1 s up to the planned insurance save, which takes 0.5 s (path /ckpt/STEP)."""
    d.deadline(deadline_s)
    d.hello()
    step = 0
    while not logs(d.actions, "save_requested"):
        step += 1
        d.steps(step, 1, 1.0)
    d.steps(step + 1, 1, 1.0)
    d.save(step + 1, 0.5, path=f"/ckpt/{step + 1}")


def test_a_completed_save_starts_its_upload_and_exit_75_waits_for_it() -> None:
    """After the save its upload starts; training goes on while it runs; once the child is
    stopped esiwrap still waits for the upload, and exits 75 when it completed."""
    d = Driver(replace(UPLOADS, policy=replace(UPLOADS.policy, final_save=False)))
    insured(d, 60)
    start = started_upload(d)
    assert start.path == f"/ckpt/{start.step}" and start.attempt == 1
    stop_when_due(d)
    assert d.controller.mode is Mode.UPLOADING and not exits(d.actions)
    d.advance(1.0)
    d.feed(core.UploadExited(UPLOADER, 0))
    (done,) = logs(d.actions, "upload_completed")
    assert done["step"] == start.step
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_an_upload_that_does_not_end_is_cut_off_before_the_deadline_and_exits_74() -> None:
    """SIGTERM to the upload's group, SIGKILL after the grace, exit 74 naming the checkpoint, all
    before the deadline."""
    d = Driver(replace(UPLOADS, policy=replace(UPLOADS.policy, final_save=False)))
    insured(d, 40)
    start = started_upload(d)
    stop_when_due(d)
    while "SIGKILL" not in [a.signal for a in d.actions if isinstance(a, core.StopUpload)]:
        d.advance(0.25)
    stops = [a.signal for a in d.actions if isinstance(a, core.StopUpload)]
    assert stops == ["SIGTERM", "SIGKILL"]
    assert d.wall <= d.controller.deadline.at - 1  # type: ignore[union-attr]
    d.feed(core.UploadExited(UPLOADER, None, "SIGKILL", ("partial",)))
    (failed,) = logs(d.actions, "upload_failed")
    assert failed["reason"].startswith("cut off") and failed["stderr"] == ["partial"]
    (exit_,) = exits(d.actions)
    assert exit_.code == EXIT_NOT_UPLOADED and "upload did not finish" in exit_.reason
    assert f"step {start.step}" in exit_.reason


def test_an_upload_that_survives_sigkill_is_not_waited_for_past_the_deadline() -> None:
    d = Driver(replace(UPLOADS, policy=replace(UPLOADS.policy, final_save=False)))
    insured(d, 40)
    started_upload(d)
    stop_when_due(d)
    d.advance(40)
    assert exits(d.actions)[0].code == EXIT_NOT_UPLOADED
    assert d.wall < d.controller.deadline.at  # type: ignore[union-attr]


def test_a_newer_save_waits_for_the_running_upload_and_older_waiting_ones_are_skipped() -> None:
    """One upload at a time: the running one finishes; of the checkpoints completed meanwhile only
    the newest is uploaded next."""
    d = Driver(UPLOADS)
    d.hello()
    d.feed(core.SaveBegin(CHILD, 10))
    d.feed(core.SaveEnd(CHILD, 10, duration_s=0.1, path="/c/10"))
    started_upload(d)
    for step in (20, 30):
        d.feed(core.SaveBegin(CHILD, step))
        d.feed(core.SaveEnd(CHILD, step, duration_s=0.1, path=f"/c/{step}"))
    (skipped,) = logs(d.actions, "upload_skipped")
    assert skipped["step"] == 20 and skipped["superseded_by"] == 30
    assert len([a for a in d.actions if isinstance(a, core.StartUpload)]) == 1
    d.advance(2)
    d.feed(core.UploadExited(UPLOADER, 0))
    start = started_upload(d, UPLOADER + 1)
    assert start.step == 30


def test_a_child_that_exits_75_on_its_own_without_a_reported_save_exits_74_and_says_why() -> None:
    """With --upload, 75 promises an uploaded checkpoint. A child's own 75, after no save that
    esiwrap saw, cannot keep it: 74, and the reason says no checkpoint was reported (not that
    one's upload failed)."""
    d = Driver(UPLOADS)
    d.deadline(600)
    d.hello()
    d.steps(1, 3, 1.0)
    d.feed(core.ChildExited(CHILD, EXIT_CHECKPOINTED))
    d.feed(core.TreeChecked(0))
    (exit_,) = exits(d.actions)
    assert exit_.code == EXIT_NOT_UPLOADED
    assert "no checkpoint of this run was reported to esiwrap" in exit_.reason
    assert "upload did not finish" not in exit_.reason
    assert not [a for a in d.actions if isinstance(a, core.StartUpload)]


def test_a_failed_upload_of_the_newest_checkpoint_is_tried_again() -> None:
    """A failure is retried (5 s, then 30 s later), and training is never stopped for it."""
    d = Driver(UPLOADS)
    d.hello()
    d.feed(core.SaveBegin(CHILD, 10))
    d.feed(core.SaveEnd(CHILD, 10, duration_s=0.1, path="/c/10"))
    started_upload(d)
    d.feed(core.UploadExited(UPLOADER, 1, stderr=("NoSuchBucket",)))
    assert logs(d.actions, "upload_failed")[0]["code"] == 1
    d.advance(5.0)
    start = started_upload(d, UPLOADER + 1)
    assert start.attempt == 2 and start.step == 10
    assert not any(isinstance(a, core.StopChild) for a in d.actions)


def test_the_plan_makes_room_for_the_upload() -> None:
    """The insurance save's moment moves earlier by the upload estimate; measured uploads replace
    --upload-duration x --unmeasured-factor."""
    plain = PolicyConfig(unmeasured_factor=2.0)
    uploads = replace(plain, uploads=True, upload_duration_s=30.0)
    obs = Observations(10)
    obs.intervals.append(1.0)
    without = plan_save(1000.0, obs, plain, "insurance")
    with_upload = plan_save(1000.0, obs, uploads, "insurance")
    assert without.signal_at - with_upload.signal_at == pytest.approx(60.0)
    assert "upload" in with_upload.why
    obs.upload_ended(40.0)
    assert upload_estimate_s(obs, uploads) == pytest.approx(40.0 * UPLOAD_SAFETY_FACTOR)
    assert upload_estimate_s(obs, plain) == 0.0


@pytest.mark.parametrize(("start", "event", "redone"), [(40, "resumed", 0), (45, "resumed", 0),
                                                         (0, "resume_missed", 40), (25, "resume_missed", 15)])
def test_the_first_step_says_where_training_started(start: int, event: str, redone: int) -> None:
    """Against the checkpoint the state file names: resumed from it (or later), or missed."""
    c = Controller(ControllerConfig(), resume_from=Checkpoint(40, 1.8e9, "/ckpt/latest.pt"))
    c.handle(core.ChildStarted(CHILD), core.Now(1.8e9, 0))
    c.handle(core.Hello(CHILD), core.Now(1.8e9, 0))
    out = c.handle(core.Step(CHILD, start + 1, 1.0), core.Now(1.8e9 + 1, 1))
    (found,) = logs(out, event)
    assert (found["checkpoint_step"], found["start_step"], found["steps_redone"]) == (40, start, redone)
    if event == "resume_missed":
        assert any("/ckpt/latest.pt" in cause for cause in found["causes"])


def test_verl_start_message_names_resume_mode_in_the_causes() -> None:
    c = Controller(ControllerConfig(), resume_from=Checkpoint(8, 1.8e9, "/ckpt/global_step_8"))
    c.handle(core.Hello(CHILD), core.Now(1.8e9, 0))
    out = c.handle(core.TrainingStart(CHILD, 0, {"integration": "verl", "resume_mode": "disable",
                                                  "default_local_dir": "/ckpt"}), core.Now(1.8e9, 0))
    (missed,) = logs(out, "resume_missed")
    assert "trainer.resume_mode=disable" in missed["causes"][0]
    assert "trainer.default_local_dir (/ckpt)" in missed["causes"][1]


def test_state_file_keeps_uploads_and_the_durable_checkpoint() -> None:
    after = state.JobState().after_run([1.0], [2.0], [], 1.8e9, ["python"], uploads=[30.0],
                                       checkpoint=Checkpoint(7, 1.8e9 - 5, "/c"), uploaded=True)
    back = state.parse(state.render(after), 1.8e9 + 10)
    assert back.uploads == (30.0,) and back.checkpoint == Checkpoint(7, 1.8e9 - 5, "/c")
    assert back.checkpoint_durable == "upload" and back.prior().uploads == (30.0,)
    old = state.parse('{"format":"esiwrap-state/1","updated_at":1800000000,"steps":[],"saves":[]}', 1.8e9)
    assert old.checkpoint is None and old.uploads == ()


MOUNTINFO = r"""27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:50 / /mnt/nfs rw - nfs4 10.0.0.9:/export rw
41 27 0:51 / /mnt/s3 rw - fuse.rclone s3:bucket rw
42 27 0:52 / /lustre rw - lustre 10.0.0.1@tcp:/fs rw
43 27 0:53 / /dev/shm rw - tmpfs tmpfs rw
44 27 8:17 / /data\040disk rw - xfs /dev/nvme0n1p1 rw
45 27 8:17 /sub /bound rw - xfs /dev/nvme0n1p1 rw
46 27 0:54 / /var/lib/docker/overlay rw - overlay overlay rw
"""


@pytest.mark.parametrize(("path", "device", "kind", "fstype"), [
    ("/home/me/ckpt", "254:0", "local", "ext4"), ("/mnt/nfs/job", "0:50", "network", "nfs4"),
    ("/mnt/s3/ckpt", "0:51", "fuse", "fuse.rclone"), ("/lustre/x", "0:52", "cluster", "lustre"),
    ("/dev/shm/c", "0:53", "memory", "tmpfs"), ("/data disk/c", "8:17", "local", "xfs"),
    ("/bound/c", "8:17", "local", "xfs"), ("/var/lib/docker/overlay/x", "0:54", "local", "overlay"),
])
def test_filesystem_classification(path: str, device: str, kind: str, fstype: str) -> None:
    mount = find_mount(parse_mountinfo(MOUNTINFO), path, device)
    assert mount is not None and mount.fstype == fstype
    assert classify(mount.fstype, mount.source) == kind


def test_unknown_filesystems_are_not_called_local() -> None:
    assert classify("fuseblk", "/dev/sdb1") == "local" and classify("virtiofs", "tag") == "unknown"
    assert classify("weird", "/dev/sdc") == "local" and classify("fuse.sshfs") == "network"


# ---------------------------------------------------------------------------------- retries (issue 24)
def failed_upload(d: Driver, pid: int, code: int = 1) -> None:
    d.feed(core.UploadExited(pid, code, stderr=("SlowDown: reduce your request rate",)))


def attempts(d: Driver) -> list[int]:
    return [a.attempt for a in d.actions if isinstance(a, core.StartUpload)]


def roomy() -> Driver:
    """Uploads with a minute of room after the insurance save (--redundant-time 60), no final save."""
    return Driver(replace(UPLOADS, policy=replace(UPLOADS.policy, final_save=False, redundant_s=60.0)))


def stop_after_a_failed_upload(d: Driver) -> None:
    """The insurance checkpoint's first upload fails while the trainer runs: no further save is
    planned, so the child is stopped; its tree is then gone."""
    started_upload(d)
    failed_upload(d, UPLOADER)
    assert any(isinstance(a, core.StopChild) for a in d.actions)
    d.feed(core.ChildExited(CHILD, None, "SIGTERM", 15))
    d.feed(core.TreeChecked(0))
    assert d.controller.mode is Mode.UPLOADING and not exits(d.actions)


def test_an_upload_that_fails_twice_at_the_stop_then_works_exits_75() -> None:
    """A throttled bucket: the first attempt fails while the trainer runs, two more fail once the
    child has stopped (after 5 s, then 30 s of backoff), the fourth completes: exit 75 before the
    deadline, and each retry's plan is logged."""
    d = roomy()
    insured(d, 180)
    stop_after_a_failed_upload(d)
    for n, wait in ((2, 5.0), (3, 30.0)):
        d.advance(wait)
        started_upload(d, UPLOADER + n)
        failed_upload(d, UPLOADER + n)
        assert not exits(d.actions)
    d.advance(logs(d.actions, "upload_retry_planned")[-1]["in_s"])
    started_upload(d, UPLOADER + 4)
    d.advance(1.0)
    d.feed(core.UploadExited(UPLOADER + 4, 0))
    assert attempts(d) == [1, 2, 3, 4]
    planned = logs(d.actions, "upload_retry_planned")
    # planned while the trainer ran, again at the stop (now against the cut-off), then after each failure
    assert [(p["attempt"], p["in_s"], p["reason"]) for p in planned[:3]] == [
        (2, 5.0, "backoff"), (2, 5.0, "backoff"), (3, 30.0, "backoff")]
    assert "cutoff_in_s" not in planned[0] and all("cutoff_in_s" in p for p in planned[1:])
    assert planned[3]["attempt"] == 4 and planned[3]["reason"].startswith("the latest start")
    assert all(p["expected_s"] == 5.0 for p in planned)  # --upload-duration: no upload completed yet
    (exit_,) = exits(d.actions)
    assert exit_.code == EXIT_CHECKPOINTED
    assert d.wall < d.controller.deadline.at - 3  # type: ignore[union-attr]


def test_a_retry_at_the_stop_starts_no_later_than_an_attempt_can_still_end_before_the_cut_off() -> None:
    """The backoff (30 s after the second attempt) is longer than the time left: the third attempt
    starts at the cut-off (3 s before the deadline) minus the expected upload (--upload-duration,
    5 s), not after it; it completes and esiwrap exits 75."""
    d = Driver(replace(UPLOADS, policy=replace(UPLOADS.policy, final_save=False, redundant_s=20.0)))
    insured(d, 100)
    stop_after_a_failed_upload(d)
    deadline = d.controller.deadline.at  # type: ignore[union-attr]
    d.advance(5.0)
    started_upload(d, UPLOADER + 2)
    failed_upload(d, UPLOADER + 2)
    capped = logs(d.actions, "upload_retry_planned")[-1]
    assert capped["attempt"] == 3 and capped["reason"].startswith("the latest start")
    assert capped["in_s"] < 30.0 and capped["expected_s"] == 5.0
    d.advance(capped["in_s"])
    assert started_upload(d, UPLOADER + 3).attempt == 3
    assert d.wall == pytest.approx(deadline - 3.0 - 5.0)
    d.advance(4.0)
    d.feed(core.UploadExited(UPLOADER + 3, 0))
    assert exits(d.actions)[0].code == EXIT_CHECKPOINTED


def test_when_no_attempt_fits_before_the_cut_off_esiwrap_gives_up_and_exits_74() -> None:
    """Ten seconds from the stop to the deadline and a 5 s upload expected: one retry fits, at the
    latest start; once it fails none does (`upload_given_up`), exit 74 with time left."""
    d = Driver(replace(UPLOADS, policy=replace(UPLOADS.policy, final_save=False)))
    insured(d, 60)
    stop_after_a_failed_upload(d)
    planned = logs(d.actions, "upload_retry_planned")[-1]  # at the stop
    assert planned["attempt"] == 2 and planned["in_s"] <= 5.0
    d.advance(planned["in_s"])
    started_upload(d, UPLOADER + 1)
    d.advance(1.0)  # the attempt takes a second to fail: the next one would end past the cut-off
    failed_upload(d, UPLOADER + 1)
    (given_up,) = logs(d.actions, "upload_given_up")
    assert given_up["attempts"] == 2 and given_up["expected_s"] == 5.0
    (exit_,) = exits(d.actions)
    assert exit_.code == EXIT_NOT_UPLOADED and "upload did not finish" in exit_.reason
    assert d.wall < d.controller.deadline.at - 3  # type: ignore[union-attr]


def test_a_failed_upload_is_retried_past_three_attempts_until_a_newer_checkpoint_replaces_it() -> None:
    """While the trainer runs: 5 s, 30 s, then 60 s, 120 s ... for as long as no newer checkpoint
    exists; a newer one takes the retry's place."""
    d = Driver(UPLOADS)
    d.hello()
    d.feed(core.SaveBegin(CHILD, 10))
    d.feed(core.SaveEnd(CHILD, 10, duration_s=0.1, path="/c/10"))
    started_upload(d)
    for n, wait in enumerate((5.0, 30.0, 60.0, 120.0), start=1):
        failed_upload(d, UPLOADER + n - 1)
        assert logs(d.actions, "upload_retry_planned")[-1]["in_s"] == wait
        d.advance(wait)
        assert started_upload(d, UPLOADER + n).attempt == n + 1
    failed_upload(d, UPLOADER + 4)
    d.advance(10.0)
    d.feed(core.SaveBegin(CHILD, 20))
    d.feed(core.SaveEnd(CHILD, 20, duration_s=0.1, path="/c/20"))
    newer = started_upload(d, UPLOADER + 5)
    assert (newer.step, newer.attempt) == (20, 1)
    d.advance(300.0)
    assert [a.step for a in d.actions if isinstance(a, core.StartUpload)][-1] == 20  # no old retry


def test_a_second_ctrl_c_ends_the_wait_for_a_retry_at_once() -> None:
    d = roomy()
    insured(d, 120)
    stop_after_a_failed_upload(d)
    d.feed(core.SignalReceived("SIGINT"))
    d.feed(core.SignalReceived("SIGINT"))
    assert exits(d.actions)[0].code == EXIT_NOT_UPLOADED
