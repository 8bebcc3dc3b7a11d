"""The way back (`--restore`): before the command starts, the job's durable checkpoint is brought
back to this instance when it is not here.

    Launch ─► LookForCheckpoint ─► here: StartCommand
                                └► not here: StartRestore ─► exit 0: VerifyCheckpoint ─► valid: StartCommand
    no checkpoint known, `--restore-manifests`:
    Launch ─► FetchManifests ─► the newest complete manifest ─► LookForCheckpoint ─► ...

A failed attempt (the command failed, or what came back is not valid) is tried again after 5 s,
then 30 s: RESTORE_ATTEMPTS attempts in all, each started only where an attempt of the expected
length (the longest restore the job measured) still ends before the cut-off:

    the manifests   a few small files, fetched before the job's measurements are back: the
                    deadline, less `--final-margin`
    the restore     the latest moment the insurance save could be signalled (a step, the save, its
                    verification and upload, and `--redundant-time` before the deadline); where a
                    first attempt would not end before it (a slot already short; its length: the
                    longest restore measured, else `--upload-duration`), the latest moment
                    a final save could (`--final-margin` in place of `--redundant-time`), and the
                    run then saves as soon as it can
    no deadline     the attempts alone bound it

When the bound is spent, esiwrap stops (exit 66), or with `--restore-optional` starts the command
anyway: never silently from scratch. This part keeps the restore's state, its timers and its log
lines; the controller acts across parts (the verification, the job's state, the exit).
"""

from __future__ import annotations

from typing import Any, Literal

from esiwrap import events as ev
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import (
    RESTORE_ATTEMPTS,
    CheckpointLooked,
    ControllerConfig,
    FetchManifests,
    LookForCheckpoint,
    ManifestsFetched,
    Now,
    RestoreExited,
    RestoreStarted,
    StartRestore,
    StopRestore,
)
from esiwrap.core.controller.timers import Timer
from esiwrap.core.controller.uploads import upload_retry_wait_s
from esiwrap.core.manifest import Manifest, newest
from esiwrap.core.policy import (
    Observations,
    RestoreBound,
    restore_bound,
    restore_cutoff_at,
    restore_estimate_s,
)
from esiwrap.core.values import Checkpoint, Deadline
from esiwrap.errors import EXIT_NOT_RESTORED
from esiwrap.times import iso_utc

Stage = Literal["", "looking", "manifests", "command", "verifying", "retry", "done", "given up"]
Outcome = Literal["wait", "verify", "done", "given up", "found"]

FIX_COMMAND = ("run the --restore command by hand with this step and path and fix what it says (the store's "
               "address, credentials, the key the upload wrote)")
FIX_MANIFESTS = ("run the --restore-manifests command by hand into an empty directory and fix what it says: "
                 "it must copy the job's esiwrap-manifest.*.json files there")
FIX_NO_TIME = ("the deadline leaves no time to bring the checkpoint back and still save before it: a longer "
               "slot, a faster store, or --restore-optional to train anyway")


class Restoring:
    def __init__(self, out: Outbox, obs: Observations, config: ControllerConfig) -> None:
        self._out = out
        self._obs = obs
        self._config = config
        self.stage: Stage = ""
        self.checkpoint: Checkpoint | None = None
        self.attempt = 0  # the restore command's attempts (or the manifests command's)
        self.pid: int | None = None
        self.started_mono = 0.0  # this attempt's start
        self.retry_at: float | None = None  # monotonic
        self.failures: list[str] = []  # what went wrong, attempt by attempt (the exit reason)
        # The save the cut-off leaves room for: decided as a stage's first attempt starts, or when
        # the deadline becomes known after that (the shell asks its sources once the command is held)
        self.bound: RestoreBound = "insurance"
        self._bound_open = False

    @property
    def active(self) -> bool:
        return self.stage not in ("", "done", "given up")

    # ------------------------------------------------------------------ the start
    def begin(self, checkpoint: Checkpoint | None, now: Now, deadline: Deadline | None) -> Outcome:
        """Launch, with `--restore`: look for the job's checkpoint, or find it in its manifests.
        "done": nothing to restore."""
        if checkpoint is not None:
            return self.look(checkpoint, now, deadline)
        if self._config.restore_manifests:
            return self._fetch_manifests(now, deadline)
        self._out.log("info", ev.RESTORE_SKIPPED, reason="the job has no durable checkpoint yet (no state "
                      "file names one): its first run starts from scratch")
        self.stage = "done"
        return "done"

    def look(self, checkpoint: Checkpoint, now: Now, deadline: Deadline | None) -> Outcome:
        self.checkpoint = checkpoint
        if not checkpoint.path:  # nothing to look at: the command may not need the path
            return self._attempt(now, deadline)
        self.stage = "looking"
        self._out.act(LookForCheckpoint(checkpoint.path))
        return "wait"

    def looked(self, looked: CheckpointLooked, now: Now, deadline: Deadline | None) -> Outcome:
        checkpoint = self.checkpoint
        if self.stage != "looking" or checkpoint is None or looked.path != checkpoint.path:
            return "wait"
        if looked.present:
            self._out.log("info", ev.RESTORE_SKIPPED, step=checkpoint.step, path=checkpoint.path,
                          reason="the job's durable checkpoint is on this instance")
            self.stage = "done"
            return "done"
        return self._attempt(now, deadline)

    # ------------------------------------------------------------------ manifests
    def _fetch_manifests(self, now: Now, deadline: Deadline | None) -> Outcome:
        self.stage = "manifests"
        self.attempt += 1
        self.started_mono = now.mono
        self._out.act(FetchManifests(self.attempt))
        return "wait"

    def manifests_fetched(self, fetched: ManifestsFetched, now: Now,
                          deadline: Deadline | None) -> tuple[Outcome, Manifest | None]:
        if self.stage != "manifests":
            return "wait", None
        if fetched.code != 0 or fetched.error:
            return self._failed(now, deadline, stage="manifests", code=fetched.code, signal=fetched.signal,
                                stderr=list(fetched.stderr), problem=fetched.error or _exited(fetched.code,
                                fetched.signal, "--restore-manifests"), fix=FIX_MANIFESTS), None
        rejected = [{"file": name, "reason": why} for name, why in fetched.rejected]
        found = newest(fetched.manifests)
        if found is None:
            self._out.log("warning", ev.RESTORE_SKIPPED, rejected=rejected or None,
                          reason="no complete manifest was found: the job's first run starts from scratch "
                          "(if it ran before, its --upload did not copy {manifest}, or --restore-manifests "
                          "copied nothing)")
            self.stage = "done"
            return "done", None
        self._out.log("info", ev.MANIFEST_FOUND, step=found.step, path=found.path,
                      written=iso_utc(found.written_at), written_by=found.run_id or None,
                      manifests=len(fetched.manifests), rejected=rejected, state=found.state is not None)
        self.attempt = 0  # the restore's own attempts begin
        return "found", found

    # ------------------------------------------------------------------ the restore command
    def _attempt(self, now: Now, deadline: Deadline | None) -> Outcome:
        checkpoint = self.checkpoint
        assert checkpoint is not None
        if self.attempt == 0:
            self._choose_bound(now, deadline)
        cutoff = self._cutoff_mono(now, deadline)
        if cutoff is not None and now.mono >= cutoff:
            self.attempt += 1
            return self._failed(now, deadline, problem="no time left for a restore", fix=FIX_NO_TIME,
                                retry=False)
        self.attempt += 1
        self.stage = "command"
        self.pid = None
        self.started_mono = now.mono
        self._out.act(StartRestore(checkpoint.step, checkpoint.path, self.attempt))
        return "wait"

    def started(self, started: RestoreStarted, now: Now, deadline: Deadline | None) -> None:
        checkpoint = self.checkpoint
        if self.stage != "command" or checkpoint is None:
            return
        self.pid = started.pid
        cutoff = self._cutoff_mono(now, deadline)
        expected = restore_estimate_s(self._obs)
        self._out.log("info", ev.RESTORE_STARTED, step=checkpoint.step, path=checkpoint.path, pid=started.pid,
                      attempt=self.attempt, expected_s=rounded(expected) if expected is not None else None,
                      cutoff_in_s=rounded(cutoff - now.mono) if cutoff is not None else None,
                      cutoff_for=f"the {self.bound} save" if cutoff is not None else None)

    def exited(self, exited: RestoreExited, now: Now, deadline: Deadline | None) -> Outcome:
        if self.stage != "command" or (self.pid is not None and exited.pid != self.pid):
            return "wait"
        self.pid = None
        if exited.code == 0 and not exited.error:
            self.stage = "verifying"
            return "verify"
        return self._failed(now, deadline, code=exited.code, signal=exited.signal, stderr=list(exited.stderr),
                            problem=exited.error or _exited(exited.code, exited.signal, "--restore"),
                            fix=FIX_COMMAND)

    def verified(self, ok: bool, fields: dict[str, Any], now: Now, deadline: Deadline | None) -> Outcome:
        """What came back was verified: the command may start, or the attempt failed."""
        checkpoint = self.checkpoint
        if self.stage != "verifying" or checkpoint is None:
            return "wait"
        seconds = max(0.0, now.mono - self.started_mono)
        if ok:
            self._obs.restore_ended(seconds)
            self._out.log("info", ev.RESTORED, step=checkpoint.step, path=checkpoint.path,
                          seconds=rounded(seconds), bytes=fields.get("bytes"), files=fields.get("files"),
                          format=fields.get("format"), attempt=self.attempt)
            self.stage = "done"
            return "done"
        problem = f"what came back is not valid: {fields.get('problem', '')}"
        return self._failed(now, deadline, problem=problem, fix=str(fields.get("fix", "")),
                            format=fields.get("format"))

    # ------------------------------------------------------------------ failures, retries, the cut-off
    def _failed(self, now: Now, deadline: Deadline | None, *, retry: bool = True, stage: str = "restore",
                **fields: Any) -> Outcome:
        checkpoint = self.checkpoint
        self.failures.append(str(fields.get("problem", "")))
        where = {"step": checkpoint.step, "path": checkpoint.path} if checkpoint is not None else {}
        facts = {**where, "attempt": self.attempt, **{k: v for k, v in fields.items() if v is not None}}
        if stage == "manifests":
            facts["command"] = "--restore-manifests"
        if retry and self.attempt < RESTORE_ATTEMPTS:
            wait = upload_retry_wait_s(self.attempt)
            cutoff = self._cutoff_mono(now, deadline)
            expected = restore_estimate_s(self._obs) or 0.0
            if cutoff is None or now.mono + wait + expected < cutoff:
                self.retry_at = now.mono + wait
                self.stage = "retry"
                self._out.log("error", ev.RESTORE_FAILED, **facts, action=f"retry in {wait:g} s")
                return "wait"
        self.stage = "given up"
        self.retry_at = None
        action = ("start the command without it (--restore-optional)" if self._config.restore_optional
                  else f"exit {EXIT_NOT_RESTORED}")
        self._out.log("error", ev.RESTORE_FAILED, **facts, action=action)
        return "given up"

    def retry_now(self, now: Now, deadline: Deadline | None) -> Outcome:
        if self.stage != "retry":
            return "wait"
        self.retry_at = None
        if self.checkpoint is None:
            return self._fetch_manifests(now, deadline)
        return self._attempt(now, deadline)

    def cut_off(self, now: Now, deadline: Deadline | None) -> Outcome:
        """The cut-off came while the command or the verification ran: the bound is spent."""
        if self.stage == "command" or self.stage == "manifests":
            self._out.act(StopRestore("SIGKILL"))
        self.pid = None
        what = "the deadline" if self.stage == "manifests" else \
            f"the latest moment the {self.bound} save could still fit before the deadline"
        return self._failed(now, deadline, problem=f"cut off: it did not end before {what}", fix=FIX_NO_TIME,
                            retry=False)

    def stop(self) -> None:
        """The run is stopped before the command started (SIGTERM, Ctrl-C): stop what runs."""
        if self.stage in ("command", "manifests"):
            self._out.act(StopRestore("SIGKILL"))
        self.stage, self.pid, self.retry_at = "given up", None, None

    def exit_reason(self) -> str:
        checkpoint = self.checkpoint
        what = f"the checkpoint of step {checkpoint.step} ({checkpoint.path or 'no path'})" if checkpoint \
            else "the job's manifests"
        last = self.failures[-1] if self.failures else "it failed"
        return (f"--restore could not bring back {what} after {self.attempt} attempt(s): {last}; not started "
                "(--restore-optional starts it anyway)")

    def _choose_bound(self, now: Now, deadline: Deadline | None) -> None:
        """Which save the cut-off leaves room for, decided as a stage's first attempt starts (or as
        soon as the deadline is known)."""
        self._bound_open = deadline is None
        if deadline is None:
            return
        # Never measured: a transfer's guess (`--upload-duration`, the same network), so that an
        # insurance moment a few seconds ahead does not cut a restore off a few seconds in
        expected = restore_estimate_s(self._obs) or self._config.policy.upload_duration_s
        self.bound = restore_bound(deadline.at, self._obs, self._config.policy, now.wall, expected)

    def deadline_known(self, now: Now, deadline: Deadline) -> None:
        """A deadline came while restoring: the stage's cut-off is decided now, if it was not."""
        if self.active and self._bound_open:
            self._choose_bound(now, deadline)

    def _cutoff_wall(self, deadline: Deadline) -> float:
        """The manifests (a few small files) are fetched before the job's measurements are back, on
        which any save plan would be a guess: they are bounded by the deadline (less
        `--final-margin`) alone. The restore by the save it must leave room for."""
        if self.stage == "manifests":
            return deadline.at - self._config.policy.final_margin_s
        return restore_cutoff_at(deadline.at, self._obs, self._config.policy, self.bound)

    def _cutoff_mono(self, now: Now, deadline: Deadline | None) -> float | None:
        if deadline is None:
            return None
        return now.mono + self._cutoff_wall(deadline) - now.wall

    def timers(self, deadline: Deadline | None) -> list[Timer]:
        timers = []
        if self.stage == "retry" and self.retry_at is not None:
            timers.append(Timer("restore retry", "mono", self.retry_at))
        if self.stage in ("command", "verifying", "manifests") and deadline is not None:
            timers.append(Timer("restore cut-off", "wall", self._cutoff_wall(deadline)))
        return timers


def _exited(code: int | None, signal: str | None, what: str) -> str:
    if signal:
        return f"{what} was killed by {signal}"
    return f"{what} exited with code {code}"
