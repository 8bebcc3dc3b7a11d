"""The decision core: what the supervisor does, as a pure state machine.

Inputs go in with the time (`Now`: the wall clock for deadlines, the monotonic clock for waits),
actions come out (signal these PIDs, stop the child, log this, keep the job's state, exit). An
input is what happened (a trainer's report, a signal, a deadline answer: the `Input` union);
"event" is kept for the log's event names (`esiwrap.events`). Nothing here does I/O or
reads a clock, so the supervisor (`esiwrap.supervisor`, the I/O shell), the policy simulator
(`benchmarks/simulate.py`) and the property tests all drive this same code.

One `Mode` says what the supervisor is doing, and each mode owns its timers; `wake_at` is the one
place that says when the loop must wake next:

    RUNNING         training; the planned save signal and the deadline are the timers
    SAVE_REQUESTED  a save was asked for and is not acknowledged; the deadline (a miss), and the
                    latest graceful stop while no trainer has attached to take the signal
    DRAINING        stopping as soon as the outstanding save is acknowledged (SIGTERM, a deadline
                    learned too late); the acknowledgement wait
    CONTINUING      the planned saves are done, the child keeps running: until the stop must begin
                    to end before the deadline (`--after-save linger`: a deadline that moves later
                    is followed), or for good (`--after-save continue`)
    STOPPING        the stop signal went to the child; its grace period
    KILLING         SIGKILL went to the tree; the wait for it to vanish
    UPLOADING       the child's tree is gone; the last checkpoint's upload (`--upload`) is ending:
                    until it does, or until it must be cut off to exit before the deadline

Uploads (`--upload`) run beside all of this, one at a time: after each completed save the
controller asks the shell to start one (`StartUpload`), hears when it started and how it ended
(`UploadStarted`, `UploadExited`), and exits 75 only when the last checkpoint's upload completed.
An upload that is running when a newer save completes is left to finish (cutting it off would
waste what it sent, and frequent saves would starve every upload); the newest checkpoint waiting
is uploaded next, older waiting ones are skipped.
"""

from __future__ import annotations

import enum
import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from esiwrap import events as ev
from esiwrap.choices import AfterSave, LogLevel, OnSigterm
from esiwrap.deadline.chain import Answer, winner
from esiwrap.deadline.remote import NODE_PREFIX
from esiwrap.deadline.value import CapacityKind, Deadline, iso_utc
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_FAILURE, EXIT_NOT_UPLOADED, EXIT_SAVE_MISSED
from esiwrap.policy import (
    Capacity,
    Observations,
    PolicyConfig,
    Prior,
    SavePlan,
    moved_enough,
    needed_s,
    renewal_reopens_insurance,
    replan,
    save_estimate_s,
    step_estimate_s,
    upload_attempt_s,
    upload_estimate_s,
)
from esiwrap.snapshot import Snapshot

KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the tree to vanish
STOP_TIMEOUT_MARGIN_S = 5.0  # asked of systemd on top of our own stop timeline
DEADLINE_CHANGE_S = 1.0  # smaller moves are the same deadline said twice
SAVE_WRITE_GRACE_FACTOR = 3.0  # a save being written may run this many estimates before it is cut off
UPLOAD_TERM_GRACE_S = 2.0  # an upload cut off gets SIGTERM, then SIGKILL this much later
UPLOAD_EXIT_MARGIN_S = 1.0  # ...and esiwrap is gone this much before the deadline
# A failed upload of the newest checkpoint is tried again as long as no newer checkpoint replaces
# it: after these waits, then waits that double up to UPLOAD_RETRY_MAX_S. Once the child has
# stopped, each wait is cut short so that an attempt of the expected length still ends before the
# cut-off; when none can, esiwrap gives up (exit 74).
UPLOAD_RETRY_S = (5.0, 30.0)  # the waits before the second and the third attempt
UPLOAD_RETRY_MAX_S = 300.0


# Inputs and actions are NamedTuples: as light to make as a tuple, and cheap to define (esiwrap's
# start-up imports them all).
NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


class Mode(enum.Enum):
    RUNNING = "running"
    SAVE_REQUESTED = "save_requested"
    DRAINING = "draining"
    CONTINUING = "continuing"
    STOPPING = "stopping"
    KILLING = "killing"
    UPLOADING = "uploading"


class Now(NamedTuple):
    wall: float  # epoch seconds: deadlines
    mono: float  # monotonic seconds: waits and grace periods


@dataclass(frozen=True)
class ControllerConfig:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    save_signal: str = "SIGUSR1"
    stop_signal: str = "SIGTERM"
    stop_grace_s: float = 30.0
    after_save: AfterSave = "stop"
    on_sigterm: OnSigterm = "checkpoint"
    signal_child: bool = False
    stop_budget_s: float | None = None  # what the platform gives a stop before SIGKILL, if declared
    probe_storage: bool = True  # measure the checkpoint storage's speed before the first save
    probe_dir: str | None = None  # where to probe when no trainer names its checkpoint directory
    local_checkpoints_survive: bool = False  # no checkpoint_not_durable warning for a local disk

    @property
    def uploads(self) -> bool:
        """`--upload` is set: a checkpoint is durable once its upload completed."""
        return self.policy.uploads


# ---------------------------------------------------------------------------------- inputs
class ChildStarted(NamedTuple):
    pid: int
    argv: tuple[str, ...] = ()
    settings: Mapping[str, Any] = NO_FIELDS  # the run options, for the log
    host: str = ""  # the machine's name: which instance this run was on (`esiwrap report`)


class Hello(NamedTuple):
    pid: int
    rank: int = 0
    saves: bool = True
    wants_signal: bool = True
    stop_signal: str | None = None
    descendant: bool = True  # the shell checked: the process is in esiwrap's own tree
    fields: Mapping[str, Any] = NO_FIELDS
    checkpoint_bytes: float | None = None  # what this process writes of a checkpoint, if it said
    checkpoint_dir: str | None = None  # where its checkpoints go (the storage to probe)
    resumed_from: str | None = None  # the checkpoint it resumed from (its files are a measurement)
    nodes: int | None = None  # how many nodes its job spans, if it said (torchrun: world / local)
    sigterm_saves: bool = False  # it takes SIGTERM as a save request (in a Slurm job)


class CheckpointSize(NamedTuple):
    """A trainer says (again) how many bytes its part of a checkpoint holds."""

    pid: int
    checkpoint_bytes: float


class StorageProbed(NamedTuple):
    """The shell measured how fast the checkpoint's storage takes writes (a bounded, fsync'd write
    in the background, or the previous checkpoint's files)."""

    path: str
    bandwidth_bps: float | None  # None: the probe failed (`error` says why)
    written_bytes: float = 0.0  # what the probe wrote, or what the previous checkpoint holds
    seconds: float = 0.0
    source: str = "probe"  # or "previous checkpoint"
    error: str = ""


class TrainerGone(NamedTuple):
    """A trainer said bye, or its process exited."""

    pid: int


class Step(NamedTuple):
    pid: int
    step: int
    duration_s: float
    delay_s: float | None = None  # how long the report took to reach esiwrap, where the shell knows


class SaveBegin(NamedTuple):
    pid: int
    step: int
    peer: bool = False  # another node's esiwrap asked for this save (multi-node torchrun)


class SaveSnapshot(NamedTuple):
    """An asynchronous save's blocking part is done: training goes on while the write continues."""

    pid: int
    step: int
    duration_s: float = 0.0
    peer: bool = False


class SaveEnd(NamedTuple):
    pid: int
    step: int
    ok: bool = True
    duration_s: float = 0.0
    path: str = ""
    error: str = ""
    peer: bool = False
    delay_s: float | None = None  # how long the report took to reach esiwrap, where the shell knows


class TrainingStart(NamedTuple):
    """Where the trainer's training starts: the step its state was at (verl: the global step after
    loading its checkpoint; 0 from scratch), with what it says about how it resumes."""

    pid: int
    step: int
    fields: Mapping[str, Any] = NO_FIELDS


class UploadStarted(NamedTuple):
    """The upload helper asked for by `StartUpload` runs."""

    pid: int


class UploadExited(NamedTuple):
    """The upload helper ended (code 0: the checkpoint is uploaded), or could not start (`error`)."""

    pid: int
    code: int | None  # None when killed by a signal or never started
    signal: str | None = None
    stderr: tuple[str, ...] = ()  # its last lines
    error: str = ""  # why it could not start


class FilesystemChecked(NamedTuple):
    """What holds a checkpoint's path (`esiwrap.durability`): kind local, memory, network, fuse,
    cluster or unknown."""

    path: str
    kind: str
    fstype: str
    mount_point: str = ""
    source: str = ""


class DeadlineAnswers(NamedTuple):
    answers: tuple[Answer, ...]


class SignalReceived(NamedTuple):
    """A signal to esiwrap (never SIGCHLD: reaping is the shell's, reported as `ChildExited`)."""

    name: str  # "SIGTERM"


class ChildExited(NamedTuple):
    pid: int
    code: int | None  # None when killed by a signal
    signal: str | None = None
    signum: int = 0


class TreeChecked(NamedTuple):
    """While stopping, after every wake-up: how many processes of the child's tree are left."""

    remaining: int


Input = (
    ChildStarted | Hello | CheckpointSize | StorageProbed | TrainerGone | Step | SaveBegin | SaveSnapshot
    | SaveEnd | DeadlineAnswers | SignalReceived | ChildExited | TreeChecked | TrainingStart | UploadStarted
    | UploadExited | FilesystemChecked
)


# ---------------------------------------------------------------------------------- actions
class SendSignal(NamedTuple):
    pids: tuple[int, ...]
    signal: str


class StopChild(NamedTuple):
    """Remember the child's tree, then send the child the first signal of the stop sequence
    (None: only remember the tree, a KillTree follows)."""

    signal: str | None


class KillTree:
    """SIGKILL to every remaining process of the child's tree."""


class TermLeftovers:
    """The child is gone: SIGTERM to what is left of its tree."""


class CheckTree:
    """While stopping, after every wake-up: reap, and report what is left of the child's tree
    (`TreeChecked`)."""


class KeepState(NamedTuple):
    """Write the job's state file (`--state-file`), if there is one: what this run measured, after
    every completed save and upload and once as the shell leaves (`Controller.finish`)."""

    steps: tuple[float, ...]  # the step window
    saves: tuple[float, ...]  # this run's save durations
    blocking: tuple[float, ...]  # how long each save esiwrap asked for stopped training
    uploads: tuple[float, ...] = ()  # this run's completed uploads' durations (`--upload`)
    checkpoint: Checkpoint | None = None  # this run's last durable checkpoint, if any
    uploaded: bool = False  # ...durable because its upload completed (else: it completed)


class Log(NamedTuple):
    level: LogLevel
    event: str
    fields: Mapping[str, Any]


class NotifyStopping:
    """Tell the service manager we are on our way out."""


class ExtendStopTimeout(NamedTuple):
    seconds: float


class ReleaseCapacity:
    """Exit 75 and the child's tree is gone: the run is done with this capacity, so the sources
    may let their platform go ahead (Azure `--azure-ack`: approve the scheduled event)."""


class Exit(NamedTuple):
    code: int
    reason: str


class ProbeStorage(NamedTuple):
    """Measure, off the loop, how fast `path`'s filesystem takes a bounded fsync'd write, and what
    the checkpoint `previous` (if any) holds and how long its files took to write; report each as
    StorageProbed."""

    path: str | None
    previous: str | None = None
    max_bytes: int | None = None  # write no more than this (a checkpoint smaller than the probe)


class StartUpload(NamedTuple):
    """Run the `--upload` command for this checkpoint (the shell reports UploadStarted or
    UploadExited)."""

    step: int
    path: str
    attempt: int = 1


class StopUpload(NamedTuple):
    """Send this signal to the running upload's process group (it is being cut off)."""

    signal: str


class CheckFilesystem(NamedTuple):
    """Find out what holds this checkpoint path, off the loop (the shell reports FilesystemChecked)."""

    path: str


TRAINER_REPORTS = (Step, SaveBegin, SaveSnapshot, SaveEnd, CheckpointSize, TrainingStart)

Action = (
    SendSignal | StopChild | KillTree | TermLeftovers | CheckTree | Log | NotifyStopping | ExtendStopTimeout
    | KeepState | ReleaseCapacity | Exit | ProbeStorage | StartUpload | StopUpload | CheckFilesystem
)
PROBE_REPEAT_S = 6 * 3600.0  # while no save is measured, probe the storage again this often


# ---------------------------------------------------------------------------------- state
@dataclass
class Trainer:
    """A process that said hello on the channel."""

    pid: int
    rank: int
    saves: bool
    signal: bool
    stop_signal: str | None
    attached_at: float
    checkpoint_bytes: float | None = None
    sigterm_saves: bool = False


@dataclass
class SaveRequest:
    reason: str  # deadline | sigterm | manual
    kind: str  # the plan's kind for a deadline save, else the reason
    requested_at: float
    signalled: set[int] = field(default_factory=set)
    begun: dict[int, int] = field(default_factory=dict)  # pid -> step
    snapshots: dict[int, SaveSnapshot] = field(default_factory=dict)
    done: dict[int, SaveEnd] = field(default_factory=dict)
    save_started_mono: float | None = None
    save_started_at: float | None = None  # wall: the boundary the checkpoint holds
    boundaries: int = 0  # step reports since it was asked for (a miss says whether the trainer went on)
    plan: SavePlan | None = None  # the plan that asked for it (deadline saves)


class Checkpoint(NamedTuple):
    """A completed save: the step it holds, the wall time it completed (acknowledged), and where
    the trainer wrote it ("" when it named no path). (The boundary it was taken at, from which
    work is at risk, is `Observations.checkpoint_at`.)"""

    step: int
    completed_at: float
    path: str = ""


@dataclass
class UploadRun:
    """The upload of one checkpoint, from StartUpload to UploadExited."""

    checkpoint: Checkpoint
    attempt: int
    started_wall: float
    started_mono: float
    pid: int | None = None
    cut_off: str = ""  # why esiwrap stopped it, once it did


@dataclass
class StopState:
    reason: str
    exit_status: int | None  # None: the child's own status
    until: float  # monotonic: the end of the grace period, or of the wait after SIGKILL
    leftovers_signalled: bool = False


class Controller:
    """Inputs in, actions out. `handle`, `tick` and `finish` return the actions to carry out, in
    order; `wake_at` and `snapshot` only tell."""

    def __init__(self, config: ControllerConfig, prior: Prior | None = None,
                 resume_from: Checkpoint | None = None) -> None:
        self.config = config
        self.mode = Mode.RUNNING
        self.obs = Observations(config.policy.step_window, prior)
        self.deadline: Deadline | None = None
        self.deadline_pending = True  # no deadline answer handed over yet
        self._known: dict[str, Deadline] = {}
        self._unavailable: dict[str, str] = {}
        self._early_warnings: dict[str, str] = {}  # source -> the early warning it gives now
        self.trainers: dict[int, Trainer] = {}
        self.child_pid: int | None = None
        self.child_status: int | None = None  # esiwrap's exit status for the child's end
        self.request: SaveRequest | None = None
        self.plan: SavePlan | None = None
        self._logged_signal_at: float | None = None
        self._warned_too_close = False
        # Insurance and final saves acknowledged against the current deadline (the policy's
        # `saves_done`); back to 0 when a renewal opens a new stretch to insure.
        self.deadline_saves_done = 0
        self.last_checkpoint: Checkpoint | None = None  # any completed save, the trainer's own too
        self._ack_until: float | None = None  # monotonic, while DRAINING
        self._sigints = 0
        self.stop: StopState | None = None
        self._exited = False
        self._out: list[Action] = []
        self._budget_warned_s = 0.0  # the stop needed this long when --stop-budget was last warned
        # This run's counts, for the metrics: saves completed (asked for, or the trainer's own),
        # failed (the trainer said so), missed (no acknowledgement in time).
        self.saves_completed_total = self.saves_failed_total = self.saves_missed_total = 0
        self._capacities: dict[str, CapacityKind] = {}  # source -> the capacity kind it reported
        self._checkpoint_dir: str | None = None  # the first directory a trainer named
        self._probe_asked = False  # the storage probe was asked for (once; then every PROBE_REPEAT_S)
        self._probe_again_at: float | None = None  # wall time of the next probe, while nothing is measured
        self._trainer_nodes = 1  # the most nodes a trainer's hello said its job spans
        self._node_sources: set[str] = set()  # other Ray nodes' sources that answered (node:<id>/…)
        # The newest checkpoint that outlives the instance, as far as esiwrap knows: with --upload,
        # the last one uploaded; without, the last one completed (its filesystem is the user's call).
        self.durable_checkpoint: Checkpoint | None = None
        self.upload: UploadRun | None = None  # running
        self.upload_waiting: Checkpoint | None = None  # completed while another upload ran
        self._upload_retry: tuple[Checkpoint, int, float] | None = None  # checkpoint, attempt, mono
        self._upload_until: float | None = None  # monotonic, while UPLOADING: the cut-off, then the kill
        self._upload_exit_reason = ""
        self._upload_killed = False
        self.uploads_completed_total = self.uploads_failed_total = 0
        self._filesystem_asked = False
        self._plan_awaits_upload = False  # no further save fits while this upload runs: decide at its end
        self._upload_window_end: float | None = None  # monotonic, while UPLOADING without a deadline
        self._attached_once = False  # a trainer said hello at some point (a miss says if none did)
        self._last_save_error: tuple[float, str] | None = None  # wall time, what the trainer said
        self.resume_from = resume_from  # the durable checkpoint an earlier run recorded (state file)
        self._resume_checked = False

    # ------------------------------------------------------------------ the two entry points
    def handle(self, input_: Input, now: Now, *, fire_timers: bool = True) -> list[Action]:
        """React to one input, then fire whatever timer it made due. Anything that is not an
        `Input` is the caller's bug: TypeError at once. `fire_timers=False` leaves the timers to
        `tick`: the shell applies every input that was waiting when its loop woke before a timer
        that fell due meanwhile decides (a save_end read behind a step report, late)."""
        if isinstance(input_, TRAINER_REPORTS) and not self._attached(input_.pid):
            return self._take()  # only a trainer that said hello reports steps and saves
        match input_:
            case ChildStarted():
                self._on_child_started(input_, now)
            case Hello():
                self._on_hello(input_, now)
            case CheckpointSize():
                self._on_checkpoint_size(input_, now)
            case StorageProbed():
                self._on_storage_probed(input_, now)
            case TrainerGone():
                self._on_trainer_gone(input_, now)
            case Step():
                self._on_step(input_, now)
            case SaveBegin():
                self._on_save_begin(input_, now)
            case SaveSnapshot():
                self._on_save_snapshot(input_, now)
            case SaveEnd():
                self._on_save_end(input_, now)
            case DeadlineAnswers():
                self._on_deadline_answers(input_, now)
            case SignalReceived():
                self._on_signal_received(input_, now)
            case ChildExited():
                self._on_child_exited(input_, now)
            case TreeChecked():
                self._on_tree_checked(input_, now)
            case TrainingStart():
                self._on_training_start(input_, now)
            case UploadStarted():
                self._on_upload_started(input_, now)
            case UploadExited():
                self._on_upload_exited(input_, now)
            case FilesystemChecked():
                self._on_filesystem_checked(input_, now)
            case _:
                msg = f"not an input of the controller: {input_!r}"
                raise TypeError(msg)
        if fire_timers:
            self._fire_timers(now)
        return self._take()

    def tick(self, now: Now, late_s: float | None = None) -> list[Action]:
        """The loop woke up (a timer, or anything else): fire the timers that are due; while
        stopping, ask for the child's tree to be checked. `late_s`: how long after the wake-up the
        loop asked for (`wake_at`) it got to run, when it slept until then; plans keep it as margin."""
        if late_s is not None:
            self.obs.timer_late.record(late_s)
        self._fire_timers(now)
        if self.mode in (Mode.STOPPING, Mode.KILLING) and not self._exited:
            self._out.append(CheckTree())
        return self._take()

    def finish(self, now: Now) -> list[Action]:
        """The shell is leaving (after `Exit`, or on a failure of its own): what must still be
        carried out. The job's state, when anything was measured."""
        if self.obs.saves or self.obs.last_step is not None:
            self._keep_state()
        return self._take()

    def wake_at(self, now: Now) -> float | None:
        """Seconds from `now` until a timer of the current mode is due (0: due now), or None."""
        waits = [at - now.wall for at in self._wall_timers()] + [at - now.mono for at in self._mono_timers()]
        return max(0.0, min(waits)) if waits else None

    def _wall_timers(self) -> list[float]:
        timers: list[float] = []
        if self.mode is Mode.CONTINUING and self.config.after_save == "linger":
            stop_at = self._latest_stop_at()
            return [stop_at] if stop_at is not None else []
        if self.mode in (Mode.RUNNING, Mode.SAVE_REQUESTED) and self.deadline is not None:
            timers.append(self.deadline.at)
            if self.mode is Mode.RUNNING and self.plan is not None:
                timers.append(self.plan.signal_at)
            if self.mode is Mode.RUNNING and self._probe_again_at is not None and not self.obs.measured:
                timers.append(self._probe_again_at)
            unattached = self._unattached_stop_at()
            if unattached is not None:
                timers.append(unattached)
            stop_at = self._latest_stop_at()
            if self._plan_awaits_upload and self.mode is Mode.RUNNING and stop_at is not None:
                timers.append(stop_at)  # the upload did not end in time to plan another save
        return timers

    def _mono_timers(self) -> list[float]:
        timers = [] if self._upload_retry is None or self._exited else [self._upload_retry[2]]
        if self.mode is Mode.DRAINING and self._ack_until is not None:
            timers.append(self._ack_until)
        elif self.mode in (Mode.STOPPING, Mode.KILLING) and self.stop is not None:
            timers.append(self.stop.until)
        elif self.mode is Mode.UPLOADING and self._upload_until is not None:
            timers.append(self._upload_until)
        return timers

    def _fire_timers(self, now: Now) -> None:
        """Fire due timers until none is: a timer's action can make another one due at once (a save
        asked for with nobody to take it, past its graceful stop). Each firing changes the state,
        so this ends; the bound only guards against a bug turning into a busy loop."""
        for _ in range(8):
            due = self.wake_at(now)
            if due is None or due > 0 or self._exited:
                return
            self._fire_due_timer(now)

    def _fire_due_timer(self, now: Now) -> None:
        """The timer of the current mode (`_wall_timers`, `_mono_timers`) that is due; first, in any
        mode, the retry of a failed upload."""
        if self._upload_retry is not None and now.mono >= self._upload_retry[2]:
            self._retry_upload(now)
            return
        match self.mode:
            case Mode.UPLOADING:  # the wait for the last upload, then its cut-off
                self._upload_timer(now)
            case Mode.CONTINUING:  # the latest moment the stop may begin (linger)
                self._begin_stop("checkpoint complete", EXIT_CHECKPOINTED, now)
            case Mode.DRAINING:  # the wait for the acknowledgement
                if self._ack_until is not None and now.mono >= self._ack_until:
                    self._ack_wait_over(now)
            case Mode.STOPPING | Mode.KILLING:  # the grace period, the wait after SIGKILL
                self._stop_timer(now)
            case Mode.RUNNING | Mode.SAVE_REQUESTED if self.deadline is not None:
                self._deadline_timer(self.deadline, now)

    def _deadline_timer(self, deadline: Deadline, now: Now) -> None:
        """The deadline itself, the latest graceful stop with nobody to save, the planned signal,
        the next storage probe, the latest stop while the plan waits for an upload's end."""
        unattached = self._unattached_stop_at()
        if now.wall >= deadline.at:
            self._deadline_reached(now)
        elif unattached is not None and now.wall >= unattached:
            self._missed("no trainer attached to save", now, level="warning")
        elif self.mode is Mode.RUNNING and self.plan is not None and now.wall >= self.plan.signal_at:
            self._request_save("deadline", now)
        elif self.mode is Mode.RUNNING and self._probe_again_at is not None \
                and now.wall >= self._probe_again_at:
            self._probe_again(now)
        elif self.mode is Mode.RUNNING and self._plan_awaits_upload:
            self._plan_awaits_upload = False
            self._no_further_save(now)

    def _take(self) -> list[Action]:
        actions, self._out = self._out, []
        return actions

    def _log(self, level: LogLevel, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    # ------------------------------------------------------------------ child and trainers
    def _on_child_started(self, started: ChildStarted, now: Now) -> None:
        self.child_pid = started.pid
        settings = {"settings": dict(started.settings)} if started.settings else {}
        host = {"host": started.host} if started.host else {}
        self._log("info", ev.CHILD_STARTED, pid=started.pid, argv=list(started.argv), **host, **settings)

    def _on_hello(self, hello: Hello, now: Now) -> None:
        if hello.wants_signal and not hello.descendant:
            # we only ever signal our own tree; relayed processes say signal=false
            self._log("warning", ev.TRAINER_REJECTED, pid=hello.pid, reason="not a descendant of esiwrap")
            return
        self.trainers[hello.pid] = _merged(self.trainers.get(hello.pid), hello, now)
        self._attached_once = True
        self._log("info", ev.TRAINER_ATTACHED, pid=hello.pid, **hello.fields)
        self.obs.trainer_started(now.wall)
        if hello.nodes is not None and hello.nodes > self._trainer_nodes:
            self._trainer_nodes = hello.nodes
            self._update_capacity()
        self._sum_checkpoint_bytes()
        if self._checkpoint_dir is None and hello.checkpoint_dir:
            self._checkpoint_dir = hello.checkpoint_dir
        self._probe(now, previous=hello.resumed_from)
        self._check_stop_budget()
        request = self.request
        if request is not None and not self.config.signal_child and hello.wants_signal \
                and hello.pid not in request.signalled:
            self._signal([hello.pid])  # a save is due: this trainer joins it at once
        self._replan(now)

    def _on_checkpoint_size(self, size: CheckpointSize, now: Now) -> None:
        trainer = self.trainers.get(size.pid)
        if trainer is not None and size.checkpoint_bytes > 0:
            trainer.checkpoint_bytes = size.checkpoint_bytes
            self._sum_checkpoint_bytes()
            self._replan(now)

    def _sum_checkpoint_bytes(self) -> None:
        """A checkpoint is what every saving process writes of it, on this node's storage."""
        parts = [t.checkpoint_bytes for t in self.trainers.values() if t.saves and t.checkpoint_bytes]
        if parts:
            self.obs.checkpoint_bytes = sum(parts)

    def _probe(self, now: Now, previous: str | None = None) -> None:
        """Ask the shell to measure the storage once a directory is known, and the checkpoint a
        trainer resumed from; only until a save is measured (then it is the better figure)."""
        if not self.config.probe_storage or self.obs.measured:
            return
        path = None if self._probe_asked else (self._checkpoint_dir or self.config.probe_dir)
        if path is None and previous is None:
            return
        if path is not None:
            self._probe_asked = True
            self.obs.prior_pending = True  # no calibration save on a guess while the prior is coming
        self._out.append(ProbeStorage(path, previous, self._probe_bytes()))

    def _probe_bytes(self) -> int | None:
        """A probe never writes more than a checkpoint would (a small one is a second's write)."""
        size = self.obs.checkpoint_bytes
        return None if size is None else int(size)

    def _probe_again(self, now: Now) -> None:
        """Storage speed changes (other jobs, a filling disk): measure again, rarely."""
        self._probe_again_at = None
        path = self._checkpoint_dir or self.config.probe_dir
        if path is not None and not self.obs.measured:
            self._out.append(ProbeStorage(path, None, self._probe_bytes()))

    def _on_storage_probed(self, probed: StorageProbed, now: Now) -> None:
        if probed.source == "probe":
            self.obs.prior_pending = False
            self._probe_again_at = now.wall + PROBE_REPEAT_S
        previous = probed.source == "previous checkpoint"
        if previous and probed.written_bytes > 0 and self.obs.checkpoint_bytes is None:
            self.obs.checkpoint_bytes = probed.written_bytes  # the trainer did not say: its last one does
        if probed.bandwidth_bps is None or not probed.bandwidth_bps > 0:
            self._log("warning", ev.STORAGE_PROBED, path=probed.path, source=probed.source,
                      error=probed.error)
            self._replan(now)  # no prior from it: plan as before
            return
        # Two measurements: the slower one rules (a probe is short, a checkpoint can outgrow caches).
        if self.obs.bandwidth_bps is None or probed.bandwidth_bps < self.obs.bandwidth_bps \
                or probed.source == self.obs.bandwidth_source:
            self.obs.bandwidth_bps, self.obs.bandwidth_source = probed.bandwidth_bps, probed.source
        self._log("info", ev.STORAGE_PROBED, path=probed.path, source=probed.source,
                  bandwidth_mb_s=_round(probed.bandwidth_bps / 1e6), written_bytes=int(probed.written_bytes),
                  seconds=_round(probed.seconds))
        self._replan(now)

    def _attached(self, pid: int) -> bool:
        """Said hello; with --signal-child the direct child needs not (it handles the signal itself)."""
        return pid in self.trainers or (self.config.signal_child and pid == self.child_pid)

    def _on_trainer_gone(self, gone: TrainerGone, now: Now) -> None:
        if self.trainers.pop(gone.pid, None) is not None and self.request is not None:
            self._check_acknowledged(self.request, now)  # it may have been the last one to wait for

    def _on_child_exited(self, exited: ChildExited, now: Now) -> None:
        self.child_status = exited.code if exited.code is not None else 128 + exited.signum
        fields: dict[str, Any] = {"pid": exited.pid, "code": exited.code, "signal": exited.signal}
        if exited.signal == "SIGKILL" and self.stop is None:
            fields["hint"] = "killed by SIGKILL: out of memory?"
        self._log("info", ev.CHILD_EXITED, **fields)
        self.trainers.pop(exited.pid, None)
        if self.stop is None:
            self._begin_stop("child exited", None, now)

    def _on_tree_checked(self, checked: TreeChecked, now: Now) -> None:
        stop = self.stop
        if stop is None or self.child_status is None:
            return
        if checked.remaining == 0:
            self._exit(stop.reason, now)
        elif not stop.leftovers_signalled:
            stop.leftovers_signalled = True
            self._out.append(TermLeftovers())

    # ------------------------------------------------------------------ trainer messages
    def _on_step(self, report: Step, now: Now) -> None:
        if report.pid != self._timing_pid():
            return
        if report.delay_s is not None:
            self.obs.report_delay.record(report.delay_s)
        if self.request is not None:
            self.request.boundaries += 1
        first = self.obs.last_step is None
        interval = self.obs.record_step(report.step, report.duration_s, now.wall)
        delay = {} if report.delay_s is None else {"delivery_s": _round(report.delay_s)}
        self._log("debug", ev.STEP_OBSERVED, step=report.step, duration_s=_round(interval), **delay)
        if first:  # the first boundary after a start from step s is s + 1
            self._check_resume(max(0, report.step - 1), NO_FIELDS, now)
        self._check_stop_budget()
        self._replan(now)

    def _adopt_peer_request(self, report: SaveBegin | SaveSnapshot | SaveEnd, now: Now) -> None:
        """A save another node's esiwrap asked for (the ranks agreed on it in their all-reduce) is
        this node's save too: the job ends after it on every node, so it becomes this node's
        request, and esiwrap stops after it."""
        if not report.peer or self.request is not None or self.stop is not None:
            return
        self.request = SaveRequest(reason="peer", kind="peer", requested_at=now.wall, signalled={report.pid})
        if self.mode is Mode.RUNNING:
            self.mode = Mode.SAVE_REQUESTED
        self._log("info", ev.SAVE_REQUESTED, reason="peer", kind="peer", pids=[],
                  remaining_s=self._remaining(now))

    def _on_save_begin(self, begin: SaveBegin, now: Now) -> None:
        self._adopt_peer_request(begin, now)
        request = self.request
        if request is None:
            self._log("info", ev.SAVE_STARTED, step=begin.step, pid=begin.pid, requested=False)
            return
        first = not request.begun
        request.begun[begin.pid] = begin.step
        if first:
            request.save_started_mono, request.save_started_at = now.mono, now.wall
            self._log("info", ev.SAVE_STARTED, step=begin.step, pid=begin.pid, requested=True)

    def _on_save_snapshot(self, snapshot: SaveSnapshot, now: Now) -> None:
        self._adopt_peer_request(snapshot, now)
        request = self.request
        if request is None or snapshot.pid in request.snapshots:
            return  # the trainer's own asynchronous save: its end is what counts
        first = not request.snapshots
        request.snapshots[snapshot.pid] = snapshot
        if first:  # training resumes now, while the write goes on
            self.obs.record_blocking(snapshot.duration_s, now.wall)

    def _on_save_end(self, end: SaveEnd, now: Now) -> None:
        if end.delay_s is not None:
            self.obs.report_delay.record(end.delay_s)
        if not end.ok:
            self.saves_failed_total += 1
            self._last_save_error = (now.wall, end.error)
            self._log("error", ev.SAVE_FAILED, step=end.step, pid=end.pid, error=end.error)
            return  # the trainer keeps its flag and tries again at the next boundary
        self._adopt_peer_request(end, now)
        request = self.request
        if request is None:
            self.obs.record_save(end.duration_s, now.wall)
            self._save_completed(end.step, [end], now, requested=False)  # the trainer's own
            self._replan(now)
            return
        request.done[end.pid] = end
        self._check_acknowledged(request, now)

    def _check_acknowledged(self, request: SaveRequest, now: Now) -> None:
        savers = {t.pid for t in self.trainers.values() if t.saves}
        # No saver left (e.g. --signal-child with a trainer that only reports saves): any report does.
        if request.done and (savers <= set(request.done) or not savers):
            self._acknowledged(request, now)

    def _acknowledged(self, request: SaveRequest, now: Now) -> None:
        messages = list(request.done.values())
        duration = max(m.duration_s for m in messages)
        if request.snapshots:  # asynchronous: the blocking part was counted at the snapshot
            self.obs.record_save(duration, now.wall, request.save_started_at)
        else:
            self.obs.record_requested_save(duration, now.wall, request.save_started_at)
        self.request = None
        self._save_completed(max(m.step for m in messages), messages, now, requested=True, kind=request.kind)
        if self.mode is Mode.DRAINING:
            self._ack_until = None
            self._begin_stop(f"checkpoint complete after {request.reason}", EXIT_CHECKPOINTED, now)
            return
        if request.reason == "peer":  # the node that asked stops its ranks: the job ends here too
            self._begin_stop("checkpoint complete after a peer node's request", EXIT_CHECKPOINTED, now)
            return
        if self.mode is Mode.SAVE_REQUESTED:
            self.mode = Mode.RUNNING
        if request.reason in ("manual", "early_warning"):
            return  # a save by hand, or on an early warning, changes nothing in the plan
        if request.kind in ("insurance", "final"):
            self.deadline_saves_done += 1
        self.plan = None
        self._logged_signal_at = None  # the next plan is a new save: always log it
        self._replan(now)

    def _save_completed(
        self, step: int, messages: list[SaveEnd], now: Now, *, requested: bool, kind: str = ""
    ) -> None:
        """A checkpoint of `step` is complete: count it, log it, upload it or look at what holds
        it, keep the job's state."""
        self.saves_completed_total += 1
        paths = sorted({m.path for m in messages if m.path})
        self.last_checkpoint = Checkpoint(step, now.wall, checkpoint_path(paths))
        self._check_stop_budget()
        self._log(
            "info", ev.SAVE_COMPLETED, step=step, requested=requested, kind=kind or None,
            duration_s=_round(max(m.duration_s for m in messages)),
            path=paths[0] if len(paths) == 1 else (paths or None),
            remaining_s=self._remaining(now),
        )
        self._checkpoint_completed(self.last_checkpoint, now)
        self._keep_state()  # a new save measured: the next run plans with it even if this one dies

    def _keep_state(self) -> None:
        obs = self.obs
        self._out.append(KeepState(tuple(obs.intervals), tuple(d for _, d in obs.saves), tuple(obs.blocking),
                                   tuple(obs.uploads), self.durable_checkpoint, self.config.uploads))

    # ------------------------------------------------------------------ durability and uploads
    def _checkpoint_completed(self, checkpoint: Checkpoint, now: Now) -> None:
        """A checkpoint is complete on the trainer's storage: upload it, or look at what holds it."""
        if not self.config.uploads:
            self.durable_checkpoint = checkpoint
            if checkpoint.path and not self._filesystem_asked and not self.config.local_checkpoints_survive:
                self._filesystem_asked = True  # the first save with a path: is it on a local disk?
                self._out.append(CheckFilesystem(checkpoint.path))
            return
        self._upload_retry = None  # a newer checkpoint replaces the one that failed
        if self.upload is None:
            self._start_upload(checkpoint, 1, now)
            return
        older = self.upload_waiting
        if older is not None:
            self._log("info", ev.UPLOAD_SKIPPED, step=older.step, path=older.path,
                      superseded_by=checkpoint.step,
                      reason="a newer checkpoint completed while an upload was running")
        self.upload_waiting = checkpoint

    def _on_filesystem_checked(self, checked: FilesystemChecked, now: Now) -> None:
        if checked.kind != "local" or self.config.uploads:
            return  # only a local disk is known to go with the instance
        self._log("warning", ev.CHECKPOINT_NOT_DURABLE, path=checked.path, filesystem=checked.fstype,
                  mount_point=checked.mount_point, device=checked.source,
                  fix="the checkpoint is on this machine's local disk and goes with the instance: "
                  "write checkpoints to storage that outlives it (a network or cluster filesystem), or "
                  "copy each one with --upload CMD (e.g. --upload 'aws s3 cp --recursive {path} "
                  "s3://BUCKET/job/{step}/'); if this disk survives, --local-checkpoints-survive")

    def _start_upload(self, checkpoint: Checkpoint, attempt: int, now: Now) -> None:
        self.upload = UploadRun(checkpoint, attempt, now.wall, now.mono)
        self.obs.upload_began(now.wall)
        self._out.append(StartUpload(checkpoint.step, checkpoint.path, attempt))
        if self.mode is Mode.UPLOADING:  # the child is gone: this attempt ends by the cut-off
            self._upload_until = self._attempt_until(self.upload, now)

    def _on_upload_started(self, started: UploadStarted, now: Now) -> None:
        run = self.upload
        if run is None:
            return
        run.pid = started.pid
        self._log("info", ev.UPLOAD_STARTED, step=run.checkpoint.step, path=run.checkpoint.path,
                  pid=started.pid, attempt=run.attempt,
                  upload_estimate_s=_round(upload_estimate_s(self.obs, self.config.policy)),
                  remaining_s=self._remaining(now))

    def _on_upload_exited(self, exited: UploadExited, now: Now) -> None:
        run = self.upload
        if run is None or (run.pid is not None and exited.pid != run.pid):
            return
        self.upload = None
        self._upload_until, self._upload_killed = None, False  # its cut-off went with it
        duration = max(0.0, now.mono - run.started_mono)
        checkpoint = run.checkpoint
        if exited.code == 0 and not exited.error:
            self.obs.upload_ended(duration)
            self.uploads_completed_total += 1
            if self.durable_checkpoint is None or checkpoint.step >= self.durable_checkpoint.step:
                self.durable_checkpoint = checkpoint
            self._log("info", ev.UPLOAD_COMPLETED, step=checkpoint.step, path=checkpoint.path,
                      duration_s=_round(duration), attempt=run.attempt, remaining_s=self._remaining(now))
            self._keep_state()  # a durable checkpoint and an upload measured: the next run knows both
        else:
            self.obs.upload_ended(None)
            self.uploads_failed_total += 1
            fields: dict[str, Any] = {"code": exited.code, "signal": exited.signal}
            if exited.error:
                fields["error"] = exited.error
            if run.cut_off:
                fields["reason"] = run.cut_off
            self._log("error", ev.UPLOAD_FAILED, step=checkpoint.step, path=checkpoint.path,
                      duration_s=_round(duration), attempt=run.attempt, stderr=list(exited.stderr),
                      remaining_s=self._remaining(now), **fields)
            newest = self.upload_waiting is None and checkpoint == self.last_checkpoint
            if newest and not run.cut_off and not exited.error:
                at = now.mono + upload_retry_wait_s(run.attempt)
                self._plan_upload_retry(checkpoint, run.attempt + 1, at, now)
        waiting, self.upload_waiting = self.upload_waiting, None
        if waiting is not None and not (self.mode is Mode.UPLOADING and run.cut_off):
            self._start_upload(waiting, 1, now)
        if self.mode is Mode.UPLOADING:
            self._uploads_settled(now)
        else:
            self._plan_awaits_upload = False
            self._replan(now)  # the upload is measured, and the next one need not wait for it

    def _plan_upload_retry(self, checkpoint: Checkpoint, attempt: int, at: float, now: Now) -> None:
        """Try the checkpoint's upload again at monotonic `at`; once the child is gone, no later than
        an attempt of the expected length can still end before the cut-off, and not at all when
        none can (then esiwrap gives up on it)."""
        expected = upload_attempt_s(self.obs, self.config.policy)
        reason = "backoff"
        if self.mode is Mode.UPLOADING:
            latest = self._upload_cutoff(now) - expected
            if latest < now.mono:
                self._upload_retry = None
                self._log("warning", ev.UPLOAD_GIVEN_UP, step=checkpoint.step, path=checkpoint.path,
                          attempts=attempt - 1, expected_s=_round(expected),
                          cutoff_in_s=_round(self._upload_cutoff(now) - now.mono),
                          reason="no further attempt of the expected length ends before the cut-off")
                return
            if at > latest:
                at, reason = latest, "the latest start that still ends before the cut-off"
        self._upload_retry = (checkpoint, attempt, at)
        cutoff = {} if self.mode is not Mode.UPLOADING else {
            "cutoff_in_s": _round(self._upload_cutoff(now) - now.mono)}
        self._log("info", ev.UPLOAD_RETRY_PLANNED, step=checkpoint.step, path=checkpoint.path,
                  attempt=attempt, in_s=_round(at - now.mono), reason=reason, expected_s=_round(expected),
                  remaining_s=self._remaining(now), **cutoff)

    def _retry_upload(self, now: Now) -> None:
        retry, self._upload_retry = self._upload_retry, None
        if retry is not None and self.upload is None:
            self._start_upload(retry[0], retry[1], now)

    def _upload_outstanding(self) -> bool:
        return self.upload is not None or self.upload_waiting is not None or self._upload_retry is not None

    def _await_upload(self, reason: str, now: Now) -> None:
        """The child's tree is gone, but the last checkpoint's upload is not done: wait for it, and
        for its retries, up to the cut-off: the moment it must be cut off to exit before the
        deadline (without a deadline: --stop-grace or three upload estimates, whichever is longer)."""
        self.mode = Mode.UPLOADING
        self._upload_exit_reason = reason
        self._upload_window_end = None if self.deadline is not None else now.mono + self._upload_wait_s()
        self._upload_until = None
        run, retry = self.upload, self._upload_retry
        if run is not None:
            self._upload_until = self._attempt_until(run, now)
        elif retry is not None:  # its wait is cut short if it would start too late to end in time
            self._plan_upload_retry(retry[0], retry[1], retry[2], now)
            if self._upload_retry is None:
                self._uploads_settled(now)
                return
        self._out.append(ExtendStopTimeout(max(0.0, self._upload_cutoff(now) - now.mono) + UPLOAD_TERM_GRACE_S
                                           + KILL_WAIT_S + STOP_TIMEOUT_MARGIN_S))

    def _upload_wait_s(self) -> float:
        """How long an upload is waited for at a stop without a deadline."""
        estimate = upload_estimate_s(self.obs, self.config.policy)
        return max(self.config.stop_grace_s, SAVE_WRITE_GRACE_FACTOR * estimate)

    def _upload_cutoff(self, now: Now) -> float:
        """Monotonic: when an upload still running at a stop must be cut off (SIGTERM), so that
        esiwrap exits before the deadline; without a deadline, the end of the wait."""
        if self.deadline is not None:
            return now.mono + self.deadline.at - UPLOAD_TERM_GRACE_S - UPLOAD_EXIT_MARGIN_S - now.wall
        return self._upload_window_end if self._upload_window_end is not None else now.mono

    def _attempt_until(self, run: UploadRun, now: Now) -> float:
        """An attempt at a stop runs until the cut-off, and no longer than esiwrap waits for one."""
        return max(now.mono, min(run.started_mono + self._upload_wait_s(), self._upload_cutoff(now)))

    def _upload_timer(self, now: Now) -> None:
        """While UPLOADING: cut the upload off (SIGTERM, then SIGKILL), then stop waiting for it."""
        run = self.upload
        if run is None:
            self._uploads_settled(now)
            return
        if not run.cut_off:
            near = self.deadline is not None and \
                now.wall >= self.deadline.at - UPLOAD_TERM_GRACE_S - UPLOAD_EXIT_MARGIN_S - 0.5
            run.cut_off = ("cut off: the deadline was too close to wait any longer" if near
                           else "cut off: it took longer than esiwrap waits at a stop")
            self._out.append(StopUpload("SIGTERM"))
            self._upload_until = now.mono + UPLOAD_TERM_GRACE_S
            self._upload_killed = False
        elif not self._upload_killed:
            self._upload_killed = True
            self._out.append(StopUpload("SIGKILL"))
            wait = KILL_WAIT_S  # for the reap; never past the deadline
            if self.deadline is not None:
                wait = min(wait, max(0.0, self.deadline.at - now.wall - 0.25))
            self._upload_until = now.mono + wait
        else:  # it survived SIGKILL: do not wait for it any longer
            self.upload = None
            self.upload_waiting = None
            self._finish(self._upload_exit_reason, now)

    def _uploads_settled(self, now: Now) -> None:
        """An upload ended at a stop: exit, unless another attempt is planned."""
        if self.upload is None and self._upload_retry is None:
            self.upload_waiting = None
            self._finish(self._upload_exit_reason, now)

    def _check_stop_budget(self) -> None:
        """A stop the platform cuts short (SIGKILL after `--stop-budget`) loses the checkpoint
        being written: warn when the rest of a step, a save and `--stop-grace` do not fit in it,
        again only when what is needed grows by a fifth."""
        budget = self.config.stop_budget_s
        if budget is None:
            return
        step = self.current_step_estimate_s() or 0.0
        measured = self.obs.longest_save_s
        save = measured if measured is not None else self.config.policy.save_duration_s
        needed = step + save + self.config.stop_grace_s
        if needed <= budget or needed <= self._budget_warned_s * 1.2:
            return
        self._budget_warned_s = needed
        self._log("warning", ev.STOP_BUDGET_TOO_SMALL, budget_s=_round(budget), needed_s=_round(needed),
                  step_s=_round(step), save_s=_round(save), stop_grace_s=_round(self.config.stop_grace_s),
                  fix=f"raise the platform's stop budget to at least {math.ceil(needed)} s (docker stop -t, "
                  "terminationGracePeriodSeconds, TimeoutStopSec) and --stop-budget with it, or lower "
                  "--stop-grace if the trainer exits sooner")

    # ------------------------------------------------------------------ resuming
    def _on_training_start(self, start: TrainingStart, now: Now) -> None:
        self._check_resume(max(0, start.step), start.fields, now)

    def _check_resume(self, start_step: int, fields: Mapping[str, Any], now: Now) -> None:
        """Did the trainer start from the checkpoint an earlier run left (`--state-file`)?"""
        if self._resume_checked:
            return
        self._resume_checked = True
        checkpoint = self.resume_from
        if checkpoint is None:
            return
        redone = max(0, checkpoint.step - start_step)
        facts = {"checkpoint_step": checkpoint.step, "start_step": start_step, "steps_redone": redone,
                 "path": checkpoint.path or None, "checkpoint_at": iso_utc(checkpoint.completed_at)}
        if redone == 0:
            self._log("info", ev.RESUMED, **facts)
            return
        where = "from scratch" if start_step == 0 else f"from step {start_step}, before it"
        self._log("warning", ev.RESUME_MISSED, **facts, started=where,
                  causes=self._resume_causes(checkpoint, fields))

    def _resume_causes(self, checkpoint: Checkpoint, fields: Mapping[str, Any]) -> list[str]:
        path = checkpoint.path or "where the last run wrote it"
        if fields.get("integration") == "verl" or "resume_mode" in fields:
            mode, folder = fields.get("resume_mode"), fields.get("default_local_dir")
            causes = []
            if mode == "disable":
                causes.append("trainer.resume_mode=disable: verl starts from scratch; set "
                              "trainer.resume_mode=auto")
            elif mode == "resume_path":
                causes.append(f"trainer.resume_mode=resume_path: trainer.resume_from_path "
                              f"({fields.get('resume_from_path')}) is not the checkpoint of step "
                              f"{checkpoint.step} ({path})")
            causes.append(f"trainer.default_local_dir ({folder or '?'}) must be the directory that holds "
                          f"global_step_{checkpoint.step} and latest_checkpointed_iteration.txt "
                          f"({path}), on this instance")
            return causes
        return [f"the trainer did not load the checkpoint of step {checkpoint.step} ({path}): check the "
                "path it resumes from", "the checkpoint must be on this instance: copy it back from where "
                "--upload put it before the trainer starts"]

    # ------------------------------------------------------------------ signals to esiwrap
    def _on_signal_received(self, received: SignalReceived, now: Now) -> None:
        """esiwrap's own signals (`esiwrap.signals.USED`); every other one goes to the child."""
        match received.name:
            case "SIGINT":
                self._handle_sigint(now)
            case "SIGTERM":
                self._handle_sigterm(now)
            case "SIGUSR1":
                self._handle_sigusr1(now)
            case other:
                self._forward(other)

    def _handle_sigint(self, now: Now) -> None:
        self._sigints += 1
        if self._sigints >= 2:
            self._log("warning", ev.CHILD_STOPPING, signal="SIGKILL", grace_s=0, reason="second SIGINT")
            self._begin_stop("interrupted twice", None, now, immediate=True)
        else:
            self._forward("SIGINT")

    def _handle_sigterm(self, now: Now) -> None:
        if self.config.on_sigterm == "forward" or self.stop is not None:
            self._forward("SIGTERM")
            return
        if self.mode is Mode.DRAINING:
            return  # already turning a SIGTERM into a checkpoint
        self._out.append(NotifyStopping())
        saved = self._progress_is_saved()
        if saved or not self._signal_targets():
            self._begin_stop("SIGTERM", EXIT_CHECKPOINTED if saved else None, now)
            return
        self._drain(now)
        if self.request is None:
            self._request_save("sigterm", now)
        else:
            self.request.reason = "sigterm"

    def _handle_sigusr1(self, now: Now) -> None:
        if self.mode in (Mode.RUNNING, Mode.CONTINUING) and self.request is None:
            self._request_save("manual", now)

    def _forward(self, name: str) -> None:
        if self.child_pid is not None and self.child_status is None:
            self._out.append(SendSignal((self.child_pid,), name))

    # ------------------------------------------------------------------ deadline
    def _on_deadline_answers(self, given: DeadlineAnswers, now: Now) -> None:
        self.deadline_pending = False
        capacity_before = self.obs.capacity
        cancelled = False  # the ruling deadline's own source took it back
        for answer in given.answers:
            if answer.capacity is not None:
                self._capacities[answer.source] = answer.capacity
            if answer.source.startswith(NODE_PREFIX):
                self._node_sources.add(answer.source)
            if answer.withdrawn:  # a node that left, an event cancelled: its deadline no longer counts
                self._capacities.pop(answer.source, None)
                self._node_sources.discard(answer.source)
                known = self._known.pop(answer.source, None)
                if known is not None or self._unavailable.pop(answer.source, None) is not None:
                    self._log("info", ev.DEADLINE_WITHDRAWN, source=answer.source, reason=answer.reason)
                cancelled |= self._took_back_the_ruling_deadline(answer, known)
            elif answer.deadline is not None:
                self._known[answer.source] = answer.deadline
                self._unavailable.pop(answer.source, None)
            elif self._unavailable.get(answer.source) != answer.reason:
                self._unavailable[answer.source] = answer.reason
                level: LogLevel = "info" if answer.expected else "warning"
                self._log(level, ev.DEADLINE_UNAVAILABLE, source=answer.source, reason=answer.reason)
            self._early_warning(answer, now)
        self._update_capacity()
        new = winner(Answer(d.source, deadline=d) for d in self._known.values())
        if new is not None:
            self._set_deadline(new, now)
        elif cancelled:  # and no other source knows one; a node that left keeps the last one instead
            self._deadline_gone()
        elif self.obs.capacity != capacity_before:
            self._replan(now)

    def _update_capacity(self) -> None:
        """The capacity the policy plans for: spot if any source says so (the first reclamation
        counts), else reserved or on-demand; the job's nodes: every Ray node watched, or what a
        trainer said (torchrun's world)."""
        kinds = self._capacities
        order: tuple[CapacityKind, ...] = ("spot", "reserved", "on-demand")
        kind = next((k for k in order if k in kinds.values()), None)
        source = next((s for s, k in kinds.items() if k == kind), "")
        watched = len({source.split("/", 1)[0] for source in self._node_sources})
        nodes = max(self._trainer_nodes, 1 + watched)
        self.obs.capacity = Capacity(kind, nodes, source)

    def _took_back_the_ruling_deadline(self, answer: Answer, known: Deadline | None) -> bool:
        """The ruling deadline's own source withdrew it (an Azure event cancelled). A node that
        left the cluster is no such news: its last deadline is kept (README: Several nodes)."""
        ruling = self.deadline
        return known is not None and ruling is not None and known.source == ruling.source \
            and not answer.source.startswith(NODE_PREFIX)

    def _deadline_gone(self) -> None:
        """No deadline any more (the announced event was cancelled, or is over): nothing is
        planned until a new one comes, and that one is planned afresh (a new insurance save)."""
        self.deadline, self.plan, self._logged_signal_at = None, None, None
        self.deadline_saves_done, self._warned_too_close = 0, False
        if self.mode is Mode.CONTINUING:
            self.mode = Mode.RUNNING

    def _early_warning(self, answer: Answer, now: Now) -> None:
        """A new early warning from a source (EC2 rebalance: elevated risk of interruption) asks
        for a save now, once per warning: not a deadline, so the plan stays as it is."""
        if answer.early_warning == self._early_warnings.get(answer.source, ""):
            return
        if not answer.early_warning:
            del self._early_warnings[answer.source]
            return
        self._early_warnings[answer.source] = answer.early_warning
        why_not = self._why_no_save_now()
        self._log("warning", ev.EARLY_WARNING, source=answer.source, reason=answer.early_warning,
                  action=why_not or "save now")
        if why_not is None:
            self._request_save("early_warning", now)

    def _why_no_save_now(self) -> str | None:
        if self.stop is not None or self.mode in (Mode.DRAINING, Mode.STOPPING, Mode.KILLING):
            return "none: stopping"
        if self.request is not None:
            return "none: a save is under way"
        if self._progress_is_saved():
            return "none: the latest step is saved"
        if not self._signal_targets():
            return "none: no trainer attached"
        return None

    def _set_deadline(self, new: Deadline, now: Now) -> None:
        old = self.deadline
        if old is not None and abs(old.at - new.at) < DEADLINE_CHANGE_S:
            return
        self.deadline = new
        if old is None:
            self._log("info", ev.DEADLINE_RESOLVED, source=new.source, deadline=new.iso(),
                      remaining_s=_round(new.at - now.wall), raw=new.raw, lead_s=new.lead_s,
                      capacity=self.obs.capacity.kind, **new.detail)
        else:
            self._log("warning", ev.DEADLINE_CHANGED, old=old.iso(), new=new.iso(), source=new.source,
                      remaining_s=_round(new.at - now.wall), raw=new.raw, capacity=self.obs.capacity.kind,
                      **new.detail)
        later = old is None or new.at > old.at
        if self.mode is Mode.CONTINUING and later:
            self.mode, self.deadline_saves_done = Mode.RUNNING, 0  # a renewal: plan against it afresh
        elif old is not None and later and self._renewal_fits_insurance(new.at, now):
            self.deadline_saves_done, self.plan = 0, None  # renewed after a save: insure the new stretch too
            self._warned_too_close = False
        if new.at <= now.wall and self.mode in (Mode.RUNNING, Mode.SAVE_REQUESTED):
            self._deadline_already_passed(now)
            return
        self._replan(now)

    def _renewal_fits_insurance(self, deadline: float, now: Now) -> bool:
        """A later deadline while running, after a save: is there room for a new insurance save?"""
        if self.mode is not Mode.RUNNING or self.deadline_saves_done == 0:
            return False
        return renewal_reopens_insurance(deadline, self.obs, self.config.policy, now.wall)

    def _deadline_already_passed(self, now: Now) -> None:
        """Learned too late: save at once if anything can, give it --stop-grace, then stop."""
        self._log("warning", ev.DEADLINE_TOO_CLOSE, remaining_s=self._remaining(now), needed_s=None,
                  action="save now, then stop")
        if self.request is None:
            self._request_save("deadline", now)
        if self.mode is Mode.SAVE_REQUESTED:
            self._drain(now)

    def _deadline_reached(self, now: Now) -> None:
        if self.last_checkpoint is not None:
            self._begin_stop("deadline reached", EXIT_CHECKPOINTED, now)
            return
        self._missed("deadline passed without an acknowledged save", now)

    def _missed(self, reason: str, now: Now, level: LogLevel = "error") -> None:
        """No checkpoint, and none can come now: say why (the last plan, the signal, what was late,
        what never came), then stop with exit 76."""
        self.saves_missed_total += 1
        facts = self._miss_facts(now)
        self._log(level, ev.SAVE_MISSED, remaining_s=self._remaining(now), reason=reason, **facts)
        self._begin_stop(f"{reason}: {facts['never_came'][0]}", EXIT_SAVE_MISSED, now)

    def _miss_facts(self, now: Now) -> dict[str, Any]:
        """Why no save was acknowledged: what the run knew, for the log of an exit 76."""
        request = self.request
        plan = request.plan if request is not None and request.plan is not None else self.plan
        obs = self.obs
        facts: dict[str, Any] = {
            "last_plan": None if plan is None else {
                "kind": plan.kind, "signal_at": iso_utc(plan.signal_at),
                "step_estimate_s": _round(plan.step_estimate_s),
                "save_estimate_s": _round(plan.save_estimate_s),
                "upload_estimate_s": _round(plan.upload_estimate_s), "reserve_s": _round(plan.reserve_s),
                "lateness_s": _round(plan.lateness_s), "why": plan.why},
            "signal": None if request is None else {
                "reason": request.reason, "requested_at": iso_utc(request.requested_at),
                "late_s": _round(request.requested_at - request.plan.signal_at) if request.plan else None,
                "pids": sorted(request.signalled), "step_reports_since": request.boundaries},
            "late": {"timers_max_s": _round(obs.timer_late.max_s),
                     "reports_max_s": _round(obs.report_delay.max_s),
                     "last_step_report_s_ago": _round(now.wall - obs.step_started_at)
                     if obs.last_step is not None and obs.step_started_at is not None else None},
        }
        facts["never_came"] = self._never_came(request, now)
        return facts

    def _never_came(self, request: SaveRequest | None, now: Now) -> list[str]:
        """What the save waited for and did not get, first the one that decided."""
        found: list[str] = []
        if self._last_save_error is not None:
            at, error = self._last_save_error
            found.append(f"the trainer reported a failed save {now.wall - at:.1f}s ago: "
                         f"{error or 'no error text'}")
        if not self._attached_once:
            found.insert(0, "no trainer said hello: esiwrap.trainer.install() was never called (or the "
                         "process was not esiwrap's descendant), so no process could take the save signal")
        elif request is None:
            found.insert(0, "no save was asked for: the deadline came before the plan's moment (learned "
                         "too late, or moved earlier)")
        elif not request.signalled:
            found.insert(0, "the save signal went to no process: no trainer was attached when the save "
                         "was due")
        elif not request.begun and request.boundaries:
            found.insert(0, f"no save_begin: the trainer reported {request.boundaries} step(s) after the "
                         "save signal without saving (is esi.save_requested() checked at each boundary?)")
        elif not request.begun:
            found.insert(0, f"no step boundary came after the save signal "
                         f"({now.wall - request.requested_at:.1f}s before the deadline): the step in "
                         "progress ran longer than the plan allowed")
        elif not request.done:
            started = request.save_started_at or request.requested_at
            found.insert(0, f"save_begin came {now.wall - started:.1f}s before the deadline, save_end never "
                         "came: the save took longer than planned")
        else:
            waiting = sorted({t.pid for t in self.trainers.values() if t.saves} - set(request.done))
            found.insert(0, f"save_end came from some ranks, not from {waiting}")
        return found

    # ------------------------------------------------------------------ planning
    def _replan(self, now: Now) -> None:
        if self.mode is not Mode.RUNNING or self.deadline is None:
            return
        plan = replan(self.deadline.at, self.obs, self.config.policy, self.deadline_saves_done, self.plan,
                      now.wall)
        if plan is None:
            self._no_further_save(now)
            return
        self.plan = plan
        # Too close: the insurance save should have been asked for a step ago or more (a plan that
        # falls due just now, as a step report arrives on time, is not a warning).
        late_s = now.wall - plan.nominal_at
        too_late = late_s > max(1.0, plan.step_estimate_s)
        if plan.kind == "insurance" and too_late and not self._warned_too_close:
            self._warned_too_close = True
            self._log("warning", ev.DEADLINE_TOO_CLOSE, remaining_s=self._remaining(now),
                      needed_s=_round(needed_s(plan)))
        # The log shows the plan while steps keep their usual length; the timer may come earlier
        # when a step runs long, and that is logged when the signal is sent.
        if moved_enough(self._logged_signal_at, plan.nominal_at):
            self._logged_signal_at = plan.nominal_at
            self._log(
                "info", ev.SAVE_SCHEDULED, kind=plan.kind, signal_at=iso_utc(plan.nominal_at),
                in_s=_round(plan.nominal_at - now.wall), step_estimate_s=_round(plan.step_estimate_s),
                save_estimate_s=_round(plan.save_estimate_s), reserve_s=_round(plan.reserve_s),
                lateness_s=_round(plan.lateness_s), why=plan.why,
            )

    def _no_further_save(self, now: Now) -> None:
        """The last planned save is done: stop (`--after-save stop`), or let training go on. With
        `linger`, until the stop must begin to end before the deadline (nothing trained now can be
        saved, but a deadline that moves later is followed); with `continue`, for good."""
        self.plan = None
        stop_at = self._latest_stop_at()
        if self.upload is not None and stop_at is not None and stop_at > now.wall:
            # The upload running is the measurement (or the wait) that kept a further save out of
            # the plan: decide again when it ends, training on meanwhile.
            self._plan_awaits_upload = True
            return
        self._plan_awaits_upload = False
        if self.config.after_save == "continue":
            self.mode = Mode.CONTINUING
            self._log("info", ev.TRAINING_CONTINUES, reason="--after-save continue")
            return
        stop_at = self._latest_stop_at()
        if self.config.after_save == "stop" or stop_at is None or stop_at <= now.wall:
            self._begin_stop("checkpoint complete", EXIT_CHECKPOINTED, now)
            return
        self.mode = Mode.CONTINUING
        self._log("info", ev.TRAINING_CONTINUES, reason="no further save fits; training goes on in case "
                  "the deadline moves later", stop_at=iso_utc(stop_at), in_s=_round(stop_at - now.wall))

    def _latest_stop_at(self) -> float | None:
        """When the stop sequence must begin for esiwrap to exit before the deadline."""
        if self.deadline is None:
            return None
        return self.deadline.at - self.config.stop_grace_s - KILL_WAIT_S

    def _request_save(self, reason: str, now: Now) -> None:
        targets = self._signal_targets()
        if not targets and reason == "manual":
            self._log("warning", ev.NO_TRAINER_ATTACHED, action="ignored", reason=reason)
            return
        plan = self.plan if reason == "deadline" else None
        kind = plan.kind if plan is not None else reason
        self.request = SaveRequest(reason=reason, kind=kind, requested_at=now.wall, plan=plan)
        if self.mode is Mode.RUNNING:  # a save by hand while continuing keeps continuing
            self.mode = Mode.SAVE_REQUESTED
        planned = {} if plan is None else {  # the plan as it stood when it fired (for `esiwrap report`)
            "planned_at": iso_utc(plan.signal_at), "late_s": _round(now.wall - plan.signal_at),
            "step_estimate_s": _round(plan.step_estimate_s), "save_estimate_s": _round(plan.save_estimate_s),
            "why": plan.why,
        }
        self._log("info", ev.SAVE_REQUESTED, reason=reason, kind=kind, remaining_s=self._remaining(now),
                  signal=self.config.save_signal, pids=targets, **planned)
        if targets:
            self._signal(targets)
        else:
            # Nothing registered (yet): a trainer that attaches in time is signalled at once;
            # otherwise the child is stopped gracefully, --stop-grace before the deadline.
            at = self._unattached_stop_at()
            self._log("warning", ev.NO_TRAINER_ATTACHED, action="stop",
                      stop_at=iso_utc(at) if at is not None else None)

    def _signal(self, pids: list[int]) -> None:
        assert self.request is not None
        self.request.signalled.update(pids)
        self._out.append(SendSignal(tuple(pids), self.config.save_signal))

    def _unattached_stop_at(self) -> float | None:
        """A save is due but nothing took the signal: the latest graceful stop, --stop-grace before
        the deadline; if that had passed when the save was asked for, a trainer may still attach
        and save up to the deadline itself."""
        request = self.request
        if self.mode is not Mode.SAVE_REQUESTED or request is None or self.deadline is None:
            return None
        if request.signalled:
            return None
        graceful = self.deadline.at - self.config.stop_grace_s
        return graceful if graceful > request.requested_at else self.deadline.at

    def _signal_targets(self) -> list[int]:
        if self.config.signal_child:
            return [self.child_pid] if self.child_pid is not None and self.child_status is None else []
        return [t.pid for t in self.trainers.values() if t.signal]

    def _timing_pid(self) -> int | None:
        trainers = sorted(self.trainers.values(), key=lambda t: (t.rank, t.attached_at))
        return trainers[0].pid if trainers else None

    def _progress_is_saved(self) -> bool:
        """A completed save holds the latest step: nothing would be gained by another."""
        checkpoint = self.last_checkpoint
        return checkpoint is not None and checkpoint.step >= (self.obs.last_step or 0)

    # ------------------------------------------------------------------ draining
    def _drain(self, now: Now) -> None:
        """Stop once the outstanding save is acknowledged; wait for it up to --stop-grace."""
        self.mode = Mode.DRAINING
        self._ack_until = now.mono + self.config.stop_grace_s
        self._extend_stop_timeout(now)

    def _ack_wait_over(self, now: Now) -> None:
        """--stop-grace after a SIGTERM (or a deadline learned too late) is over."""
        request = self.request
        if request is not None and request.save_started_mono is not None:
            # A save is being written: do not kill it while it can still finish in time.
            limit = request.save_started_mono + max(
                self.config.stop_grace_s,
                SAVE_WRITE_GRACE_FACTOR * save_estimate_s(self.obs, self.config.policy),
            )
            if self.deadline is not None:  # never past the deadline: the capacity is gone then
                limit = min(limit, now.mono + self.deadline.at - now.wall)
            if now.mono < limit:
                self._ack_until = limit
                self._log("info", ev.STOP_EXTENDED, until_s=_round(limit - now.mono),
                          reason="save in progress")
                self._extend_stop_timeout(now)
                return
        self._ack_until = None
        saved = self._progress_is_saved()
        if not saved and self.deadline is not None and now.wall >= self.deadline.at:
            self._missed("deadline passed without an acknowledged save", now)
            return
        self.saves_missed_total += 1
        self._log("warning", ev.SAVE_MISSED, remaining_s=self._remaining(now),
                  reason="no acknowledgement within --stop-grace",
                  never_came=self._never_came(self.request, now))
        if saved:
            self._begin_stop("stop requested, latest step already saved", EXIT_CHECKPOINTED, now)
        else:
            self._begin_stop("SIGTERM", None, now)

    def _extend_stop_timeout(self, now: Now) -> None:
        """While a service manager stops us: ask for the time the checkpoint and the stop need."""
        if self.mode is Mode.DRAINING and self._ack_until is not None:
            until = self._ack_until + self.config.stop_grace_s  # the save, then the child's stop grace
        elif self.mode is Mode.STOPPING and self.stop is not None:
            until = self.stop.until
        else:
            return
        self._out.append(ExtendStopTimeout(until - now.mono + KILL_WAIT_S + STOP_TIMEOUT_MARGIN_S))

    # ------------------------------------------------------------------ stopping
    def _begin_stop(self, reason: str, exit_status: int | None, now: Now, *, immediate: bool = False) -> None:
        if self.stop is not None:
            if immediate and self.mode is Mode.STOPPING:
                self._kill(now)
            elif immediate and self.mode is Mode.UPLOADING and self.upload is not None:
                self._upload_retry = None
                self.upload.cut_off = self.upload.cut_off or f"cut off: {reason}"
                self._out.append(StopUpload("SIGKILL"))
                self._upload_killed = True
                self._upload_until = now.mono + KILL_WAIT_S
            elif immediate and self.mode is Mode.UPLOADING:  # waiting for a retry: exit now
                self._upload_retry = None
                self._uploads_settled(now)
            return
        self.mode = Mode.STOPPING
        self.plan = None
        self._ack_until = None
        self.stop = StopState(reason, exit_status, until=now.mono + self.config.stop_grace_s)
        self._out.append(NotifyStopping())
        self._extend_stop_timeout(now)
        if self.child_status is not None:
            self._stop_sigterm_savers()
            return  # the child is gone already: the tree check decides when we are done
        if immediate:
            self._out.append(StopChild(None))
            self._kill(now)
            return
        signal = self._stop_signal()
        self._log("info", ev.CHILD_STOPPING, signal=signal, grace_s=self.config.stop_grace_s, reason=reason)
        self._out.append(StopChild(signal))
        self._stop_sigterm_savers()

    def _stop_sigterm_savers(self) -> None:
        """A trainer below the child that takes SIGTERM as a save request (a rank under torchrun,
        in a Slurm job) would outlive the SIGTERM its launcher passes on: it gets its own stop
        signal directly."""
        by_signal: dict[str, list[int]] = {}
        for trainer in self.trainers.values():
            if trainer.sigterm_saves and trainer.stop_signal and trainer.pid != self.child_pid:
                by_signal.setdefault(trainer.stop_signal, []).append(trainer.pid)
        for name, pids in by_signal.items():
            self._out.append(SendSignal(tuple(pids), name))

    def _stop_signal(self) -> str:
        trainer = self.trainers.get(self.child_pid) if self.child_pid is not None else None
        if trainer is not None and trainer.stop_signal is not None:
            return trainer.stop_signal
        return self.config.stop_signal

    def _kill(self, now: Now) -> None:
        assert self.stop is not None
        self.mode = Mode.KILLING
        self.stop.until = now.mono + KILL_WAIT_S
        self._out.append(KillTree())

    def _stop_timer(self, now: Now) -> None:
        stop = self.stop
        if stop is None or now.mono < stop.until:
            return
        if self.mode is Mode.STOPPING:
            self._kill(now)
        else:
            self._exit(stop.reason + " (processes survived SIGKILL)", now)

    def _exit(self, reason: str, now: Now) -> None:
        """The child's tree is gone: exit, once the last checkpoint's upload has ended."""
        if self._upload_outstanding() and self.mode is not Mode.UPLOADING:
            self._await_upload(reason, now)
            return
        self._finish(reason, now)

    def _finish(self, reason: str, now: Now) -> None:
        stop = self.stop
        assert stop is not None
        if self._exited:
            return
        if stop.exit_status is not None:
            code = stop.exit_status
        else:
            code = self.child_status if self.child_status is not None else EXIT_FAILURE
        if code == EXIT_CHECKPOINTED and self.config.uploads and not self._last_checkpoint_uploaded():
            code, reason = EXIT_NOT_UPLOADED, f"{reason}; {self._not_uploaded_reason()}"
        self._exited = True
        if code == EXIT_CHECKPOINTED:
            self._out.append(ReleaseCapacity())
        self._out.append(Exit(code, reason))

    def _last_checkpoint_uploaded(self) -> bool:
        last, durable = self.last_checkpoint, self.durable_checkpoint
        return last is not None and durable is not None and durable.step >= last.step

    def _not_uploaded_reason(self) -> str:
        last, durable = self.last_checkpoint, self.durable_checkpoint
        step = f"step {last.step}" if last is not None else "the last step"
        text = f"checkpoint of {step} complete on local storage only: its upload did not finish"
        if durable is not None:
            text += f" (the last uploaded checkpoint holds step {durable.step})"
        else:
            text += " (no checkpoint of this run was uploaded)"
        return text

    # ------------------------------------------------------------------ facts for people
    def _remaining(self, now: Now) -> float | None:
        return _round(self.deadline.at - now.wall) if self.deadline is not None else None

    def current_step_estimate_s(self) -> float | None:
        return step_estimate_s(self.obs, self.config.policy)

    def snapshot(self, now: Now, run_id: str, pid: int) -> Snapshot:
        """What esiwrap knows now, as one value: the metrics, the status file, `esiwrap status`."""
        plan = self.plan if self.mode is Mode.RUNNING else None
        deadline, request = self.deadline, self.request
        boundary = self.obs.checkpoint_at  # the boundary the last checkpoint holds (or the start)
        checkpoint = self.last_checkpoint
        return Snapshot(
            time=now.wall, run_id=run_id, pid=pid, child_pid=self.child_pid, phase=self.mode.value,
            deadline_at=deadline.at if deadline else None,
            deadline_source=deadline.source if deadline else None,
            next_save_at=plan.nominal_at if plan else None, next_save_kind=plan.kind if plan else None,
            next_save_reason=plan.why if plan else None, step_estimate_s=self.current_step_estimate_s(),
            save_estimate_s=plan.save_estimate_s if plan else save_estimate_s(self.obs, self.config.policy),
            last_step=self.obs.last_step,
            last_checkpoint_at=checkpoint.completed_at if checkpoint else None,
            last_checkpoint_step=checkpoint.step if checkpoint else None,
            work_at_risk_s=max(0.0, now.wall - boundary) if boundary is not None else None,
            saves_completed=self.saves_completed_total, saves_failed=self.saves_failed_total,
            saves_missed=self.saves_missed_total, trainers=len(self.trainers),
            deadline_pending=self.deadline_pending,
            requested_save_kind=request.kind if request else None,
            saving_step=max(request.begun.values()) if request and request.begun else None,
            stop_reason=self.stop.reason if self.stop else None,
            durable_step=self.durable_checkpoint.step if self.durable_checkpoint else None,
            uploading_step=self.upload.checkpoint.step if self.upload else None,
            uploads_completed=self.uploads_completed_total, uploads_failed=self.uploads_failed_total,
            **_lateness(self.obs),
        )


def checkpoint_path(paths: list[str]) -> str:
    """The one path a checkpoint was written to; for several (ranks writing apart), the directory
    that holds them all; "" when the trainer named none."""
    named = sorted({p for p in paths if p})
    if len(named) <= 1:
        return named[0] if named else ""
    try:
        return posixpath.commonpath(named)
    except ValueError:  # absolute and relative paths mixed
        return named[0]


def upload_retry_wait_s(failed_attempt: int) -> float:
    """The wait after the failed attempt `failed_attempt` (1, 2, ...): 5 s, 30 s, then doubling up
    to UPLOAD_RETRY_MAX_S."""
    if failed_attempt <= len(UPLOAD_RETRY_S):
        return UPLOAD_RETRY_S[failed_attempt - 1]
    return min(UPLOAD_RETRY_MAX_S, UPLOAD_RETRY_S[-1] * 2.0 ** (failed_attempt - len(UPLOAD_RETRY_S)))


def _lateness(obs: Observations) -> dict[str, float | None]:
    """The snapshot's lateness figures (None before anything was measured)."""
    timers, reports = obs.timer_late, obs.report_delay
    return {
        "timer_late_p99_s": _round_opt(timers.quantile_s(0.99)),
        "timer_late_max_s": _round(timers.max_s) if timers.count else None,
        "report_delay_p99_s": _round_opt(reports.quantile_s(0.99)),
        "report_delay_max_s": _round(reports.max_s) if reports.count else None,
    }


def _round_opt(value: float | None) -> float | None:
    return None if value is None else _round(value)


def _round(value: float) -> float | None:
    """Three decimals for the log; None instead of a value JSON cannot carry (NaN, inf)."""
    return round(value, 3) if math.isfinite(value) else None


def _merged(earlier: Trainer | None, hello: Hello, now: Now) -> Trainer:
    """A process may say hello more than once (a Ray driver: `esiwrap.trainer.install()` and the
    start-up hook's `ray.init`, in either order): a later hello adds to what an earlier one asked
    for, never undoes it. It saves or is signalled if either said so; the stop signal is the
    latest one named, and so is the checkpoint's size."""
    if earlier is None:
        return Trainer(pid=hello.pid, rank=hello.rank, saves=hello.saves, signal=hello.wants_signal,
                       stop_signal=hello.stop_signal, attached_at=now.wall,
                       checkpoint_bytes=hello.checkpoint_bytes, sigterm_saves=hello.sigterm_saves)
    return Trainer(pid=hello.pid, rank=hello.rank, saves=earlier.saves or hello.saves,
                   signal=earlier.signal or hello.wants_signal,
                   stop_signal=hello.stop_signal or earlier.stop_signal, attached_at=earlier.attached_at,
                   checkpoint_bytes=hello.checkpoint_bytes or earlier.checkpoint_bytes,
                   sigterm_saves=earlier.sigterm_saves or hello.sigterm_saves)
