"""Replay a run through esiwrap's decision core on a simulated clock.

A `Trace` is one run's facts, fixed before the replay: how long each step takes, how long a save at
each step's boundary takes (all of it for a synchronous save; the blocking part apart for an
asynchronous one), the deadline and its changes as they were announced, and when the capacity
really went. `replay` feeds `esiwrap.core.controller.Controller`, the supervisor's own decision core,
the inputs the supervisor would (hello, a step report at each boundary, save begin / snapshot /
end, deadline answers, a wake-up at every timer it asks for) and carries out its actions: the save
signal raises the trainer's flag, seen at the trainer's next boundary (one sent while a step report
is handled is seen at the boundary after), and any stop ends training. The run keeps what its last
durable save holds. With uploads (`Trace.uploads`, the run has `--upload`), a checkpoint is durable
only once its upload ended before reclamation; the controller starts each upload (`StartUpload`),
one at a time, and they go on after training stops, until the controller exits.

A simulated checkpoint has no files: it is whole by construction. A trace that gives verification
times (`Trace.verify_s`) runs with verification, and its world answers each `VerifyCheckpoint`
after that time, valid; a trace that gives none (every family of `benchmarks/traces.py`) runs
without it, as its plans were made.

`benchmarks/simulate.py` replays synthetic traces against verl's rule and an oracle;
`esiwrap report --what-if` replays a real run's measured durations with other settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from esiwrap.core import controller as core
from esiwrap.core.controller import Controller, ControllerConfig, Now
from esiwrap.core.controller.job import Job
from esiwrap.core.effects import Effects
from esiwrap.core.history import RunRecord
from esiwrap.core.policy import PolicyConfig, Prior
from esiwrap.core.runner import Runner
from esiwrap.core.state import JobState
from esiwrap.core.values import Answer, CapacityKind, Deadline


@dataclass(frozen=True)
class DeadlineChange:
    at: float  # when the policies learn it
    deadline: float


@dataclass(frozen=True)
class Trace:
    """One run: its i-th step (1-based) takes steps[i-1], and a save at that step's boundary takes
    saves[i-1]. Its steps are numbered from `start_step` + 1: a run resumed from the checkpoint of
    step 49 makes steps 50, 51, ... (every step number below is the trainer's own)."""

    family: str
    steps: list[float]
    saves: list[float]
    deadline: float  # known at time 0
    reclaim_at: float  # when the capacity really goes (the last deadline minus the offset)
    changes: list[DeadlineChange] = field(default_factory=list)
    own_save_every: int = 0  # the trainer saves on its own at every k-th boundary (0: never)
    blocking: list[float] | None = None  # asynchronous saves: the part that stops training
    prior_steps: tuple[float, ...] = ()  # a state file from the previous run: step intervals...
    prior_saves: tuple[float, ...] = ()  # ...and measured saves
    checkpoint_bytes: float | None = None  # what the trainer says a checkpoint holds...
    probe_bps: float | None = None  # ...and what the storage probe measured (the prior: bytes / bps)
    capacity: CapacityKind | None = None  # what the deadline source says of the capacity
    notice_s: float | None = None  # the notice the deadline source watches for (a spot notice), if any
    nodes: int = 1  # the job's nodes, as esiwrap learns them
    surprise_rate_per_day: float = 0.0  # the true rate of interruptions with no notice, for the
    # reference policy; reclaim_at is already the first of them when it came before the deadline's
    surprised: bool = False  # ...and then this is true: the run never met its deadline
    uploads: list[float] | None = None  # `--upload`: the upload of a checkpoint of step k takes uploads[k-1]
    prior_uploads: tuple[float, ...] = ()  # the previous run's state file: measured uploads
    prior_runs: tuple[RunRecord, ...] = ()  # ...and the job's history of runs (`esiwrap.core.history`)
    prior_runs_at: float = 0.0  # when this run starts, on the history's clock
    verify_s: list[float] | None = None  # verification: step k's checkpoint: verify_s[index(k)]

    start_step: int = 0  # the step the trainer resumed from (0: from scratch); its first is the next
    run_id: str = ""  # a run of a job (`benchmarks/jobs.py`): its runs share a state file, as with
    # `--state-file`; its clock is the job's (it starts at prior_runs_at), the no-progress guard may
    # keep it from starting, and what it leaves for the next run is `Outcome.state`
    job: JobState | None = None  # ...the state file it starts from (None: the job's first run)

    def index(self, step: int) -> int:
        """Where step number `step` is in the lists (`steps`, `saves`, `uploads`)."""
        return step - self.start_step - 1

    def step_number(self, index: int) -> int:
        """The step number of the lists' entry `index`."""
        return self.start_step + index + 1

    def save_s(self, step: int) -> float:
        """How long a save at this step's boundary takes."""
        return self.saves[self.index(step)]

    def upload_s(self, step: int) -> float:
        """`--upload`: how long the upload of this step's checkpoint takes."""
        assert self.uploads is not None
        return self.uploads[self.index(step)]

    def blocking_s(self, step: int) -> float:
        """How long a save at this step's boundary stops training."""
        return self.save_s(step) if self.blocking is None else self.blocking[self.index(step)]

    def own_save(self, step: int) -> bool:
        return self.own_save_every > 0 and step % self.own_save_every == 0

    def boundaries(self) -> list[float]:
        """End of every step on the training clock (no saves in between): the progress made, by
        the lists' index (`index`)."""
        out, total = [], 0.0
        for duration in self.steps:
            total += duration
            out.append(total)
        return out


@dataclass(frozen=True)
class Write:
    """A save begun at `begins`: training resumes at `resumes`, it is durable at `durable`."""

    step: int
    begins: float
    resumes: float
    durable: float
    kind: str = ""  # the controller's kind for a save it asked for, "own" for the trainer's own


@dataclass(frozen=True)
class Outcome:
    saved_step: int | None  # the last step held by a completed save
    progress_s: float  # its training time: what the next instance resumes from
    reclaim_at: float
    saves: int  # saves begun
    saving_s: float  # wall time training stood still for saves, up to reclamation
    completed: tuple[Write, ...] = ()  # the saves that became durable, in order
    surprised: bool = False  # an interruption with no notice ended the run before its deadline
    uploading_s: float = 0.0  # wall time uploads ran, up to reclamation
    state: JobState | None = None  # a job's run: the state it left for the next one (its last KeepState)
    not_started: bool = False  # ...the no-progress guard kept it from starting (exit 78)

    @property
    def missed(self) -> bool:
        return self.saved_step is None

    @property
    def lost_s(self) -> float:
        return self.reclaim_at - self.progress_s


class Tally:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.progress = trace.boundaries()
        self.saved_step: int | None = None
        self.saves = 0
        self.saving_s = 0.0
        self.completed: list[Write] = []
        self.uploading_s = 0.0  # wall time uploads ran, up to reclamation

    def begin(self, step: int, at: float, kind: str = "") -> Write:
        self.saves += 1
        resumes = at + self.trace.blocking_s(step)
        self.saving_s += max(0.0, min(resumes, self.trace.reclaim_at) - at)
        return Write(step, at, resumes, at + self.trace.save_s(step), kind)

    def durable(self, write: Write) -> bool:
        """The write is on disk if it ended before reclamation; then it holds its step."""
        if write.durable > self.trace.reclaim_at:
            return False
        if self.trace.uploads is None:
            self._holds(write.step)
        self.completed.append(write)
        return True

    def uploaded(self, step: int, began: float, ended: float) -> bool:
        """An upload ran from `began` to `ended`: the checkpoint is durable if it ended in time."""
        self.uploading_s += max(0.0, min(ended, self.trace.reclaim_at) - began)
        if ended > self.trace.reclaim_at:
            return False
        self._holds(step)
        return True

    def _holds(self, step: int) -> None:
        if self.saved_step is None or step > self.saved_step:
            self.saved_step = step

    def cut_short(self, write: Write, stopped_at: float) -> None:
        """esiwrap's stop came while training stood still for this save: count only until then."""
        counted = min(write.resumes, self.trace.reclaim_at)
        self.saving_s -= max(0.0, counted - min(stopped_at, write.resumes))

    def outcome(self) -> Outcome:
        progress = self.progress[self.trace.index(self.saved_step)] if self.saved_step is not None else 0.0
        return Outcome(self.saved_step, progress, self.trace.reclaim_at, self.saves, self.saving_s,
                       tuple(self.completed), self.trace.surprised, self.uploading_s)


class UploadLine:
    """Uploads one at a time, for the baselines: a checkpoint completed while one runs waits, and
    only the newest waiting one is uploaded next (what esiwrap's controller does)."""

    def __init__(self, trace: Trace, tally: Tally) -> None:
        self.trace, self.tally = trace, tally
        self.running: tuple[int, float, float] | None = None  # step, began, ends
        self.waiting: tuple[int, float] | None = None  # step, ready since

    def add(self, step: int, ready: float) -> None:
        self.advance(ready)
        if self.running is None:
            self._start(step, ready)
        else:
            self.waiting = (step, ready)

    def advance(self, until: float) -> None:
        while self.running is not None and self.running[2] <= until:
            step, began, ends = self.running
            self.running = None
            self.tally.uploaded(step, began, ends)
            if self.waiting is not None:
                waiting, self.waiting = self.waiting, None
                self._start(waiting[0], ends)

    def finish(self) -> None:
        self.advance(math.inf)

    def _start(self, step: int, at: float) -> None:
        self.running = (step, at, at + self.trace.upload_s(step))


TRAINER_PID = 1000  # the simulated trainer is the direct child and says hello at once
JOB_STATE = "job-state.json"  # a job's runs keep a state file (its name, for the log; nothing is written)
JOB_HOST = "sim"  # every run of a simulated job is on "the same host": a vanished one is closed by the next
UPLOAD_PID = 2000  # the simulated upload helper


class _Shell(Effects):
    """What `esiwrap.shell.supervisor` does around the controller, on a simulated clock.

    The controller is esiwrap's own `esiwrap.core.controller.Controller`, driven by the
    supervisor's own `esiwrap.core.runner.Runner`; this shell is the runner's world (`Effects`): the
    save signal raises the trainer's flag (seen at the trainer's next boundary), and any stop ends
    training (the run keeps what its last durable save holds). An asynchronous write in flight
    reports its end when it is durable, and an upload its end when it is over, in time order with
    everything else: each is one wake-up of the supervisor's loop.
    """

    def __init__(self, trace: Trace, config: ControllerConfig, tally: Tally) -> None:
        self.wall0 = 0.0  # the wall clock at the run's start: the job's clock, in a job
        self.kept: JobState | None = None
        if trace.run_id:
            self.wall0 = trace.prior_runs_at
            config = replace(config, state_file=config.state_file or JOB_STATE)
            job = Job(trace.job, self.wall0, run_id=trace.run_id, host=JOB_HOST,
                      max_no_progress_runs=config.max_no_progress_runs)
            self.controller = Controller(config, job=job)
        else:
            known = trace.prior_saves or trace.prior_uploads or trace.prior_runs
            prior = Prior(trace.prior_steps, trace.prior_saves, (), trace.prior_uploads, trace.prior_runs,
                          trace.prior_runs_at) if known else None
            self.controller = Controller(config, prior=prior)
        self.runner = Runner(self.controller, self, lambda: Now(self.wall0 + self.now, self.now))
        self.tally = tally
        self.trace = trace
        self.now = 0.0
        self.flag = False  # the trainer's save flag, raised by the save signal
        self.stopped_at: float | None = None
        self.exited = False
        self.in_flight: Write | None = None
        self.upload: tuple[int, float, float] | None = None  # step, began, ends
        self.verify: tuple[core.VerifyCheckpoint, float] | None = None  # the check, when it ends
        self.changes = sorted(trace.changes, key=lambda c: c.at)
        self.capacity = trace.capacity
        if trace.run_id:
            self.feed(core.Launch())  # the guard may say no: Exit(78), and nothing starts
            if self.exited:
                return
        self.feed(core.ChildStarted(TRAINER_PID))
        self.feed(core.DeadlineAnswers((self._answer(trace.deadline),)))
        self.probe_bps = trace.probe_bps
        self.feed(core.Hello(TRAINER_PID, checkpoint_bytes=trace.checkpoint_bytes,
                             checkpoint_dir="sim" if trace.probe_bps is not None else None,
                             nodes=trace.nodes if trace.nodes > 1 else None))

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def feed(self, input_: core.Input) -> None:
        """One wake-up of the supervisor's loop with this input: it and what follows from it, then
        the timers that fell due."""
        self.runner.feed(input_)
        self.runner.wake()

    # ------------------------------------------------------------------ effects, simulated
    def send_signal(self, action: core.SendSignal) -> None:
        if TRAINER_PID in action.pids and action.signal == self.controller.config.save_signal:
            self.flag = True

    def stop_child(self, action: core.StopChild) -> None:
        self._stopped()

    def kill_tree(self, action: core.KillTree) -> None:
        self._stopped()

    def exit(self, action: core.Exit) -> None:
        self._stopped()
        self.exited = True

    def _stopped(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = self.now

    def probe_storage(self, action: core.ProbeStorage) -> None:
        """The probe's answer: its error was drawn with the trace (a second of writing: 0 here)."""
        if action.path is not None:
            self.runner.feed(core.StorageProbed("sim", self.probe_bps))

    def start_upload(self, action: core.StartUpload) -> None:
        if self.trace.uploads is not None:
            began = self.now
            self.upload = (action.step, began, began + self.trace.upload_s(action.step))
            self.runner.feed(core.UploadStarted(UPLOAD_PID))

    def stop_upload(self, action: core.StopUpload) -> None:
        if self.upload is not None:
            step, began, _ = self.upload
            self.upload = None  # cut off: the checkpoint stays local
            self.tally.uploaded(step, began, math.inf)
            self.runner.feed(core.UploadExited(UPLOAD_PID, None, action.signal))

    def log(self, action: core.Log) -> None:
        pass  # the tables are counted from the trainer's side (`Tally`)

    def term_leftovers(self, action: core.TermLeftovers) -> None:
        pass  # the simulated trainer is gone with its stop

    def check_tree(self, action: core.CheckTree) -> None:
        pass  # its end is fed when training is over (`wind_down`)

    def keep_state(self, action: core.KeepState) -> None:
        self.kept = action.state  # a job's next run starts from the last (`benchmarks/jobs.py`)

    def notify_stopping(self, action: core.NotifyStopping) -> None:
        pass

    def extend_stop_timeout(self, action: core.ExtendStopTimeout) -> None:
        pass

    def check_filesystem(self, action: core.CheckFilesystem) -> None:
        pass  # the simulated checkpoint is on storage that outlives the run

    def verify_checkpoint(self, action: core.VerifyCheckpoint) -> None:
        """Whole by construction: valid, after the trace's time (at once when it is 0)."""
        took = self.trace.verify_s[self.trace.index(action.step)] if self.trace.verify_s else 0.0
        if took <= 0.0:
            self.runner.feed(_valid(action))
        else:
            self.verify = (action, self.now + took)

    def stop_verify(self, action: core.StopVerify) -> None:
        self.verify = None  # given up: its answer never comes

    def write_manifest(self, action: core.WriteManifest) -> None:
        pass  # no files: the next run's state is `benchmarks/jobs.py`'s

    def look_for_checkpoint(self, action: core.LookForCheckpoint) -> None:
        _not_simulated(action)

    def fetch_manifests(self, action: core.FetchManifests) -> None:
        _not_simulated(action)

    def start_restore(self, action: core.StartRestore) -> None:
        _not_simulated(action)

    def stop_restore(self, action: core.StopRestore) -> None:
        _not_simulated(action)

    def start_command(self, action: core.StartCommand) -> None:
        _not_simulated(action)

    def release_capacity(self, action: core.ReleaseCapacity) -> None:
        pass

    def resolve_deadline(self, action: core.ResolveDeadline) -> None:
        pass  # the trace's deadline and its changes come when they come

    def refuse_message(self, action: core.RefuseMessage) -> None:
        pass  # the simulated trainer says only what it may

    def advance(self, until: float, *, after_stop: bool = False) -> None:
        """Timers, deadline announcements, a write becoming durable and an upload ending, up to
        `until`, in order (`after_stop`: training is over, the uploads and the timers go on). Never
        past the capacity's reclamation: nothing of the run happens after it."""
        until = min(until, self.trace.reclaim_at)
        while not self.exited and (after_stop or not self.stopped):
            wait = self.runner.wake_in()
            timer = math.inf if wait is None else self.now + wait
            change_at = self.changes[0].at if self.changes and not after_stop else math.inf
            durable_at = self.in_flight.durable if self.in_flight is not None else math.inf
            upload_at = self.upload[2] if self.upload is not None else math.inf
            verify_at = self.verify[1] if self.verify is not None else math.inf
            first = min(timer, change_at, durable_at, upload_at, verify_at)
            if first > until:
                break
            self.now = max(self.now, first)
            if durable_at == first:
                self.finish_write()
            elif verify_at == first:
                self.finish_verify()
            elif upload_at == first:
                self.finish_upload()
            elif change_at == first:
                self.feed(core.DeadlineAnswers((self._answer(self.changes.pop(0).deadline),)))
            else:
                self.runner.wake()
        self.now = max(self.now, until)

    def finish_verify(self) -> None:
        assert self.verify is not None
        action, _ = self.verify
        self.verify = None
        self.feed(_valid(action))

    def finish_upload(self) -> None:
        assert self.upload is not None
        step, began, ends = self.upload
        self.upload = None
        if self.tally.uploaded(step, began, ends):
            self.feed(core.UploadExited(UPLOAD_PID, 0))
        else:  # still running when the capacity went: nothing more happens in this run
            self.exited = True

    def wind_down(self) -> None:
        """Training is over: the child's tree is gone, the verifications and uploads finish or are
        cut off; in a job, the run's end is what the state file keeps."""
        if self.trace.uploads is None and self.trace.verify_s is None:
            if self.trace.run_id and self.controller.stop is not None and not self.exited \
                    and self.now <= self.trace.reclaim_at:
                self.feed(core.ChildExited(TRAINER_PID, 0))
                self.feed(core.TreeChecked(0))
            return
        if self.in_flight is not None:
            self.advance(self.in_flight.durable, after_stop=True)
        self.stopped_at = self.now if self.stopped_at is None else self.stopped_at
        if self.controller.stop is not None:
            self.feed(core.ChildExited(TRAINER_PID, 0))
            self.feed(core.TreeChecked(0))
        while not self.exited and self.now <= self.trace.reclaim_at:
            wait = self.runner.wake_in()
            nxt = min(self.now + wait if wait is not None else math.inf,
                      self.upload[2] if self.upload is not None else math.inf,
                      self.verify[1] if self.verify is not None else math.inf)
            if nxt > self.trace.reclaim_at:
                break
            self.advance(nxt, after_stop=True)
        if self.upload is not None:  # cut off by the reclamation: its time counts until then
            step, began, ends = self.upload
            self.upload = None
            self.tally.uploaded(step, began, ends)

    def _answer(self, deadline: float) -> Answer:
        return Answer("sim", deadline=Deadline(at=self.wall0 + deadline, source="sim"),
                      capacity=self.capacity, notice_s=self.trace.notice_s)

    def finish_write(self) -> None:
        write = self.in_flight
        assert write is not None
        self.in_flight = None
        if self.tally.durable(write):
            self.feed(core.SaveEnd(TRAINER_PID, write.step, duration_s=write.durable - write.begins,
                                   path=_path(self.trace, write.step)))


def replay(trace: Trace, config: PolicyConfig | ControllerConfig) -> Outcome:
    tally = Tally(trace)
    full = config if isinstance(config, ControllerConfig) else ControllerConfig(policy=config)
    if trace.uploads is not None and not full.uploads:  # a run with uploads is a run with --upload
        full = replace(full, policy=replace(full.policy, uploads=True))
    if (trace.verify_s is not None) != full.verifies:  # checked where the trace says how long it takes
        full = replace(full, policy=replace(full.policy, verify=trace.verify_s is not None))
    shell = _Shell(trace, full, tally)
    if shell.exited:  # the no-progress guard kept it from starting
        return replace(tally.outcome(), state=shell.kept, not_started=True)
    last_boundary = 0.0
    for index, duration in enumerate(trace.steps):
        step = trace.step_number(index)
        boundary = shell.now + duration
        shell.advance(boundary)  # a signal sent by now is seen at this boundary
        if boundary > trace.reclaim_at or shell.stopped:
            break
        seen = shell.flag
        shell.feed(core.Step(TRAINER_PID, step, boundary - last_boundary))
        last_boundary = boundary
        if (seen or trace.own_save(step)) and shell.in_flight is None:
            shell.flag = False
            if not _save(shell, tally, trace, step):
                break
        if shell.stopped:
            break
    if shell.in_flight is not None and not shell.stopped:
        shell.advance(shell.in_flight.durable)
    shell.wind_down()
    return replace(tally.outcome(), state=shell.kept)


def _path(trace: Trace, step: int) -> str:
    """Where a simulated checkpoint is: nowhere, unless the trace verifies it (it must be named)."""
    return f"sim/step_{step}" if trace.verify_s is not None else ""


def _valid(action: core.VerifyCheckpoint) -> core.CheckpointVerified:
    return core.CheckpointVerified(action.step, action.path, True, format="simulated",
                                   checked="nothing: no files")


def _not_simulated(action: core.Action) -> None:
    msg = f"the simulator does not restore: {action!r} (a replay starts with its checkpoint in place)"
    raise NotImplementedError(msg)


def _save(shell: _Shell, tally: Tally, trace: Trace, step: int) -> bool:
    """The trainer saves at this boundary; False when the run ended during the save."""
    shell.feed(core.SaveBegin(TRAINER_PID, step))
    request = shell.controller.request
    write = tally.begin(step, shell.now, request.kind if request is not None else "own")
    if trace.blocking is not None:
        shell.advance(write.resumes)
        if shell.stopped_at is not None and shell.stopped_at < write.resumes:
            tally.cut_short(write, shell.stopped_at)
            return False
        shell.in_flight = write
        shell.feed(core.SaveSnapshot(TRAINER_PID, step, duration_s=write.resumes - write.begins))
        return True
    shell.advance(write.durable)
    if shell.stopped_at is not None and shell.stopped_at < write.durable:
        tally.cut_short(write, shell.stopped_at)
        return False  # stopped while saving: the save never completed
    if not tally.durable(write):
        return False
    shell.feed(core.SaveEnd(TRAINER_PID, step, duration_s=write.durable - write.begins,
                            path=_path(trace, step)))
    return True
