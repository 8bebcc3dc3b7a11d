"""The decision core: what the supervisor does, as a pure state machine.

Events go in with the time (`Now`: the wall clock for deadlines, the monotonic clock for waits),
actions come out (signal these PIDs, stop the child, log this, exit). Nothing here does I/O or
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
from esiwrap.deadline.value import Deadline, iso_utc
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_FAILURE, EXIT_NOT_UPLOADED, EXIT_SAVE_MISSED
from esiwrap.policy import (
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
    upload_estimate_s,
)
from esiwrap.snapshot import Snapshot

KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the tree to vanish
STOP_TIMEOUT_MARGIN_S = 5.0  # asked of systemd on top of our own stop timeline
DEADLINE_CHANGE_S = 1.0  # smaller moves are the same deadline said twice
SAVE_WRITE_GRACE_FACTOR = 3.0  # a save being written may run this many estimates before it is cut off
UPLOAD_TERM_GRACE_S = 2.0  # an upload cut off gets SIGTERM, then SIGKILL this much later
UPLOAD_EXIT_MARGIN_S = 1.0  # ...and esiwrap is gone this much before the deadline
UPLOAD_ATTEMPTS = 3  # a failed upload of the newest checkpoint is tried again, this many times in all
UPLOAD_RETRY_S = (5.0, 30.0)  # the waits before the second and the third attempt


# Events and actions are NamedTuples: as light to make as a tuple, and cheap to define (esiwrap's
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
    local_checkpoints_survive: bool = False  # no checkpoint_not_durable warning for a local disk

    @property
    def uploads(self) -> bool:
        """`--upload` is set: a checkpoint is durable once its upload completed."""
        return self.policy.uploads


@dataclass(frozen=True)
class Checkpoint:
    """A completed checkpoint: the step it holds, where the trainer wrote it, when (wall)."""

    step: int
    path: str
    at: float


# ---------------------------------------------------------------------------------- events
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


class TrainerGone(NamedTuple):
    """A trainer said bye, or its process exited."""

    pid: int


class Step(NamedTuple):
    pid: int
    step: int
    duration_s: float


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
    name: str  # "SIGTERM"


class ChildExited(NamedTuple):
    pid: int
    code: int | None  # None when killed by a signal
    signal: str | None = None
    signum: int = 0


class TreeChecked(NamedTuple):
    """While stopping, after every wake-up: how many processes of the child's tree are left."""

    remaining: int


Event = (
    ChildStarted | Hello | TrainerGone | Step | SaveBegin | SaveSnapshot | SaveEnd | DeadlineAnswers
    | SignalReceived
    | ChildExited | TreeChecked | TrainingStart | UploadStarted | UploadExited | FilesystemChecked
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


class Log(NamedTuple):
    level: LogLevel
    event: str
    fields: Mapping[str, Any]


class NotifyStopping:
    """Tell the service manager we are on our way out."""


class ExtendStopTimeout(NamedTuple):
    seconds: float


class Exit(NamedTuple):
    code: int
    reason: str


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


TRAINER_REPORTS = (Step, SaveBegin, SaveSnapshot, SaveEnd, TrainingStart)

Action = (
    SendSignal | StopChild | KillTree | TermLeftovers | Log | NotifyStopping | ExtendStopTimeout | Exit
    | StartUpload | StopUpload | CheckFilesystem
)


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
    """Events in, actions out. Every public method returns the actions to carry out, in order."""

    def __init__(self, config: ControllerConfig, prior: Prior | None = None,
                 resume_from: Checkpoint | None = None) -> None:
        self.config = config
        self.mode = Mode.RUNNING
        self.obs = Observations(config.policy.step_window, prior)
        self.deadline: Deadline | None = None
        self.deadline_pending = True  # no deadline answer handed over yet
        self._known: dict[str, Deadline] = {}
        self._unavailable: dict[str, str] = {}
        self.trainers: dict[int, Trainer] = {}
        self.child_pid: int | None = None
        self.child_status: int | None = None  # esiwrap's exit status for the child's end
        self.request: SaveRequest | None = None
        self.plan: SavePlan | None = None
        self._logged_signal_at: float | None = None
        self._warned_too_close = False
        self.saves_done = 0  # acknowledged saves against the current deadline
        self.any_save_completed = False
        self.last_saved_step: int | None = None
        self._ack_until: float | None = None  # monotonic, while DRAINING
        self._sigints = 0
        self.stop: StopState | None = None
        self._exited = False
        self._out: list[Action] = []
        self._budget_warned_s = 0.0  # the stop needed this long when --stop-budget was last warned
        self.saves_completed = self.saves_failed = self.saves_missed = 0  # for the metrics
        self.last_checkpoint_at: float | None = None  # wall time the last completed save ended
        self.last_checkpoint: Checkpoint | None = None
        # The newest checkpoint that outlives the instance, as far as esiwrap knows: with --upload,
        # the last one uploaded; without, the last one completed (its filesystem is the user's call).
        self.durable_checkpoint: Checkpoint | None = None
        self.upload: UploadRun | None = None  # running
        self.upload_waiting: Checkpoint | None = None  # completed while another upload ran
        self._upload_retry: tuple[Checkpoint, int, float] | None = None  # checkpoint, attempt, mono
        self._upload_until: float | None = None  # monotonic, while UPLOADING: the cut-off, then the kill
        self._upload_exit_reason = ""
        self._upload_killed = False
        self.uploads_completed = self.uploads_failed = 0
        self._filesystem_asked = False
        self._plan_awaits_upload = False  # no further save fits while this upload runs: decide at its end
        self.resume_from = resume_from  # the durable checkpoint an earlier run recorded (state file)
        self._resume_checked = False

    # ------------------------------------------------------------------ the two entry points
    def handle(self, event: Event, now: Now) -> list[Action]:
        """React to one event, then fire whatever timer it made due."""
        if isinstance(event, TRAINER_REPORTS) and not self._attached(event.pid):
            return self._take()  # only a trainer that said hello reports steps and saves
        handler = getattr(self, "_on_" + _snake(type(event).__name__))
        handler(event, now)
        self._fire_timers(now)
        return self._take()

    def tick(self, now: Now) -> list[Action]:
        """The loop woke up (a timer, or anything else): fire the timers that are due."""
        self._fire_timers(now)
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
        if self._upload_retry is not None and now.mono >= self._upload_retry[2]:
            self._retry_upload(now)
            return
        if self.mode is Mode.UPLOADING:
            self._upload_timer(now)
        elif self.mode is Mode.CONTINUING:
            self._begin_stop("checkpoint complete", EXIT_CHECKPOINTED, now)
        elif self.mode is Mode.DRAINING:
            if self._ack_until is not None and now.mono >= self._ack_until:
                self._ack_wait_over(now)
        elif self.mode in (Mode.STOPPING, Mode.KILLING):
            self._stop_timer(now)
        elif self.mode in (Mode.RUNNING, Mode.SAVE_REQUESTED) and self.deadline is not None:
            unattached = self._unattached_stop_at()
            if now.wall >= self.deadline.at:
                self._deadline_reached(now)
            elif unattached is not None and now.wall >= unattached:
                self._begin_stop("no trainer attached to save", EXIT_SAVE_MISSED, now)
            elif self.mode is Mode.RUNNING and self.plan is not None and now.wall >= self.plan.signal_at:
                self._request_save("deadline", now)
            elif self.mode is Mode.RUNNING and self._plan_awaits_upload:
                self._plan_awaits_upload = False
                self._no_further_save(now)

    def _take(self) -> list[Action]:
        actions, self._out = self._out, []
        return actions

    def _log(self, level: LogLevel, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    # ------------------------------------------------------------------ child and trainers
    def _on_child_started(self, event: ChildStarted, now: Now) -> None:
        self.child_pid = event.pid
        settings = {"settings": dict(event.settings)} if event.settings else {}
        host = {"host": event.host} if event.host else {}
        self._log("info", ev.CHILD_STARTED, pid=event.pid, argv=list(event.argv), **host, **settings)

    def _on_hello(self, event: Hello, now: Now) -> None:
        if event.wants_signal and not event.descendant:
            # we only ever signal our own tree; relayed processes say signal=false
            self._log("warning", ev.TRAINER_REJECTED, pid=event.pid, reason="not a descendant of esiwrap")
            return
        self.trainers[event.pid] = Trainer(
            pid=event.pid, rank=event.rank, saves=event.saves, signal=event.wants_signal,
            stop_signal=event.stop_signal, attached_at=now.wall,
        )
        self._log("info", ev.TRAINER_ATTACHED, pid=event.pid, **event.fields)
        self.obs.trainer_started(now.wall)
        self._check_stop_budget()
        request = self.request
        if request is not None and not self.config.signal_child and event.wants_signal \
                and event.pid not in request.signalled:
            self._signal([event.pid])  # a save is due: this trainer joins it at once
        self._replan(now)

    def _attached(self, pid: int) -> bool:
        """Said hello; with --signal-child the direct child needs not (it handles the signal itself)."""
        return pid in self.trainers or (self.config.signal_child and pid == self.child_pid)

    def _on_trainer_gone(self, event: TrainerGone, now: Now) -> None:
        if self.trainers.pop(event.pid, None) is not None and self.request is not None:
            self._check_acknowledged(self.request, now)  # it may have been the last one to wait for

    def _on_child_exited(self, event: ChildExited, now: Now) -> None:
        self.child_status = event.code if event.code is not None else 128 + event.signum
        fields: dict[str, Any] = {"pid": event.pid, "code": event.code, "signal": event.signal}
        if event.signal == "SIGKILL" and self.stop is None:
            fields["hint"] = "killed by SIGKILL: out of memory?"
        self._log("info", ev.CHILD_EXITED, **fields)
        self.trainers.pop(event.pid, None)
        if self.stop is None:
            self._begin_stop("child exited", None, now)

    def _on_tree_checked(self, event: TreeChecked, now: Now) -> None:
        stop = self.stop
        if stop is None or self.child_status is None:
            return
        if event.remaining == 0:
            self._exit(stop.reason, now)
        elif not stop.leftovers_signalled:
            stop.leftovers_signalled = True
            self._out.append(TermLeftovers())

    # ------------------------------------------------------------------ trainer messages
    def _on_step(self, event: Step, now: Now) -> None:
        if event.pid != self._timing_pid():
            return
        first = self.obs.last_step is None
        interval = self.obs.record_step(event.step, event.duration_s, now.wall)
        self._log("debug", ev.STEP_OBSERVED, step=event.step, duration_s=_round(interval))
        if first:  # the first boundary after a start from step s is s + 1
            self._check_resume(max(0, event.step - 1), NO_FIELDS, now)
        self._check_stop_budget()
        self._replan(now)

    def _adopt_peer_request(self, event: SaveBegin | SaveSnapshot | SaveEnd, now: Now) -> None:
        """A save another node's esiwrap asked for (the ranks agreed on it in their all-reduce) is
        this node's save too: the job ends after it on every node, so it becomes this node's
        request, and esiwrap stops after it."""
        if not event.peer or self.request is not None or self.stop is not None:
            return
        self.request = SaveRequest(reason="peer", kind="peer", requested_at=now.wall, signalled={event.pid})
        if self.mode is Mode.RUNNING:
            self.mode = Mode.SAVE_REQUESTED
        self._log("info", ev.SAVE_REQUESTED, reason="peer", kind="peer", pids=[],
                  remaining_s=self._remaining(now))

    def _on_save_begin(self, event: SaveBegin, now: Now) -> None:
        self._adopt_peer_request(event, now)
        request = self.request
        if request is None:
            self._log("info", ev.SAVE_STARTED, step=event.step, pid=event.pid, requested=False)
            return
        first = not request.begun
        request.begun[event.pid] = event.step
        if first:
            request.save_started_mono, request.save_started_at = now.mono, now.wall
            self._log("info", ev.SAVE_STARTED, step=event.step, pid=event.pid, requested=True)

    def _on_save_snapshot(self, event: SaveSnapshot, now: Now) -> None:
        self._adopt_peer_request(event, now)
        request = self.request
        if request is None or event.pid in request.snapshots:
            return  # the trainer's own asynchronous save: its end is what counts
        first = not request.snapshots
        request.snapshots[event.pid] = event
        if first:  # training resumes now, while the write goes on
            self.obs.record_blocking(event.duration_s, now.wall)

    def _on_save_end(self, event: SaveEnd, now: Now) -> None:
        if not event.ok:
            self.saves_failed += 1
            self._log("error", ev.SAVE_FAILED, step=event.step, pid=event.pid, error=event.error)
            return  # the trainer keeps its flag and tries again at the next boundary
        self._adopt_peer_request(event, now)
        request = self.request
        if request is None:
            self.obs.record_save(event.duration_s, now.wall)
            self._save_completed_log(event.step, [event], now, requested=False)
            self.last_saved_step = event.step
            self.any_save_completed = True  # the trainer's own checkpoint is one too
            self._checkpoint_completed(event.step, [event], now)
            self._replan(now)
            return
        request.done[event.pid] = event
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
        self.any_save_completed = True
        self.request = None
        step = max(m.step for m in messages)
        self.last_saved_step = step
        self._save_completed_log(step, messages, now, requested=True, kind=request.kind)
        self._checkpoint_completed(step, messages, now)
        if self.mode is Mode.DRAINING:
            self._ack_until = None
            self._begin_stop(f"checkpoint complete after {request.reason}", EXIT_CHECKPOINTED, now)
            return
        if request.reason == "peer":  # the node that asked stops its ranks: the job ends here too
            self._begin_stop("checkpoint complete after a peer node's request", EXIT_CHECKPOINTED, now)
            return
        if self.mode is Mode.SAVE_REQUESTED:
            self.mode = Mode.RUNNING
        if request.reason == "manual":
            return  # a save by hand changes nothing in the plan
        if request.kind in ("insurance", "final"):
            self.saves_done += 1
        self.plan = None
        self._logged_signal_at = None  # the next plan is a new save: always log it
        self._replan(now)

    def _save_completed_log(
        self, step: int, messages: list[SaveEnd], now: Now, *, requested: bool, kind: str = ""
    ) -> None:
        self.saves_completed += 1
        self.last_checkpoint_at = now.wall
        self._check_stop_budget()
        paths = sorted({m.path for m in messages if m.path})
        self._log(
            "info", ev.SAVE_COMPLETED, step=step, requested=requested, kind=kind or None,
            duration_s=_round(max(m.duration_s for m in messages)),
            path=paths[0] if len(paths) == 1 else (paths or None),
            remaining_s=self._remaining(now),
        )

    # ------------------------------------------------------------------ durability and uploads
    def _checkpoint_completed(self, step: int, messages: list[SaveEnd], now: Now) -> None:
        """A checkpoint is complete on the trainer's storage: upload it, or look at what holds it."""
        checkpoint = Checkpoint(step, checkpoint_path([m.path for m in messages]), now.wall)
        self.last_checkpoint = checkpoint
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
            self._log("info", ev.UPLOAD_SKIPPED, step=older.step, path=older.path, superseded_by=step,
                      reason="a newer checkpoint completed while an upload was running")
        self.upload_waiting = checkpoint

    def _on_filesystem_checked(self, event: FilesystemChecked, now: Now) -> None:
        if event.kind != "local" or self.config.uploads:
            return  # only a local disk is known to go with the instance
        self._log("warning", ev.CHECKPOINT_NOT_DURABLE, path=event.path, filesystem=event.fstype,
                  mount_point=event.mount_point, device=event.source,
                  fix="the checkpoint is on this machine's local disk and goes with the instance: "
                  "write checkpoints to storage that outlives it (a network or cluster filesystem), or "
                  "copy each one with --upload CMD (e.g. --upload 'aws s3 cp --recursive {path} "
                  "s3://BUCKET/job/{step}/'); if this disk survives, --local-checkpoints-survive")

    def _start_upload(self, checkpoint: Checkpoint, attempt: int, now: Now) -> None:
        self.upload = UploadRun(checkpoint, attempt, now.wall, now.mono)
        self.obs.upload_began(now.wall)
        self._out.append(StartUpload(checkpoint.step, checkpoint.path, attempt))

    def _on_upload_started(self, event: UploadStarted, now: Now) -> None:
        run = self.upload
        if run is None:
            return
        run.pid = event.pid
        self._log("info", ev.UPLOAD_STARTED, step=run.checkpoint.step, path=run.checkpoint.path,
                  pid=event.pid, attempt=run.attempt,
                  upload_estimate_s=_round(upload_estimate_s(self.obs, self.config.policy)),
                  remaining_s=self._remaining(now))

    def _on_upload_exited(self, event: UploadExited, now: Now) -> None:
        run = self.upload
        if run is None or (run.pid is not None and event.pid != run.pid):
            return
        self.upload = None
        duration = max(0.0, now.mono - run.started_mono)
        checkpoint = run.checkpoint
        if event.code == 0 and not event.error:
            self.obs.upload_ended(duration)
            self.uploads_completed += 1
            if self.durable_checkpoint is None or checkpoint.step >= self.durable_checkpoint.step:
                self.durable_checkpoint = checkpoint
            self._log("info", ev.UPLOAD_COMPLETED, step=checkpoint.step, path=checkpoint.path,
                      duration_s=_round(duration), attempt=run.attempt, remaining_s=self._remaining(now))
        else:
            self.obs.upload_ended(None)
            self.uploads_failed += 1
            fields: dict[str, Any] = {"code": event.code, "signal": event.signal}
            if event.error:
                fields["error"] = event.error
            if run.cut_off:
                fields["reason"] = run.cut_off
            self._log("error", ev.UPLOAD_FAILED, step=checkpoint.step, path=checkpoint.path,
                      duration_s=_round(duration), attempt=run.attempt, stderr=list(event.stderr),
                      remaining_s=self._remaining(now), **fields)
            newest = self.upload_waiting is None and checkpoint == self.last_checkpoint
            if newest and not run.cut_off and not event.error and run.attempt < UPLOAD_ATTEMPTS \
                    and self.mode is not Mode.UPLOADING:
                wait = UPLOAD_RETRY_S[min(run.attempt, len(UPLOAD_RETRY_S)) - 1]
                self._upload_retry = (checkpoint, run.attempt + 1, now.mono + wait)
        waiting, self.upload_waiting = self.upload_waiting, None
        if waiting is not None and not (self.mode is Mode.UPLOADING and run.cut_off):
            self._start_upload(waiting, 1, now)
        if self.mode is Mode.UPLOADING:
            self._uploads_settled(now)
        else:
            self._plan_awaits_upload = False
            self._replan(now)  # the upload is measured, and the next one need not wait for it

    def _retry_upload(self, now: Now) -> None:
        retry, self._upload_retry = self._upload_retry, None
        if retry is not None and self.upload is None:
            self._start_upload(retry[0], retry[1], now)

    def _upload_outstanding(self) -> bool:
        return self.upload is not None or self.upload_waiting is not None or self._upload_retry is not None

    def _await_upload(self, reason: str, now: Now) -> None:
        """The child's tree is gone, but the last checkpoint's upload is not done: wait for it, up
        to the moment it must be cut off to exit before the deadline (without a deadline: up to
        --stop-grace or three upload estimates, whichever is longer)."""
        self.mode = Mode.UPLOADING
        self._upload_exit_reason = reason
        retry, self._upload_retry = self._upload_retry, None
        if self.upload is None and retry is not None:
            self._start_upload(retry[0], retry[1], now)  # no time to wait for the retry's turn
        run = self.upload
        assert run is not None
        estimate = upload_estimate_s(self.obs, self.config.policy)
        until = run.started_mono + max(self.config.stop_grace_s, SAVE_WRITE_GRACE_FACTOR * estimate)
        if self.deadline is not None:  # never past the moment it must be cut off to exit in time
            latest = self.deadline.at - UPLOAD_TERM_GRACE_S - UPLOAD_EXIT_MARGIN_S
            until = min(until, now.mono + latest - now.wall)
        self._upload_until = max(until, now.mono)
        self._out.append(ExtendStopTimeout(self._upload_until - now.mono + UPLOAD_TERM_GRACE_S
                                           + KILL_WAIT_S + STOP_TIMEOUT_MARGIN_S))

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
        if self.upload is None:
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
    def _on_training_start(self, event: TrainingStart, now: Now) -> None:
        self._check_resume(max(0, event.step), event.fields, now)

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
                 "path": checkpoint.path or None, "checkpoint_at": iso_utc(checkpoint.at)}
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
    def _on_signal_received(self, event: SignalReceived, now: Now) -> None:
        handler = getattr(self, "_handle_" + event.name.lower(), None)
        if handler is not None:
            handler(now)
        else:
            self._forward(event.name)

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

    def _handle_sigchld(self, now: Now) -> None:
        """Reaping is the shell's; it reports what it found as ChildExited."""

    def _forward(self, name: str) -> None:
        if self.child_pid is not None and self.child_status is None:
            self._out.append(SendSignal((self.child_pid,), name))

    # ------------------------------------------------------------------ deadline
    def _on_deadline_answers(self, event: DeadlineAnswers, now: Now) -> None:
        self.deadline_pending = False
        for answer in event.answers:
            if answer.withdrawn:  # a node that left the cluster: its deadline no longer counts
                known = self._known.pop(answer.source, None)
                if known is not None or self._unavailable.pop(answer.source, None) is not None:
                    self._log("info", ev.DEADLINE_WITHDRAWN, source=answer.source, reason=answer.reason)
            elif answer.deadline is not None:
                self._known[answer.source] = answer.deadline
                self._unavailable.pop(answer.source, None)
            elif self._unavailable.get(answer.source) != answer.reason:
                self._unavailable[answer.source] = answer.reason
                level: LogLevel = "info" if answer.expected else "warning"
                self._log(level, ev.DEADLINE_UNAVAILABLE, source=answer.source, reason=answer.reason)
        new = winner(Answer(d.source, deadline=d) for d in self._known.values())
        if new is not None:
            self._set_deadline(new, now)

    def _set_deadline(self, new: Deadline, now: Now) -> None:
        old = self.deadline
        if old is not None and abs(old.at - new.at) < DEADLINE_CHANGE_S:
            return
        self.deadline = new
        if old is None:
            self._log("info", ev.DEADLINE_RESOLVED, source=new.source, deadline=new.iso(),
                      remaining_s=_round(new.at - now.wall), raw=new.raw, lead_s=new.lead_s, **new.detail)
        else:
            self._log("warning", ev.DEADLINE_CHANGED, old=old.iso(), new=new.iso(), source=new.source,
                      remaining_s=_round(new.at - now.wall), raw=new.raw, **new.detail)
        later = old is None or new.at > old.at
        if self.mode is Mode.CONTINUING and later:
            self.mode, self.saves_done = Mode.RUNNING, 0  # a renewal: plan against it afresh
        elif old is not None and later and self._renewal_fits_insurance(new.at, now):
            self.saves_done, self.plan = 0, None  # renewed after a save: insure the new stretch too
            self._warned_too_close = False
        if new.at <= now.wall and self.mode in (Mode.RUNNING, Mode.SAVE_REQUESTED):
            self._deadline_already_passed(now)
            return
        self._replan(now)

    def _renewal_fits_insurance(self, deadline: float, now: Now) -> bool:
        """A later deadline while running, after a save: is there room for a new insurance save?"""
        if self.mode is not Mode.RUNNING or self.saves_done == 0:
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
        if self.any_save_completed:
            self._begin_stop("deadline reached", EXIT_CHECKPOINTED, now)
            return
        self.saves_missed += 1
        self._log("error", ev.SAVE_MISSED, remaining_s=self._remaining(now))
        self._begin_stop("deadline passed without an acknowledged save", EXIT_SAVE_MISSED, now)

    # ------------------------------------------------------------------ planning
    def _replan(self, now: Now) -> None:
        if self.mode is not Mode.RUNNING or self.deadline is None:
            return
        plan = replan(self.deadline.at, self.obs, self.config.policy, self.saves_done, self.plan, now.wall)
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
                why=plan.why,
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
        self.request = SaveRequest(reason=reason, kind=kind, requested_at=now.wall)
        if self.mode is Mode.RUNNING:  # a save by hand while continuing keeps continuing
            self.mode = Mode.SAVE_REQUESTED
        planned = {} if plan is None else {  # the plan as it stood when it fired (for `esiwrap report`)
            "planned_at": iso_utc(plan.signal_at), "step_estimate_s": _round(plan.step_estimate_s),
            "save_estimate_s": _round(plan.save_estimate_s), "why": plan.why,
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
        return self.last_saved_step is not None and self.last_saved_step >= (self.obs.last_step or 0)

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
        self.saves_missed += 1
        self._log("warning", ev.SAVE_MISSED, remaining_s=self._remaining(now),
                  reason="no acknowledgement within --stop-grace")
        if self._progress_is_saved():
            self._begin_stop("stop requested, latest step already saved", EXIT_CHECKPOINTED, now)
        elif self.deadline is not None and now.wall >= self.deadline.at:
            self._begin_stop("deadline passed without an acknowledged save", EXIT_SAVE_MISSED, now)
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
                self.upload.cut_off = self.upload.cut_off or f"cut off: {reason}"
                self._out.append(StopUpload("SIGKILL"))
                self._upload_killed = True
                self._upload_until = now.mono + KILL_WAIT_S
            return
        self.mode = Mode.STOPPING
        self.plan = None
        self._ack_until = None
        self.stop = StopState(reason, exit_status, until=now.mono + self.config.stop_grace_s)
        self._out.append(NotifyStopping())
        self._extend_stop_timeout(now)
        if self.child_status is not None:
            return  # the child is gone already: the tree check decides when we are done
        if immediate:
            self._out.append(StopChild(None))
            self._kill(now)
            return
        signal = self._stop_signal()
        self._log("info", ev.CHILD_STOPPING, signal=signal, grace_s=self.config.stop_grace_s, reason=reason)
        self._out.append(StopChild(signal))

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
        deadline = self.deadline
        checkpoint = self.obs.checkpoint_at  # the boundary the last checkpoint holds (or the start)
        return Snapshot(
            time=now.wall, run_id=run_id, pid=pid, child_pid=self.child_pid, phase=self.mode.value,
            deadline_at=deadline.at if deadline else None,
            deadline_source=deadline.source if deadline else None,
            next_save_at=plan.nominal_at if plan else None, next_save_kind=plan.kind if plan else None,
            next_save_reason=plan.why if plan else None, step_estimate_s=self.current_step_estimate_s(),
            save_estimate_s=plan.save_estimate_s if plan else save_estimate_s(self.obs, self.config.policy),
            last_step=self.obs.last_step, last_checkpoint_at=self.last_checkpoint_at,
            last_checkpoint_step=self.last_saved_step,
            work_at_risk_s=max(0.0, now.wall - checkpoint) if checkpoint is not None else None,
            saves_completed=self.saves_completed, saves_failed=self.saves_failed,
            saves_missed=self.saves_missed, trainers=len(self.trainers),
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


def _round(value: float) -> float | None:
    """Three decimals for the log; None instead of a value JSON cannot carry (NaN, inf)."""
    return round(value, 3) if math.isfinite(value) else None


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
