"""Uploads and durability: which checkpoint outlives the instance.

With `--upload`, after each completed save the part asks the shell to start one upload
(`StartUpload`), hears when it started and how it ended (`UploadStarted`, `UploadExited`), and a
checkpoint is durable once its upload completed. Uploads run one at a time beside everything else:
an upload that is running when a newer save completes is left to finish (cutting it off would
waste what it sent, and frequent saves would starve every upload); the newest checkpoint waiting
is uploaded next, older waiting ones are skipped. A failed upload of the newest checkpoint is
tried again while no newer one replaces it. Once the child's tree is gone (`at_stop`), each attempt
and each retry must end by the cut-off, the moment esiwrap must stop waiting to exit before the
deadline. Without `--upload` a completed checkpoint is as durable as its filesystem: the part asks
once what holds it, and warns when that is a local disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from esiwrap import events as ev
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import (
    KILL_WAIT_S,
    SAVE_WRITE_GRACE_FACTOR,
    STOP_TIMEOUT_MARGIN_S,
    UPLOAD_EXIT_MARGIN_S,
    UPLOAD_RETRY_MAX_S,
    UPLOAD_RETRY_S,
    UPLOAD_TERM_GRACE_S,
    CheckFilesystem,
    ControllerConfig,
    ExtendStopTimeout,
    FilesystemChecked,
    Now,
    StartUpload,
    StopUpload,
    UploadExited,
    UploadStarted,
)
from esiwrap.core.controller.timers import Timer
from esiwrap.core.policy import Observations, upload_attempt_s, upload_estimate_s
from esiwrap.core.values import Checkpoint, Deadline


@dataclass
class UploadRun:
    """The upload of one checkpoint, from StartUpload to UploadExited."""

    checkpoint: Checkpoint
    attempt: int
    started_wall: float
    started_mono: float
    pid: int | None = None
    cut_off: str = ""  # why esiwrap stopped it, once it did


class Retry(NamedTuple):
    checkpoint: Checkpoint
    attempt: int
    at: float  # monotonic


class UploadEnd(NamedTuple):
    completed: bool
    cut_off: bool  # esiwrap cut it off


class Uploads:
    def __init__(self, out: Outbox, obs: Observations, config: ControllerConfig) -> None:
        self._out = out
        self._obs = obs
        self._config = config
        # The newest checkpoint that outlives the instance, as far as esiwrap knows: with --upload,
        # the last one uploaded; without, the last one completed (its filesystem is the user's call).
        self.durable: Checkpoint | None = None
        self.run: UploadRun | None = None
        self.waiting: Checkpoint | None = None  # completed while another upload ran
        self.retry: Retry | None = None
        self.completed_total = self.failed_total = 0
        self.at_stop = False  # the child's tree is gone: the last upload is what esiwrap waits for
        self._until: float | None = None  # monotonic, at the stop: the cut-off, then the kill
        self._exit_reason = ""
        self._killed = False
        self._window_end: float | None = None  # monotonic, at a stop without a deadline
        self._filesystem_asked = False

    # ------------------------------------------------------------------ while training
    def checkpoint_completed(self, checkpoint: Checkpoint, now: Now, deadline: Deadline | None) -> None:
        """A checkpoint is complete on the trainer's storage: upload it, or look at what holds it."""
        if not self._config.uploads:
            self.durable = checkpoint
            if checkpoint.path and not self._filesystem_asked and not self._config.local_checkpoints_survive:
                self._filesystem_asked = True  # the first save with a path: is it on a local disk?
                self._out.act(CheckFilesystem(checkpoint.path))
            return
        self.retry = None  # a newer checkpoint replaces the one that failed
        if self.run is None:
            self._start(checkpoint, 1, now, deadline)
            return
        older = self.waiting
        if older is not None:
            self._out.log("info", ev.UPLOAD_SKIPPED, step=older.step, path=older.path,
                          superseded_by=checkpoint.step,
                          reason="a newer checkpoint completed while an upload was running")
        self.waiting = checkpoint

    def filesystem_checked(self, checked: FilesystemChecked) -> None:
        if checked.kind != "local" or self._config.uploads:
            return  # only a local disk is known to go with the instance
        self._out.log("warning", ev.CHECKPOINT_NOT_DURABLE, path=checked.path, filesystem=checked.fstype,
                      mount_point=checked.mount_point, device=checked.source,
                      fix="the checkpoint is on this machine's local disk and goes with the instance: "
                      "write checkpoints to storage that outlives it (a network or cluster filesystem), or "
                      "copy each one with --upload CMD (e.g. --upload 'aws s3 cp --recursive {path} "
                      "s3://BUCKET/job/{step}/'); if this disk survives, --local-checkpoints-survive")

    def _start(self, checkpoint: Checkpoint, attempt: int, now: Now, deadline: Deadline | None) -> None:
        self.run = UploadRun(checkpoint, attempt, now.wall, now.mono)
        self._obs.upload_began(now.wall)
        self._out.act(StartUpload(checkpoint.step, checkpoint.path, attempt))
        if self.at_stop:  # the child is gone: this attempt ends by the cut-off
            self._until = self._attempt_until(self.run, now, deadline)

    def started(self, started: UploadStarted, now: Now, remaining_s: float | None) -> None:
        run = self.run
        if run is None:
            return
        run.pid = started.pid
        self._out.log("info", ev.UPLOAD_STARTED, step=run.checkpoint.step, path=run.checkpoint.path,
                      pid=started.pid, attempt=run.attempt,
                      upload_estimate_s=rounded(upload_estimate_s(self._obs, self._config.policy)),
                      remaining_s=remaining_s)

    def exited(self, exited: UploadExited, now: Now, deadline: Deadline | None,
               newest: Checkpoint | None) -> UploadEnd | None:
        """The running upload ended (None: not the one running). A failure of the newest checkpoint's
        upload plans its retry."""
        run = self.run
        if run is None or (run.pid is not None and exited.pid != run.pid):
            return None
        self.run = None
        self._until, self._killed = None, False  # its cut-off went with it
        duration = max(0.0, now.mono - run.started_mono)
        checkpoint = run.checkpoint
        remaining = _remaining(deadline, now)
        if exited.code == 0 and not exited.error:
            self._obs.upload_ended(duration)
            self.completed_total += 1
            if self.durable is None or checkpoint.step >= self.durable.step:
                self.durable = checkpoint
            self._out.log("info", ev.UPLOAD_COMPLETED, step=checkpoint.step, path=checkpoint.path,
                          duration_s=rounded(duration), attempt=run.attempt, remaining_s=remaining)
            return UploadEnd(completed=True, cut_off=bool(run.cut_off))
        self._obs.upload_ended(None)
        self.failed_total += 1
        fields: dict[str, Any] = {"code": exited.code, "signal": exited.signal}
        if exited.error:
            fields["error"] = exited.error
        if run.cut_off:
            fields["reason"] = run.cut_off
        self._out.log("error", ev.UPLOAD_FAILED, step=checkpoint.step, path=checkpoint.path,
                      duration_s=rounded(duration), attempt=run.attempt, stderr=list(exited.stderr),
                      remaining_s=remaining, **fields)
        if self.waiting is None and checkpoint == newest and not run.cut_off and not exited.error:
            self._plan_retry(checkpoint, run.attempt + 1, now.mono + upload_retry_wait_s(run.attempt), now,
                             deadline)
        return UploadEnd(completed=False, cut_off=bool(run.cut_off))

    def start_waiting(self, now: Now, deadline: Deadline | None, cut_off: bool) -> None:
        """The upload that ran has ended: the checkpoint that waited for it is next (not once one
        was cut off at the stop: there is no time for another)."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None and not (self.at_stop and cut_off):
            self._start(waiting, 1, now, deadline)

    def _plan_retry(self, checkpoint: Checkpoint, attempt: int, at: float, now: Now,
                    deadline: Deadline | None) -> None:
        """Try the checkpoint's upload again at monotonic `at`; at the stop, no later than an attempt
        of the expected length can still end before the cut-off, and not at all when none can (then
        esiwrap gives up on it)."""
        expected = upload_attempt_s(self._obs, self._config.policy)
        reason = "backoff"
        if self.at_stop:
            latest = self._cutoff(now, deadline) - expected
            if latest < now.mono:
                self.retry = None
                self._out.log("warning", ev.UPLOAD_GIVEN_UP, step=checkpoint.step, path=checkpoint.path,
                              attempts=attempt - 1, expected_s=rounded(expected),
                              cutoff_in_s=rounded(self._cutoff(now, deadline) - now.mono),
                              reason="no further attempt of the expected length ends before the cut-off")
                return
            if at > latest:
                at, reason = latest, "the latest start that still ends before the cut-off"
        self.retry = Retry(checkpoint, attempt, at)
        cutoff = {} if not self.at_stop else {"cutoff_in_s": rounded(self._cutoff(now, deadline) - now.mono)}
        self._out.log("info", ev.UPLOAD_RETRY_PLANNED, step=checkpoint.step, path=checkpoint.path,
                      attempt=attempt, in_s=rounded(at - now.mono), reason=reason,
                      expected_s=rounded(expected), remaining_s=_remaining(deadline, now), **cutoff)

    def retry_now(self, now: Now, deadline: Deadline | None) -> None:
        retry, self.retry = self.retry, None
        if retry is not None and self.run is None:
            self._start(retry.checkpoint, retry.attempt, now, deadline)

    def outstanding(self) -> bool:
        return self.run is not None or self.waiting is not None or self.retry is not None

    def running(self) -> bool:
        return self.run is not None

    # ------------------------------------------------------------------ at the stop
    def await_at_stop(self, reason: str, now: Now, deadline: Deadline | None) -> bool:
        """The child's tree is gone, but the last checkpoint's upload is not done: wait for it, and
        for its retries, up to the cut-off (without a deadline: --stop-grace or three upload
        estimates, whichever is longer). True when there is nothing to wait for after all."""
        self.at_stop = True
        self._exit_reason = reason
        self._window_end = None if deadline is not None else now.mono + self._wait_s()
        self._until = None
        run, retry = self.run, self.retry
        if run is not None:
            self._until = self._attempt_until(run, now, deadline)
        elif retry is not None:  # its wait is cut short if it would start too late to end in time
            self._plan_retry(retry.checkpoint, retry.attempt, retry.at, now, deadline)
            if self.retry is None:
                return self.settle()
        self._out.act(ExtendStopTimeout(max(0.0, self._cutoff(now, deadline) - now.mono) + UPLOAD_TERM_GRACE_S
                                        + KILL_WAIT_S + STOP_TIMEOUT_MARGIN_S))
        return False

    @property
    def exit_reason(self) -> str:
        return self._exit_reason

    def settle(self) -> bool:
        """At the stop: True when no upload runs and none is planned (esiwrap may exit)."""
        if self.run is None and self.retry is None:
            self.waiting = None
            return True
        return False

    def _wait_s(self) -> float:
        """How long an upload is waited for at a stop without a deadline."""
        estimate = upload_estimate_s(self._obs, self._config.policy)
        return max(self._config.stop_grace_s, SAVE_WRITE_GRACE_FACTOR * estimate)

    def _cutoff(self, now: Now, deadline: Deadline | None) -> float:
        """Monotonic: when an upload still running at a stop must be cut off (SIGTERM), so that
        esiwrap exits before the deadline; without a deadline, the end of the wait."""
        if deadline is not None:
            return now.mono + deadline.at - UPLOAD_TERM_GRACE_S - UPLOAD_EXIT_MARGIN_S - now.wall
        return self._window_end if self._window_end is not None else now.mono

    def _attempt_until(self, run: UploadRun, now: Now, deadline: Deadline | None) -> float:
        """An attempt at a stop runs until the cut-off, and no longer than esiwrap waits for one."""
        return max(now.mono, min(run.started_mono + self._wait_s(), self._cutoff(now, deadline)))

    def cut_off_timer(self, now: Now, deadline: Deadline | None) -> bool:
        """At the stop: cut the upload off (SIGTERM, then SIGKILL), then stop waiting for it. True
        when esiwrap may exit."""
        run = self.run
        if run is None:
            return self.settle()
        if not run.cut_off:
            near = deadline is not None and \
                now.wall >= deadline.at - UPLOAD_TERM_GRACE_S - UPLOAD_EXIT_MARGIN_S - 0.5
            run.cut_off = ("cut off: the deadline was too close to wait any longer" if near
                           else "cut off: it took longer than esiwrap waits at a stop")
            self._out.act(StopUpload("SIGTERM"))
            self._until = now.mono + UPLOAD_TERM_GRACE_S
            self._killed = False
        elif not self._killed:
            self._killed = True
            self._out.act(StopUpload("SIGKILL"))
            wait = KILL_WAIT_S  # for the reap; never past the deadline
            if deadline is not None:
                wait = min(wait, max(0.0, deadline.at - now.wall - 0.25))
            self._until = now.mono + wait
        else:  # it survived SIGKILL: do not wait for it any longer
            self.run = None
            self.waiting = None
            return True
        return False

    def cut_off_now(self, reason: str, now: Now) -> bool:
        """A second SIGINT at the stop: kill the upload at once, plan no retry. True when esiwrap
        may exit (nothing ran)."""
        self.retry = None
        if self.run is None:
            return self.settle()
        self.run.cut_off = self.run.cut_off or f"cut off: {reason}"
        self._out.act(StopUpload("SIGKILL"))
        self._killed = True
        self._until = now.mono + KILL_WAIT_S
        return False

    def timers(self, exited: bool) -> list[Timer]:
        timers = [] if self.retry is None or exited else [Timer("upload retry", "mono", self.retry.at)]
        if self._until is not None:  # only ever set at the stop
            timers.append(Timer("upload cut-off", "mono", self._until))
        return timers

    def view(self) -> dict[str, Any]:
        return {"durable_step": self.durable.step if self.durable else None,
                "uploading_step": self.run.checkpoint.step if self.run else None,
                "uploads_completed": self.completed_total, "uploads_failed": self.failed_total}

    # ------------------------------------------------------------------ the exit
    def last_uploaded(self, last: Checkpoint | None) -> bool:
        durable = self.durable
        return last is not None and durable is not None and durable.step >= last.step

    def not_uploaded_reason(self, last: Checkpoint | None) -> str:
        durable = self.durable
        if last is None:  # a child that exited 75 on its own, after no save that esiwrap saw
            text = "no checkpoint of this run was reported to esiwrap, so none was uploaded"
        else:
            text = f"checkpoint of step {last.step} complete on local storage only: its upload did not finish"
        if durable is not None:
            text += f" (the last uploaded checkpoint holds step {durable.step})"
        elif last is not None:
            text += " (no checkpoint of this run was uploaded)"
        return text


def upload_retry_wait_s(failed_attempt: int) -> float:
    """The wait after the failed attempt `failed_attempt` (1, 2, ...): 5 s, 30 s, then doubling up
    to UPLOAD_RETRY_MAX_S."""
    if failed_attempt <= len(UPLOAD_RETRY_S):
        return UPLOAD_RETRY_S[failed_attempt - 1]
    return min(UPLOAD_RETRY_MAX_S, UPLOAD_RETRY_S[-1] * 2.0 ** (failed_attempt - len(UPLOAD_RETRY_S)))


def _remaining(deadline: Deadline | None, now: Now) -> float | None:
    return rounded(deadline.at - now.wall) if deadline is not None else None
