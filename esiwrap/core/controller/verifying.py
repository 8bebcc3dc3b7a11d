"""Verification: a checkpoint counts once it is checked.

After each completed save the part asks the shell to verify the checkpoint (`VerifyCheckpoint`:
the built-in check of its metadata, then the `--verify` command), hears how it ended
(`CheckpointVerified`) and keeps the newest valid checkpoint, the one that allows exit 75. An
invalid checkpoint never counts: the valid one before it stays the job's. A checkpoint brought back
by `--restore` is verified the same way before the command starts.

One verification runs at a time; a checkpoint that completes meanwhile waits (the newest: an older
waiting one is superseded, a newer checkpoint holds more). Every verification is bounded: while
training, it is given up after `verify_timeout_s` (a check stuck on a dead mount, a `--verify`
command that hangs); once the child's tree is gone, it must end by the cut-off, the upload's (3 s
before the deadline). One given up counts as not valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from esiwrap import events as ev
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import (
    INVALID_RESAVES,
    KILL_WAIT_S,
    SAVE_WRITE_GRACE_FACTOR,
    STOP_TIMEOUT_MARGIN_S,
    UPLOAD_EXIT_MARGIN_S,
    CheckpointVerified,
    ControllerConfig,
    ExtendStopTimeout,
    Now,
    StopVerify,
    VerifyCheckpoint,
)
from esiwrap.core.controller.timers import Timer
from esiwrap.core.policy import Observations, verify_estimate_s, verify_timeout_s
from esiwrap.core.values import Checkpoint, Deadline

Purpose = Literal["save", "restore"]

FIX_CUT_OFF = ("the check did not end in time: a checkpoint on storage that stopped answering, or a "
               "--verify command that takes longer than esiwrap waits (give it --verify-duration)")
FIX_VERIFY_COMMAND = ("your --verify command says this checkpoint is not valid: see its output above; a "
                      "save that did not finish, or a check that needs fixing")
FIX_PREVIOUS_GONE = ("keep the previous checkpoint until the next one is complete and verified: verl, "
                     "trainer.max_actor_ckpt_to_keep (and max_critic_ckpt_to_keep) of 2 or more, or unset "
                     "(keep all); your own trainer: write each checkpoint to a new path, then switch to it "
                     "and delete the old one (the trainer API page, \"a save that never leaves the job "
                     "without a valid checkpoint\")")
FIX_NO_PATH = ("report where the checkpoint is: esi.saving(step, path) (or save_finished(step, path)); "
               "or check it yourself with --verify CMD")


@dataclass
class Check:
    """One verification, from VerifyCheckpoint to CheckpointVerified."""

    checkpoint: Checkpoint
    purpose: Purpose
    boundary_at: float | None  # the step boundary the checkpoint holds (the work it saves)
    started_mono: float = 0.0
    until: float = 0.0  # monotonic: given up then


class Verdict(NamedTuple):
    """How a verification ended, for the controller to act on."""

    checkpoint: Checkpoint
    ok: bool
    purpose: Purpose
    boundary_at: float | None
    seconds: float
    fields: dict[str, Any]  # for checkpoint_verified / checkpoint_invalid / restored


class Verifications:
    def __init__(self, out: Outbox, obs: Observations, config: ControllerConfig) -> None:
        self._out = out
        self._obs = obs
        self._config = config
        self.running: Check | None = None
        self.waiting: Check | None = None  # completed while another was checked: next
        self.valid: Checkpoint | None = None  # the newest checkpoint of this run that counts
        self.valid_boundary: float | None = None  # ...the boundary it holds
        self.valid_gone = False  # ...and it was deleted since (without --upload it no longer counts)
        self.last_invalid: tuple[Checkpoint, str] | None = None  # the newest invalid one, and why
        self.invalid_streak = 0  # invalid checkpoints in a row
        self.verified_total = self.invalid_total = 0
        self.at_stop = False
        self.exit_reason = ""  # the stop's reason, while the exit waits for a verification
        self._window_end: float | None = None  # monotonic, at a stop without a deadline
        self._warned_no_path = self._warned_previous_gone = False

    # ------------------------------------------------------------------ asking
    def ask(self, checkpoint: Checkpoint, purpose: Purpose, boundary_at: float | None, now: Now,
            deadline: Deadline | None) -> None:
        """Verify this checkpoint now, or after the one being verified."""
        check = Check(checkpoint, purpose, boundary_at)
        if self.running is not None and checkpoint.path and self.running.checkpoint.path == checkpoint.path:
            # the trainer wrote the newer checkpoint over the one being checked (one file, saved in
            # place): that one is gone, not invalid; check what is there now
            self._out.act(StopVerify("SIGKILL"))
            self.running = self.waiting = None
        if self.running is None:
            self._start(check, now, deadline)
        else:
            self.waiting = check  # a newer checkpoint: the one that waited is superseded

    def unverifiable(self, checkpoint: Checkpoint) -> bool:
        """No path to check and no --verify command: it counts as the trainer said (said once)."""
        if checkpoint.path or self._config.policy.verify_command:
            return False
        if not self._warned_no_path:
            self._warned_no_path = True
            self._out.log("warning", ev.CHECKPOINT_NOT_VERIFIED, step=checkpoint.step, fix=FIX_NO_PATH)
        return True

    def _start(self, check: Check, now: Now, deadline: Deadline | None) -> None:
        check.started_mono = now.mono
        check.until = now.mono + verify_timeout_s(self._obs, self._config.policy)
        if self.at_stop:
            check.until = min(check.until, self._cutoff(now, deadline))
        self.running = check
        previous = self.valid.path if self.valid is not None and check.purpose == "save" else ""
        self._out.act(VerifyCheckpoint(check.checkpoint.step, check.checkpoint.path,
                                       previous if previous != check.checkpoint.path else ""))

    # ------------------------------------------------------------------ answers
    def ended(self, verified: CheckpointVerified, now: Now, deadline: Deadline | None) -> Verdict | None:
        """The running verification ended (None: not the one running, e.g. one given up)."""
        check = self.running
        if check is None or verified.step != check.checkpoint.step or verified.path != check.checkpoint.path:
            return None
        self.running = None
        seconds = max(0.0, now.mono - check.started_mono)
        self._obs.verify_ended(seconds)
        if verified.previous_gone:
            self._previous_gone(check.checkpoint)
        fields: dict[str, Any] = {
            "step": check.checkpoint.step, "path": check.checkpoint.path, "format": verified.format or None,
            "checked": verified.checked, "seconds": rounded(seconds), "bytes": verified.bytes,
            "files": verified.files, "read_bytes": verified.read_bytes, "by": verified.by,
        }
        if not verified.ok:
            fields.update(problem=verified.problem, fix=verified.fix or FIX_VERIFY_COMMAND)
        self._next(now, deadline)
        return Verdict(check.checkpoint, verified.ok, check.purpose, check.boundary_at, seconds, fields)

    def cut_off(self, now: Now, deadline: Deadline | None) -> Verdict | None:
        """The running verification took too long: give it up (SIGKILL to a --verify command); its
        checkpoint is not valid."""
        check = self.running
        if check is None:
            return None
        self.running = None
        self._out.act(StopVerify("SIGKILL"))
        seconds = max(0.0, now.mono - check.started_mono)
        near = self.at_stop and deadline is not None
        why = ("the deadline was too close to wait any longer" if near
               else f"it took longer than esiwrap waits ({seconds:.0f} s)")
        fields: dict[str, Any] = {
            "step": check.checkpoint.step, "path": check.checkpoint.path, "format": None, "checked": "",
            "seconds": rounded(seconds), "bytes": 0, "files": 0, "read_bytes": 0, "by": "cut-off",
            "problem": f"not verified: {why}", "fix": FIX_CUT_OFF,
        }
        self._next(now, deadline)
        return Verdict(check.checkpoint, False, check.purpose, check.boundary_at, seconds, fields)

    def _next(self, now: Now, deadline: Deadline | None) -> None:
        waiting, self.waiting = self.waiting, None
        if waiting is not None and not (self.at_stop and self._cutoff(now, deadline) <= now.mono):
            self._start(waiting, now, deadline)

    def _previous_gone(self, new: Checkpoint) -> None:
        """The newest valid checkpoint was deleted before this one was verified: without --upload
        the job has no valid checkpoint on this instance until this one counts."""
        valid = self.valid
        if valid is None:
            return
        self.valid_gone = True
        if self._warned_previous_gone:
            return
        self._warned_previous_gone = True
        self._out.log("warning", ev.PREVIOUS_CHECKPOINT_DELETED, path=valid.path, step=valid.step,
                      new_step=new.step, new_path=new.path, fix=FIX_PREVIOUS_GONE)

    # ------------------------------------------------------------------ what counts
    def note_start(self, boundary_at: float | None) -> None:
        """Training began holding the work up to `boundary_at` (what an invalid first checkpoint
        leaves at risk)."""
        if self.valid is None and self.valid_boundary is None:
            self.valid_boundary = boundary_at

    def counted(self, checkpoint: Checkpoint, boundary_at: float | None) -> None:
        """This checkpoint counts (verified, or nothing to verify): the newest valid one."""
        if self.valid is None or checkpoint.step >= self.valid.step:
            self.valid, self.valid_boundary, self.valid_gone = checkpoint, boundary_at, False
        self.invalid_streak = 0
        self.verified_total += 1

    def found_invalid(self, checkpoint: Checkpoint, problem: str) -> None:
        self.last_invalid = (checkpoint, problem)
        self.invalid_streak += 1
        self.invalid_total += 1

    def may_save_again(self) -> bool:
        """An invalid checkpoint asks for a save at once, INVALID_RESAVES times in a row at most: a
        trainer whose every save is broken is not asked again and again."""
        return self.invalid_streak <= INVALID_RESAVES

    def durable(self, uploads: bool) -> Checkpoint | None:
        """The newest valid checkpoint, if it still counts (deleted since, without an upload, not)."""
        if self.valid is None or (self.valid_gone and not uploads):
            return None
        return self.valid

    def outstanding(self) -> bool:
        return self.running is not None or self.waiting is not None

    def pending(self, checkpoint: Checkpoint | None) -> bool:
        """This checkpoint is being verified, or waits to be."""
        return checkpoint is not None and any(
            c is not None and c.checkpoint == checkpoint for c in (self.running, self.waiting))

    # ------------------------------------------------------------------ at the stop
    def await_at_stop(self, reason: str, now: Now, deadline: Deadline | None) -> None:
        """The child's tree is gone and a checkpoint is still being verified: wait for it up to the
        cut-off (without a deadline: --stop-grace or three estimates, whichever is longer)."""
        self.at_stop = True
        self.exit_reason = reason
        estimate = verify_estimate_s(self._obs, self._config.policy)
        wait = max(self._config.stop_grace_s, SAVE_WRITE_GRACE_FACTOR * estimate)
        self._window_end = None if deadline is not None else now.mono + wait
        if self.running is not None:
            self.running.until = max(now.mono, min(self.running.until, self._cutoff(now, deadline)))
        self._out.act(ExtendStopTimeout(max(0.0, self._cutoff(now, deadline) - now.mono) + KILL_WAIT_S
                                        + STOP_TIMEOUT_MARGIN_S))

    def _cutoff(self, now: Now, deadline: Deadline | None) -> float:
        """Monotonic: when a verification still running at a stop is given up. An upload gets its
        SIGTERM's grace before this; a verification needs none (the built-in check is abandoned,
        a --verify command gets SIGKILL): it may run until esiwrap must be gone, 1 s before the
        deadline, or --final-margin before it where that is less (the final save was planned to
        be verified by then)."""
        if deadline is not None:  # (a --final-margin below it is the user's word for how close)
            margin = min(UPLOAD_EXIT_MARGIN_S, self._config.policy.final_margin_s)
            return now.mono + deadline.at - margin - now.wall
        return self._window_end if self._window_end is not None else now.mono

    def timers(self, exited: bool) -> list[Timer]:
        if self.running is None or exited:
            return []
        return [Timer("verify cut-off", "mono", self.running.until)]

    def abandon(self) -> None:
        """Stop waiting for the running verification and for any other (the run is leaving)."""
        if self.running is not None:
            self._out.act(StopVerify("SIGKILL"))
        self.running = self.waiting = None
