"""The job across its runs: this run's record in the job's history, the no-progress guard, and the
state the next run starts from.

A job runs again and again on capacity that is taken away, each run resuming from the last durable
checkpoint and reading what the runs before it left in the state file (`esiwrap.core.state`). What
the next run will read is decided here; the shell only reads the file before the run
(`esiwrap.shell.statefile`) and writes what the controller's `KeepState` carries.

    Job(loaded, ...)   the job as this run finds it: open records of runs that are gone are runs
                       that vanished (interrupted without notice); the prior the policy plans with,
                       the checkpoint the trainer should resume from
    guard()            before the command starts: the job's last runs made no progress, so this one
                       would not either (`esiwrap.core.history.no_progress`)
    ended(...)         how this run ended, from why the controller stopped it
    state(...)         the file's contents as of now: this run's measurements after the earlier
                       runs', its last durable checkpoint, its record, alive until now

Everything here is pure: times are arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from esiwrap.core.controller.modes import Mode
from esiwrap.core.controller.timers import Timer
from esiwrap.core.history import HEARTBEAT_S, NoProgress, RunRecord, ending_of, no_progress
from esiwrap.core.policy import Prior
from esiwrap.core.state import JobState
from esiwrap.core.values import CapacityKind, Checkpoint


@dataclass(frozen=True)
class Progress:
    """What the controller knows of this run when its record is refreshed."""

    nodes: int
    capacity: CapacityKind | None
    source: str  # the deadline's source
    durable_step: int | None
    saves: int
    uploads: int
    uploads_failed: int
    deadline_at: float | None = None  # the deadline known now (wall time)


@dataclass(frozen=True)
class Measured:
    """This run's measurements so far (the step window began with the state file's steps)."""

    steps: Sequence[float]
    saves: Sequence[float]
    blocking: Sequence[float]
    uploads: Sequence[float]
    checkpoint: Checkpoint | None  # this run's last durable checkpoint, if any
    uploaded: bool  # ...durable because its upload completed (else: it completed)
    verifies: Sequence[float] = ()
    restores: Sequence[float] = ()


class Job:
    """This run's place in its job: the state it found, its record, and what it leaves."""

    def __init__(self, loaded: JobState | None, started_at: float, *, run_id: str = "", host: str = "",
                 argv: Sequence[str] = (), max_no_progress_runs: int = 3, killed: str = "") -> None:
        """`killed`: the run whose esiwrap was killed on this machine, which lived on (the shell
        took its state file's lock over): its open record ends `killed`, not `interrupted`."""
        self.found = loaded.starting(started_at, host, killed) if loaded is not None else None
        checkpoint = self.found.checkpoint if self.found is not None else None
        start_step = checkpoint.step if checkpoint is not None else None
        self.run = RunRecord(started_at, started_at, run_id, start_step=start_step, end_step=start_step,
                             host=host)
        self.run_id, self.host = run_id, host
        self.argv = tuple(argv)
        self.max_no_progress_runs = max_no_progress_runs
        self.heartbeat_at: float | None = None  # monotonic: the record's next refresh, with a state file

    def beating(self, now_mono: float) -> None:
        """The record is refreshed from now on, every HEARTBEAT_S: should this run vanish, the next
        one counts its exposure until its last refresh."""
        self.heartbeat_at = now_mono + HEARTBEAT_S

    def timers(self, mode: Mode) -> list[Timer]:
        if self.heartbeat_at is None or mode is Mode.EXITED:
            return []
        return [Timer("heartbeat", "mono", self.heartbeat_at)]

    @property
    def prior(self) -> Prior | None:
        """What the policy plans with; the ended runs' ages count from this run's start."""
        return self.found.prior(self.run.started_at) if self.found is not None else None

    @property
    def resume_from(self) -> Checkpoint | None:
        """The job's last durable checkpoint: where the trainer should resume."""
        return self.found.checkpoint if self.found is not None else None

    def adopt(self, found: JobState) -> None:
        """The job's state came back another way than the state file (a manifest beside the
        checkpoint `--restore-manifests` found): this run starts from it, as from a state file.
        The run that wrote the manifest left its record open (it was running, uploading): how it
        ended after that is not known, so it is closed as `other` (its exposure counts, not as an
        interruption without notice: every run of a job whose only survivor is a bucket would look
        like one)."""
        runs = tuple(replace(r, ending="other") if r.ending == "running" else r for r in found.runs)
        self.found = replace(found, runs=runs).starting(self.run.started_at, self.host)
        checkpoint = self.found.checkpoint
        step = checkpoint.step if checkpoint is not None else None
        self.run = replace(self.run, start_step=step, end_step=step)

    def guard(self) -> NoProgress | None:
        """The no-progress guard's verdict on the runs before this one (None: let it start). The
        likely cause weighs the job's typical step (the median) and its longest save."""
        job = self.found
        if job is None:
            return None
        step = sorted(job.steps)[len(job.steps) // 2] if job.steps else None
        return no_progress(job.runs, self.max_no_progress_runs, step, max(job.saves) if job.saves else None)

    def refused(self) -> None:
        """The guard stopped this run before its command started: the record says so (a run the
        guard stopped ends the streak, so a job started again after the fix runs)."""
        self.run = replace(self.run, ending="no_progress")

    def ended(self, cause: str, deadline_in_s: float | None) -> None:
        """How the run ended (`history.ending_of`): once, from why the controller stopped it."""
        if self.run.ending == "running":
            self.run = replace(self.run, ending=ending_of(cause, deadline_in_s))

    def left(self) -> None:
        """The shell is leaving with no ending said: a failure of its own."""
        if self.run.ending == "running":
            self.run = replace(self.run, ending="other")

    def state(self, now: float, progress: Progress | None, measured: Measured) -> JobState:
        """The state file's contents as of `now`: this run's record refreshed (`progress` None: the
        command never started, nothing more to say than its ending), after the earlier runs'."""
        base = self.found or JobState()
        after = base.after_run(measured.steps, measured.saves, measured.blocking, now, self.argv,
                               uploads=measured.uploads, checkpoint=measured.checkpoint,
                               uploaded=measured.uploaded, verifies=measured.verifies,
                               restores=measured.restores)
        run = replace(self.run, seen_at=now)
        if progress is not None:
            end_step = progress.durable_step if progress.durable_step is not None else run.start_step
            run = replace(run, nodes=max(1, progress.nodes), capacity=progress.capacity,
                          source=progress.source, end_step=end_step, saves=progress.saves,
                          uploads=progress.uploads, uploads_failed=progress.uploads_failed,
                          deadline_at=progress.deadline_at)
        self.run = run
        return after.with_run(run)
