"""The thin `Controller`: each input goes to the part that owns it; the controller decides what
follows, across parts; then the timers that fell due fire.

Inputs go in with the time (`Now`: the wall clock for deadlines, the monotonic clock for waits),
actions come out (signal these PIDs, stop the child, log this, keep the job's state, exit). The
parts keep their own state and never call one another: the deadline book (`deadlines`), the trainer
roster (`roster`), the save cycle (`saves`, with `misses` for why one was missed), the plan
(`planning`), verification (`verifying`), uploads and durability (`uploads`), the way back before the
command starts (`restoring`), the stop sequence and the drain (`stopping`), the storage probe
(`probe`) and the advice for people (`advisories`). The mode changes only by a move of
the one table in `modes`; each part names its timers (`timers`), and one order says which fires.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from esiwrap import events as ev
from esiwrap.choices import LogLevel
from esiwrap.core.controller.advisories import Advisories
from esiwrap.core.controller.clock import ClockCheck
from esiwrap.core.controller.deadlines import DeadlineBook
from esiwrap.core.controller.job import Job, Measured, Progress
from esiwrap.core.controller.misses import miss_facts, never_came
from esiwrap.core.controller.modes import Mode, Modes
from esiwrap.core.controller.outbox import Outbox, rounded, rounded_opt
from esiwrap.core.controller.planning import Planner
from esiwrap.core.controller.probe import StorageProbe
from esiwrap.core.controller.protocol import (
    LAUNCHER_EXIT_S,
    NEVER_BEGUN,
    NO_FIELDS,
    NOT_ATTACHED,
    NOT_IN_TREE,
    SAID_BYE,
    TRAINER_REPORTS,
    Action,
    CheckpointLooked,
    CheckpointSize,
    CheckpointVerified,
    CheckTree,
    ChildExited,
    ChildStarted,
    ControllerConfig,
    DeadlineAnswers,
    Exit,
    FilesystemChecked,
    Hello,
    Input,
    KeepState,
    Launch,
    ManifestsFetched,
    NotifyStopping,
    Now,
    RefuseMessage,
    ReleaseCapacity,
    ResolveDeadline,
    RestoreExited,
    RestoreStarted,
    SaveBegin,
    SaveEnd,
    SaveSnapshot,
    SendSignal,
    SignalReceived,
    StartCommand,
    Step,
    StopCause,
    StopChild,
    StorageProbed,
    TrainerGone,
    TrainerLeft,
    TrainingStart,
    TreeChecked,
    UploadExited,
    UploadStarted,
    WriteManifest,
)
from esiwrap.core.controller.restoring import Outcome, Restoring
from esiwrap.core.controller.roster import Roster, Trainer, second_stop_signal
from esiwrap.core.controller.saves import SaveCycle, SaveRequest
from esiwrap.core.controller.stopping import StopSequence, StopState
from esiwrap.core.controller.timers import Timer, TimerName, first_due, wait_s
from esiwrap.core.controller.uploads import Uploads
from esiwrap.core.controller.verifying import Verdict, Verifications
from esiwrap.core.manifest import Manifest
from esiwrap.core.policy import (
    Observations,
    Prior,
    SavePlan,
    renewal_reopens_insurance,
    save_estimate_s,
    step_estimate_s,
)
from esiwrap.core.snapshot import Snapshot
from esiwrap.core.state import JobState
from esiwrap.core.values import Checkpoint, Deadline
from esiwrap.errors import (
    EXIT_CHECKPOINTED,
    EXIT_NO_PROGRESS,
    EXIT_NOT_RESTORED,
    EXIT_NOT_UPLOADED,
    EXIT_SAVE_MISSED,
)

MAX_FIRINGS = 8  # timers fired per wake-up: each firing changes the state; this only guards a bug


class Controller:
    """Inputs in, actions out. `handle`, `tick` and `finish` return the actions to carry out, in
    order; `wake_at` and `snapshot` only tell."""

    def __init__(self, config: ControllerConfig, prior: Prior | None = None,
                 resume_from: Checkpoint | None = None, job: Job | None = None) -> None:
        """`job`: this run's place in its job (the state file it found); its prior and checkpoint
        are the ones planned with and checked. Without one: `prior` and `resume_from`, if any."""
        self.config = config
        self.job = job if job is not None else Job(None, 0.0)
        if job is not None:
            prior, resume_from = job.prior, job.resume_from
        self.out = Outbox()
        self.obs = Observations(config.policy.step_window, prior)
        self.modes = Modes()
        self.book = DeadlineBook(self.out)
        self.roster = Roster(config.signal_child)
        self.saves = SaveCycle(self.out, self.obs)
        self.planner = Planner(self.out, self.obs, config.policy, config.stop_grace_s, config.after_save)
        self.uploads = Uploads(self.out, self.obs, config)
        self.verifying = Verifications(self.out, self.obs, config)
        self.restoring = Restoring(self.out, self.obs, config)
        self.stopping = StopSequence(self.out, config.stop_grace_s)
        self.probe = StorageProbe(self.out, self.obs, config.probe_storage, config.probe_dir)
        self.advisories = Advisories(self.out, config.stop_budget_s, resume_from)
        self.clock = ClockCheck(self.out)
        self._sigints = 0
        self._last_report_mono: float | None = None  # the last step report, on the monotonic clock
        self._routes: Mapping[type, Callable[[Any, Now], None]] = {
            Launch: self._on_launch, ChildStarted: self._on_child_started, Hello: self._on_hello,
            CheckpointSize: self._on_checkpoint_size, StorageProbed: self._on_storage_probed,
            TrainerGone: self._on_trainer_gone, TrainerLeft: self._on_trainer_left, Step: self._on_step,
            SaveBegin: self._on_save_begin, SaveSnapshot: self._on_save_snapshot, SaveEnd: self._on_save_end,
            DeadlineAnswers: self._on_deadline_answers, SignalReceived: self._on_signal_received,
            ChildExited: self._on_child_exited, TreeChecked: self._on_tree_checked,
            TrainingStart: self._on_training_start, UploadStarted: self._on_upload_started,
            UploadExited: self._on_upload_exited, FilesystemChecked: self._on_filesystem_checked,
            CheckpointVerified: self._on_checkpoint_verified, CheckpointLooked: self._on_checkpoint_looked,
            ManifestsFetched: self._on_manifests_fetched, RestoreStarted: self._on_restore_started,
            RestoreExited: self._on_restore_exited,
        }
        self._timer_handlers: Mapping[TimerName, Callable[[Now], None]] = {
            "upload retry": self._on_upload_retry, "upload cut-off": self._on_upload_cut_off,
            "linger": self._on_linger, "ack wait": self._on_ack_wait, "stop": self._on_stop,
            "child stop": self._on_child_stop,
            "deadline": self._on_deadline, "unattached stop": self._on_unattached_stop,
            "save signal": self._on_save_signal, "storage probe": self._on_storage_probe,
            "upload decision": self._on_upload_decision, "heartbeat": self._on_heartbeat,
            "overstay": self._on_overstay,
            "verify cut-off": self._on_verify_cut_off, "restore cut-off": self._on_restore_cut_off,
            "restore retry": self._on_restore_retry,
        }

    # ------------------------------------------------------------------ what others read
    @property
    def mode(self) -> Mode:
        return self.modes.mode

    @property
    def deadline(self) -> Deadline | None:
        return self.book.deadline

    @property
    def plan(self) -> SavePlan | None:
        return self.planner.plan

    @property
    def request(self) -> SaveRequest | None:
        return self.saves.request

    @property
    def stop(self) -> StopState | None:
        return self.stopping.stop

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        return self.saves.last_checkpoint

    @property
    def trainers(self) -> Mapping[int, Trainer]:
        return self.roster.trainers

    @property
    def deadline_saves_done(self) -> int:
        return self.planner.saves_done

    # ------------------------------------------------------------------ the entry points
    def handle(self, input_: Input, now: Now) -> list[Action]:
        """React to one input; the timers it made due fire at the next `tick` (`esiwrap.core.runner`:
        every input that was waiting when the loop woke is applied before a timer decides).
        Anything that is not an `Input` is the caller's bug: TypeError at once."""
        self._check_clock(now)
        if isinstance(input_, TRAINER_REPORTS) and not self.roster.attached(input_.pid):
            self.out.act(RefuseMessage(input_, NOT_ATTACHED))  # only a trainer that said hello reports
            return self.out.take()
        self._route(input_, now)
        return self.out.take()

    def _route(self, input_: Input, now: Now) -> None:
        handler = self._routes.get(type(input_))
        if handler is None:
            msg = f"not an input of the controller: {input_!r}"
            raise TypeError(msg)
        handler(input_, now)

    def tick(self, now: Now, late_s: float | None = None) -> list[Action]:
        """The loop woke up (a timer, or anything else): fire the timers that are due; while
        stopping, ask for the child's tree to be checked. `late_s`: how long after the wake-up the
        loop asked for (`wake_at`) it got to run, when it slept until then; plans keep it as margin."""
        self._check_clock(now)
        if late_s is not None:
            self.obs.timer_late.record(late_s)
        self._fire_timers(now)
        if self.mode in (Mode.STOPPING, Mode.KILLING):
            self.out.act(CheckTree())
        return self.out.take()

    def finish(self, now: Now) -> list[Action]:
        """The shell is leaving (after `Exit`, or on a failure of its own): what must still be
        carried out. The job's state, with this run's ending (a failure of the shell's own when the
        controller said none), when there is a state file or anything was measured."""
        self.job.left()
        if self.config.state_file is not None or self.obs.saves or self.obs.last_step is not None:
            self._keep_state(now)
        return self.out.take()

    def wake_at(self, now: Now) -> float | None:
        """Seconds from `now` until a timer of the current mode is due (0: due now), or None."""
        return wait_s(self._timers(), now)

    def snapshot(self, now: Now, run_id: str, pid: int) -> Snapshot:
        """What esiwrap knows now, as one value: the metrics, the status file, `esiwrap status`."""
        return Snapshot(
            time=now.wall, run_id=run_id, pid=pid, phase=self.mode.value,
            step_estimate_s=self.current_step_estimate_s(), last_step=self.obs.last_step,
            **self.roster.view(), **self.book.view(), **self.planner.view(self.mode), **self.saves.view(now),
            **self.stopping.view(), **self.uploads.view(), **lateness(self.obs),
        )

    def current_step_estimate_s(self) -> float | None:
        return step_estimate_s(self.obs, self.config.policy)

    # ------------------------------------------------------------------ timers
    def _timers(self) -> list[Timer]:
        mode, deadline = self.mode, self.book.deadline
        restoring = self.restoring.timers(deadline) if mode is Mode.STARTING else []
        exited = mode is Mode.EXITED
        return [*self.uploads.timers(exited), *self.verifying.timers(exited), *restoring,
                *self.stopping.timers(mode), *self.book.timers(mode),
                *self.saves.timers(mode, deadline, self.config.stop_grace_s, self.roster.attached_once),
                *self.planner.timers(mode, deadline), *self.probe.timers(mode, deadline),
                *self.job.timers(mode)]

    def _fire_timers(self, now: Now) -> None:
        """Fire due timers until none is: a timer's action can make another one due at once (a save
        asked for with nobody to take it, past its graceful stop)."""
        for _ in range(MAX_FIRINGS):
            timer = None if self.mode is Mode.EXITED else first_due(self._timers(), now)
            if timer is None:
                return
            self._timer_handlers[timer.name](now)

    def _on_linger(self, now: Now) -> None:
        self._begin_stop("checkpoint complete", EXIT_CHECKPOINTED, "deadline", now)

    def _on_unattached_stop(self, now: Now) -> None:
        """The attach window is over and nothing took the save signal: stop the child, gracefully
        for what is left before the deadline (--stop-grace at most), and exit 76."""
        remaining = self._remaining(now)
        grace = self.config.stop_grace_s if remaining is None else min(self.config.stop_grace_s,
                                                                       max(1.0, remaining))
        self._log("warning", ev.NO_TRAINER_ATTACHED, action="stop", grace_s=rounded(grace),
                  attached_once=self.roster.attached_once)
        self._missed("no trainer attached to save", now, level="warning", grace_s=grace)

    def _on_save_signal(self, now: Now) -> None:
        self._request_save("deadline", now)

    def _check_clock(self, now: Now) -> None:
        """The wall clock against the monotonic one since the last call (`clock`): after a jump,
        the plan is made again, and says it follows the jump."""
        jump = self.clock.check(now)
        if jump is not None and self.mode is not Mode.EXITED:
            self.planner.after_jump(jump.words())
            self._replan(now)

    def _on_overstay(self, now: Now) -> None:
        self.book.overstayed(now)
        self.out.act(ResolveDeadline("still running a minute past the deadline"))

    def _log(self, level: LogLevel, event: str, **fields: Any) -> None:
        self.out.log(level, event, **fields)

    def _remaining(self, now: Now) -> float | None:
        return self.book.remaining_s(now)

    # ------------------------------------------------------------------ the job
    def _on_launch(self, launch: Launch, now: Now) -> None:
        """Before the command starts: the job's last runs made no progress, so this one would not
        either: say why and the fix, record it, and do not start (exit 78). With `--restore`, the
        job's checkpoint comes back first, where it is not on this instance."""
        self.modes.move("launch")
        verdict = self.job.guard()
        if verdict is None:
            if not (self.config.restore and self._begin_restore(now)):
                self.modes.move("started")
            return
        self._log("error", ev.NO_PROGRESS, path=self.config.state_file,
                  limit=self.config.max_no_progress_runs, **verdict.fields())
        self.job.refused()
        self._keep_state(now)
        self.modes.move("not started")
        self.out.act(Exit(EXIT_NO_PROGRESS, f"no progress in the job's last {len(verdict.runs)} runs "
                          f"({verdict.cause}); not started (--max-no-progress-runs)"))

    def _on_heartbeat(self, now: Now) -> None:
        self.job.beating(now.mono)
        self._keep_state(now)

    def _keep_state(self, now: Now) -> None:
        """The job's state as of now: this run's measurements, its durable checkpoint, its record."""
        self.out.act(KeepState(self._state(now, self.uploads.durable, self.config.uploads)))

    def _state(self, now: Now, durable: Checkpoint | None, uploaded: bool) -> JobState:
        """The job's state as of now, with `durable` as its durable checkpoint."""
        obs, uploads = self.obs, self.uploads
        measured = Measured(tuple(obs.intervals), tuple(d for _, d in obs.saves), tuple(obs.blocking),
                            tuple(obs.uploads), durable, uploaded, tuple(obs.verifies), tuple(obs.restores))
        progress = None
        if self.roster.child_pid is not None:
            deadline = self.book.deadline
            progress = Progress(obs.capacity.nodes, obs.capacity.kind, deadline.source if deadline else "",
                                durable.step if durable else None, self.saves.completed_total,
                                uploads.completed_total, uploads.failed_total,
                                deadline.at if deadline else None)
        return self.job.state(now.wall, progress, measured)

    # ------------------------------------------------------------------ the child and its trainers
    def _on_child_started(self, started: ChildStarted, now: Now) -> None:
        self.roster.child_started(started.pid)
        host = {"host": started.host} if started.host else {}
        self._log("info", ev.CHILD_STARTED, pid=started.pid, argv=list(started.argv), **host)
        if started.settings:  # on a line of their own, the next one: every other line stays short
            self._log("info", ev.SETTINGS, settings=dict(started.settings))
        if self.config.state_file is not None:  # this run in the job's history, from its start
            self.job.beating(now.mono)
            self._keep_state(now)

    def _on_hello(self, hello: Hello, now: Now) -> None:
        if not hello.descendant:  # signalled or not, waited for or not: only our own tree speaks
            self.out.act(RefuseMessage(hello, NOT_IN_TREE))
            if hello.stop_signal is not None:
                self._stop_signal_not_honoured(
                    hello.pid, [hello.stop_signal], None,
                    "not in esiwrap's process tree: esiwrap signals only its own tree")
            return
        if self.roster.has_left(hello.pid, hello.sent_mono):
            # sent before its bye and come late (another client of the same process, kept while
            # esiwrap's queue was full): the process ignores the save signal
            self.out.act(RefuseMessage(hello, SAID_BYE))
            return
        self.roster.back(hello.pid)  # a hello sent after its bye: install() again
        self._late_first_hello(hello, now)
        earlier = second_stop_signal(self.roster.trainers.get(hello.pid), hello)
        more_nodes = self.roster.attach(hello, now.wall)
        self._log("info", ev.TRAINER_ATTACHED, pid=hello.pid, **hello.fields)
        if earlier is not None:
            self._stop_signal_not_honoured(hello.pid, [earlier, str(hello.stop_signal)], hello.stop_signal,
                                           "one process, two stop signals: the latest is used")
        if hello.cannot_save and not self.roster.trainers[hello.pid].saves \
                and self.roster.warn_once(hello.pid, ev.TRAINER_CANNOT_SAVE):
            self._log("warning", ev.TRAINER_CANNOT_SAVE, pid=hello.pid, reason=hello.cannot_save)
        self.obs.trainer_started(now.wall)
        self.verifying.note_start(self.obs.checkpoint_at)
        if more_nodes:
            self._update_capacity()
        self._sum_checkpoint_bytes()
        self.probe.ask(self.roster.checkpoint_dir, previous=hello.resumed_from)
        self._check_stop_budget()
        request = self.saves.request
        if request is not None and not self.config.signal_child and hello.wants_signal \
                and hello.pid not in request.signalled:
            self._signal([hello.pid], now)  # a save is due: this trainer joins it at once
        self._replan(now)

    def _late_first_hello(self, hello: Hello, now: Now) -> None:
        """The first trainer ever said hello after the attach window closed (the stop for nobody
        attached has begun): the exit's reason says so, instead of "install() was never called"."""
        stop, request = self.stopping.stop, self.saves.request
        if self.roster.attached_once or stop is None or stop.exit_status != EXIT_SAVE_MISSED:
            return
        due = f" {now.wall - request.requested_at:.1f}s after the save was due" if request else ""
        stop.reason = (f"no trainer attached in time: one said hello (pid {hello.pid}){due}, after the "
                       "stop had begun: it was slow to start (a later deadline, or a trainer that "
                       "attaches earlier, gives it time)")
        self._log("warning", ev.TRAINER_LATE, pid=hello.pid, reason=stop.reason)

    def _on_checkpoint_size(self, size: CheckpointSize, now: Now) -> None:
        if self.roster.said_checkpoint_size(size.pid, size.checkpoint_bytes):
            self._sum_checkpoint_bytes()
            self._replan(now)

    def _sum_checkpoint_bytes(self) -> None:
        size = self.roster.checkpoint_bytes()
        if size is not None:
            self.obs.checkpoint_size(size)

    def _on_storage_probed(self, probed: StorageProbed, now: Now) -> None:
        self.probe.probed(probed, now)
        self._replan(now)

    def _on_storage_probe(self, now: Now) -> None:
        self.probe.again(self.roster.checkpoint_dir)

    def _on_trainer_gone(self, gone: TrainerGone, now: Now) -> None:
        self.saves.forget(gone.pid)
        if self.roster.gone(gone.pid) and self.saves.request is not None:
            self._check_acknowledged(now)  # it may have been the last one to wait for
        self.stopping.first_exited(gone.pid, now)

    def _on_child_stop(self, now: Now) -> None:
        """The trainers stopped first have exited, and the child is still there: its stop signal."""
        signal, child = self.stopping.child_signal_due(), self.roster.child_pid
        if signal is not None and child is not None and self.roster.child_status is None:
            self._log("info", ev.CHILD_STOP_SIGNALLED, pid=child, signal=signal,
                      reason=f"the trainers stopped first have exited, the child was still running "
                             f"{LAUNCHER_EXIT_S:g}s later")
            self.out.act(SendSignal((child,), signal))

    def _stop_signal_not_honoured(self, pid: int, asked: list[str], used: str | None, reason: str) -> None:
        if self.roster.warn_once(pid, ev.STOP_SIGNAL_NOT_HONOURED):
            self._log("warning", ev.STOP_SIGNAL_NOT_HONOURED, pid=pid, asked=asked, used=used, reason=reason)

    def _on_trainer_left(self, left: TrainerLeft, now: Now) -> None:
        if not self.roster.leave(left.pid, left.sent_mono):
            return
        self._log("info", ev.TRAINER_LEFT, pid=left.pid)
        if self.saves.request is not None:
            self._check_acknowledged(now)  # it may have been the last one to wait for

    def _on_child_exited(self, exited: ChildExited, now: Now) -> None:
        stopping = self.stopping.stop is not None
        fields: dict[str, Any] = {"pid": exited.pid, "code": exited.code, "signal": exited.signal}
        no_handler = self._killed_by_the_save_signal(exited, now)
        if exited.signal == "SIGKILL" and not stopping:
            fields["hint"] = "killed by SIGKILL: out of memory?"
        elif no_handler is not None:
            fields["hint"] = no_handler
        self._log("info", ev.CHILD_EXITED, **fields)
        self.roster.child_exited(exited)
        self.saves.forget(exited.pid)
        if not stopping:
            self._begin_stop("child exited" if no_handler is None else f"child exited: {no_handler}", None,
                             "child", now)

    def _killed_by_the_save_signal(self, exited: ChildExited, now: Now) -> str | None:
        """The child died of the save signal esiwrap sent it for the save still outstanding: it had
        no handler for it. What to say, or None (another end, or a signal esiwrap did not send)."""
        request, sent_mono = self.saves.request, self.roster.save_signalled_mono.get(exited.pid)
        if exited.signal != self.config.save_signal or sent_mono is None or request is None \
                or exited.pid not in request.signalled:
            return None
        earlier_ms = max(0, round((now.mono - sent_mono) * 1000))
        return (f"killed by {exited.signal}, the save signal esiwrap sent it {earlier_ms} ms earlier: it had "
                "no handler for it (a trainer that never called install(), or one that had called "
                "uninstall() or was shutting down)")

    def _on_tree_checked(self, checked: TreeChecked, now: Now) -> None:
        stop = self.stopping.stop
        if stop is None or self.roster.child_status is None:
            return
        if self.stopping.tree_checked(checked.remaining):
            self._exit(stop.reason, now)

    # ------------------------------------------------------------------ trainer reports
    def _on_step(self, report: Step, now: Now) -> None:
        if report.pid != self.roster.timing_pid():
            return
        if report.delay_s is not None:
            self.obs.report_delay.record(report.delay_s)
        self.saves.boundary()
        self._last_report_mono = now.mono
        first = self.obs.last_step is None
        interval = self.obs.record_step(report.step, report.duration_s, now.wall)
        delay = {} if report.delay_s is None else {"delivery_s": rounded(report.delay_s)}
        self._log("debug", ev.STEP_OBSERVED, step=report.step, duration_s=rounded(interval), **delay)
        if first:  # the first boundary after a start from step s is s + 1
            self.advisories.check_resume(max(0, report.step - 1), NO_FIELDS)
        self._check_stop_budget()
        self._replan(now)

    def _on_training_start(self, start: TrainingStart, now: Now) -> None:
        self.advisories.check_resume(max(0, start.step), start.fields)

    def _adopt_peer_request(self, report: SaveBegin | SaveSnapshot | SaveEnd, now: Now) -> None:
        """A save another node's esiwrap asked for (the ranks agreed on it in their all-reduce) is
        this node's save too: the job ends after it on every node, so it becomes this node's
        request, and esiwrap stops after it."""
        if not report.peer or self.saves.request is not None or self.stopping.stop is not None:
            return
        self.saves.ask("peer", now, signalled={report.pid})
        self.modes.move("save asked")
        self._log("info", ev.SAVE_REQUESTED, reason="peer", kind="peer", pids=[],
                  remaining_s=self._remaining(now))

    def _on_save_begin(self, begin: SaveBegin, now: Now) -> None:
        self._adopt_peer_request(begin, now)
        self.saves.begin(begin, now)

    def _on_save_snapshot(self, snapshot: SaveSnapshot, now: Now) -> None:
        if not self.saves.began(snapshot.pid, snapshot.step):
            self.out.act(RefuseMessage(snapshot, NEVER_BEGUN))
            return
        self._adopt_peer_request(snapshot, now)
        self.saves.snapshot(snapshot, now)

    def _on_save_end(self, end: SaveEnd, now: Now) -> None:
        if not self.saves.ends(end.pid, end.step):  # a save that was never begun is no evidence
            self.out.act(RefuseMessage(end, NEVER_BEGUN))
            return
        if end.delay_s is not None:
            self.obs.report_delay.record(end.delay_s)
        if not end.ok:
            self.saves.failed(end, now)
            return  # the trainer keeps its flag and tries again at the next boundary
        self._adopt_peer_request(end, now)
        if self.saves.request is None:
            self.obs.record_save(end.duration_s, now.wall)
            self._save_completed(end.step, [end], now, requested=False)  # the trainer's own
            self._replan(now)
        elif self.saves.ended(end, self.roster.savers()):
            self._acknowledged(now)

    def _complete(self, reason: str, now: Now) -> str:
        """The exit's reason for a checkpoint that completed while draining: after what, or how
        long after the deadline (a last-chance save, the machine still running)."""
        deadline = self.book.deadline
        if deadline is not None and now.wall > deadline.at:
            return (f"checkpoint complete {now.wall - deadline.at:.1f}s after the deadline (a last-chance "
                    "save: the machine was still running)")
        return f"checkpoint complete after {reason}"

    def _check_acknowledged(self, now: Now) -> None:
        if self.saves.acknowledged_by(self.roster.savers()):
            self._acknowledged(now)

    def _acknowledged(self, now: Now) -> None:
        """The save asked for is complete: stop after it if that was the point, else plan on."""
        request, step, messages = self.saves.acknowledge(now)
        self._save_completed(step, messages, now, requested=True, kind=request.kind)
        if self.mode is Mode.DRAINING:
            if self.verifying.pending(self.saves.last_checkpoint):
                return  # stop once it is verified (or the wait ends): an invalid one is saved again
            self.stopping.drained()
            self._begin_stop(self._complete(request.reason, now), EXIT_CHECKPOINTED,
                             "sigterm" if request.reason == "sigterm" else "deadline", now)
            return
        if request.reason == "peer":  # the node that asked stops its ranks: the job ends here too
            self._begin_stop("checkpoint complete after a peer node's request", EXIT_CHECKPOINTED, "peer",
                             now)
            return
        self.modes.move("acknowledged")
        if request.reason in ("manual", "early_warning"):
            return  # a save by hand, or on an early warning, changes nothing in the plan
        self.planner.acknowledged(request.kind)
        self._replan(now)

    def _save_completed(self, step: int, messages: list[SaveEnd], now: Now, *, requested: bool,
                        kind: str = "") -> None:
        """A checkpoint of `step` is complete: count it, log it, verify it (it counts once valid),
        upload it or look at what holds it, keep the job's state (the next run plans with it even if
        this one dies)."""
        self._check_stop_budget()
        checkpoint = self.saves.complete(step, messages, now, self._remaining(now), requested=requested,
                                         kind=kind)
        boundary = self.obs.checkpoint_at  # the step boundary it holds
        if self.config.verifies and not self.verifying.unverifiable(checkpoint):
            self.verifying.ask(checkpoint, "save", boundary, now, self.book.deadline)
            self._keep_state(now)  # the save is measured; the checkpoint counts once verified
            return
        self._checkpoint_counts(checkpoint, boundary, now, NO_FIELDS)

    def _checkpoint_counts(self, checkpoint: Checkpoint, boundary: float | None, now: Now,
                           verified: Mapping[str, Any]) -> None:
        """A checkpoint counts (verified, or nothing to verify): the newest valid one; its manifest
        and its upload, or a look at what holds it; the job's state."""
        self.verifying.counted(checkpoint, boundary)
        if self.config.manifests:
            self._write_manifest(checkpoint, verified, now)
        self.uploads.checkpoint_completed(checkpoint, now, self.book.deadline)
        self._keep_state(now)

    def _write_manifest(self, checkpoint: Checkpoint, verified: Mapping[str, Any], now: Now) -> None:
        """Beside the checkpoint, before its upload: the job's state as it will be once uploaded."""
        state = self._state(now, checkpoint, True)
        self.out.act(WriteManifest(checkpoint.step, checkpoint.path, now.wall, self.job.run_id,
                                   int(verified.get("bytes") or 0), int(verified.get("files") or 0),
                                   str(verified.get("format") or ""), state))

    def _check_stop_budget(self) -> None:
        measured = self.obs.longest_save_s
        save_s = measured if measured is not None else self.config.policy.save_duration_s
        step_s = self.current_step_estimate_s() or 0.0
        self.advisories.check_stop_budget(step_s, save_s, self.config.stop_grace_s)

    # ------------------------------------------------------------------ uploads
    def _on_filesystem_checked(self, checked: FilesystemChecked, now: Now) -> None:
        self.uploads.filesystem_checked(checked)

    def _on_upload_started(self, started: UploadStarted, now: Now) -> None:
        self.uploads.started(started, now, self._remaining(now))

    def _on_upload_exited(self, exited: UploadExited, now: Now) -> None:
        deadline = self.book.deadline
        # a failed upload is retried while no newer checkpoint that counts replaces it
        newest = self.verifying.valid if self.config.verifies else self.saves.last_checkpoint
        ended = self.uploads.exited(exited, now, deadline, newest)
        if ended is None:
            return
        if ended.completed:
            self._keep_state(now)  # a durable checkpoint and an upload measured: the next run knows both
        self.uploads.start_waiting(now, deadline, ended.cut_off)
        if self.mode is Mode.UPLOADING:
            if self.uploads.settle():
                self._finish(self.uploads.exit_reason, now)
        else:
            self.planner.upload_ended()
            self._replan(now)  # the upload is measured, and the next one need not wait for it

    def _on_upload_retry(self, now: Now) -> None:
        self.uploads.retry_now(now, self.book.deadline)

    def _on_upload_cut_off(self, now: Now) -> None:
        if self.uploads.cut_off_timer(now, self.book.deadline):
            self._finish(self.uploads.exit_reason, now)

    # ------------------------------------------------------------------ verification
    def _on_checkpoint_verified(self, verified: CheckpointVerified, now: Now) -> None:
        verdict = self.verifying.ended(verified, now, self.book.deadline)
        if verdict is not None:
            self._verdict(verdict, now)

    def _on_verify_cut_off(self, now: Now) -> None:
        verdict = self.verifying.cut_off(now, self.book.deadline)
        if verdict is not None:
            self._verdict(verdict, now)

    def _verdict(self, verdict: Verdict, now: Now) -> None:
        """A verification ended: a restored checkpoint lets the command start (or the attempt
        failed); a saved one counts, or never does."""
        if verdict.purpose == "restore":
            outcome = self.restoring.verified(verdict.ok, verdict.fields, now, self.book.deadline)
            self._restore_outcome(outcome, now)
            return
        if verdict.ok:
            self._log("info", ev.CHECKPOINT_VERIFIED, **verdict.fields, remaining_s=self._remaining(now))
            self._checkpoint_counts(verdict.checkpoint, verdict.boundary_at, now, verdict.fields)
        else:
            self._checkpoint_invalid(verdict, now)
        self._after_verification(now)

    def _checkpoint_invalid(self, verdict: Verdict, now: Now) -> None:
        """It never counts: the newest valid checkpoint stays the job's, the work since that one is
        at risk again, and a save is asked for at once while one can be."""
        checkpoint = verdict.checkpoint
        self.verifying.found_invalid(checkpoint, str(verdict.fields.get("problem", "")))
        if self.obs.checkpoint_at == verdict.boundary_at:
            self.obs.checkpoint_lost(self.verifying.valid_boundary)
        durable = self.verifying.durable(self.config.uploads)
        why_not = self._why_no_save_again()
        self._log("error", ev.CHECKPOINT_INVALID, **verdict.fields,
                  durable_step=durable.step if durable is not None else None,
                  action=why_not or "save again now")
        if why_not is None:
            self._request_save("invalid", now)

    def _why_no_save_again(self) -> str | None:
        """Why no save is asked for after an invalid checkpoint, or None: ask."""
        if self.stopping.stop is not None or self.mode in (Mode.STOPPING, Mode.KILLING, Mode.VERIFYING,
                                                           Mode.UPLOADING, Mode.EXITED):
            return "none: the child is being stopped"
        if self.saves.request is not None:
            return "none: a save is under way"
        if self.verifying.outstanding():
            return "none: a newer checkpoint is being verified"
        if not self.verifying.may_save_again():
            return (f"none: {self.verifying.invalid_streak} checkpoints in a row were invalid; fix the "
                    "trainer's save (the planned saves go on)")
        if not self.roster.signal_targets():
            return "none: no trainer attached"
        return None

    def _after_verification(self, now: Now) -> None:
        """What waited for a verification: the exit, the drain's stop, the plan's next decision."""
        if self.verifying.outstanding():
            return
        if self.mode is Mode.VERIFYING:
            self._exit(self.verifying.exit_reason, now)
        elif self.mode is Mode.DRAINING and self.saves.request is None \
                and self.verifying.valid == self.saves.last_checkpoint is not None:
            # the save acknowledged while draining counts (training may have gone on meanwhile)
            request = self.saves.last_request
            reason = request.reason if request is not None else "sigterm"
            self.stopping.drained()
            self._begin_stop(self._complete(reason, now), EXIT_CHECKPOINTED,
                             "sigterm" if reason == "sigterm" else "deadline", now)
        elif self.planner.awaits_upload and self.mode is Mode.RUNNING and not self.uploads.running():
            self.planner.upload_ended()
            self._replan(now)  # the verification is measured; what was waiting for it decides now

    def _verified_exit(self, reason: str) -> tuple[int, str, Checkpoint | None]:
        """Exit 75 needs a valid checkpoint (the newest is the job's); 76 when none of this run is."""
        valid = self.verifying.durable(self.config.uploads)
        newest = self.saves.last_checkpoint
        if valid is None:
            why = self._not_counted(newest)
            return EXIT_SAVE_MISSED, f"{reason}; no checkpoint of this run is valid{why}", newest
        if newest is not None and newest.step > valid.step:
            return (EXIT_CHECKPOINTED, f"{reason}; the job resumes from step {valid.step}, its newest valid "
                    f"checkpoint{self._not_counted(newest)}", valid)
        return EXIT_CHECKPOINTED, reason, valid

    def _not_counted(self, checkpoint: Checkpoint | None) -> str:
        """Why the newest checkpoint does not count, in words for the exit reason."""
        if checkpoint is None:
            return ""
        invalid = self.verifying.last_invalid
        if invalid is not None and invalid[0] == checkpoint:
            return f": the checkpoint of step {checkpoint.step} is invalid ({invalid[1]})"
        if self.verifying.valid is not None and self.verifying.valid_gone:
            return (f": the checkpoint of step {self.verifying.valid.step} was deleted before a newer one "
                    "counted")
        return f": the checkpoint of step {checkpoint.step} was not verified before the stop"

    # ------------------------------------------------------------------ the way back (--restore)
    def _begin_restore(self, now: Now) -> bool:
        """True: the command waits (starting) until the checkpoint is back; False: nothing to bring
        back, the command starts as it would have."""
        outcome = self.restoring.begin(self.job.resume_from, now, self.book.deadline)
        if outcome == "done":
            return False
        self._restore_outcome(outcome, now)
        return True

    def _restore_outcome(self, outcome: Outcome, now: Now, found: Manifest | None = None) -> None:
        deadline = self.book.deadline
        match outcome:
            case "verify":
                checkpoint = self.restoring.checkpoint
                assert checkpoint is not None
                self.verifying.ask(checkpoint, "restore", None, now, deadline)
            case "found":
                assert found is not None
                self._adopt(found)
                checkpoint = self.job.resume_from
                assert checkpoint is not None
                self._restore_outcome(self.restoring.look(checkpoint, now, deadline), now)
            case "done":
                self._restored(now)
            case "given up":
                self.verifying.abandon()
                if self.config.restore_optional:
                    self._restored(now)
                else:
                    self._not_started(EXIT_NOT_RESTORED, self.restoring.exit_reason(), "", now)
            case "wait":
                pass

    def _adopt(self, manifest: Manifest) -> None:
        """The job's state came back in the checkpoint's manifest: plan and check with it."""
        checkpoint = Checkpoint(manifest.step, manifest.written_at, manifest.path)
        state = manifest.state or JobState()
        self.job.adopt(replace(state, checkpoint=checkpoint, checkpoint_durable="upload"))
        if self.job.prior is not None:
            self.obs.adopt_prior(self.job.prior)
        self.advisories.resume_from = checkpoint

    def _restored(self, now: Now) -> None:
        self.modes.move("started")
        self.out.act(StartCommand())
        self._replan(now)

    def _not_started(self, code: int, reason: str, cause: StopCause, now: Now) -> None:
        """The command never starts: record how this run ended, and exit."""
        self.job.ended(cause, self._remaining(now))
        self._keep_state(now)
        self.modes.move("not started")
        if code == EXIT_CHECKPOINTED:
            self.out.act(ReleaseCapacity())
        self.out.act(Exit(code, reason, cause))

    def _on_checkpoint_looked(self, looked: CheckpointLooked, now: Now) -> None:
        self._restore_outcome(self.restoring.looked(looked, now, self.book.deadline), now)

    def _on_manifests_fetched(self, fetched: ManifestsFetched, now: Now) -> None:
        outcome, found = self.restoring.manifests_fetched(fetched, now, self.book.deadline)
        self._restore_outcome(outcome, now, found)

    def _on_restore_started(self, started: RestoreStarted, now: Now) -> None:
        self.restoring.started(started, now, self.book.deadline)

    def _on_restore_exited(self, exited: RestoreExited, now: Now) -> None:
        self._restore_outcome(self.restoring.exited(exited, now, self.book.deadline), now)

    def _on_restore_retry(self, now: Now) -> None:
        self._restore_outcome(self.restoring.retry_now(now, self.book.deadline), now)

    def _on_restore_cut_off(self, now: Now) -> None:
        if self.restoring.stage == "verifying":
            self.verifying.abandon()
        self._restore_outcome(self.restoring.cut_off(now, self.book.deadline), now)

    def _signal_while_restoring(self, name: str, now: Now) -> None:
        """A stop before the command started: stop the restore and exit. The job's checkpoint is where
        it was (in the store): exit 75 lets the platform resume it elsewhere."""
        if name not in ("SIGINT", "SIGTERM"):
            return  # no child yet to pass it on to
        self.restoring.stop()
        self.verifying.abandon()
        checkpoint = self.restoring.checkpoint
        code = EXIT_CHECKPOINTED if checkpoint is not None else EXIT_SAVE_MISSED
        where = {"step": checkpoint.step, "path": checkpoint.path} if checkpoint is not None else {}
        self._log("warning", ev.RESTORE_FAILED, **where, attempt=self.restoring.attempt,
                  problem=f"{name} before the command started", action=f"exit {code}")
        kept = (f"; the job's checkpoint of step {checkpoint.step} is where it was" if checkpoint is not None
                else "")
        self._not_started(code, f"{name} while restoring, before the command started{kept}",
                          "sigterm" if name == "SIGTERM" else "by hand", now)

    # ------------------------------------------------------------------ signals to esiwrap
    def _on_signal_received(self, received: SignalReceived, now: Now) -> None:
        """esiwrap's own signals (`esiwrap.signals.USED`); every other one goes to the child."""
        if self.mode is Mode.STARTING:
            self._signal_while_restoring(received.name, now)
            return
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
            self._begin_stop("interrupted twice", None, "by hand", now, immediate=True)
        else:
            self._forward("SIGINT")

    def _handle_sigterm(self, now: Now) -> None:
        if self.config.on_sigterm == "forward" or self.stopping.stop is not None:
            self._forward("SIGTERM")
            return
        if self.mode is Mode.DRAINING:
            return  # already turning a SIGTERM into a checkpoint
        self.out.act(NotifyStopping())
        saved = self._progress_is_saved()
        if saved or not self.roster.signal_targets():
            self._begin_stop("SIGTERM", EXIT_CHECKPOINTED if saved else None, "sigterm", now)
            return
        self._drain(now)
        if self.saves.request is None:
            self._request_save("sigterm", now)
        else:
            self.saves.retell("sigterm")

    def _handle_sigusr1(self, now: Now) -> None:
        if self.mode in (Mode.RUNNING, Mode.CONTINUING) and self.saves.request is None:
            self._request_save("manual", now)

    def _forward(self, name: str) -> None:
        child = self.roster.child_pid
        if child is not None and self.roster.child_status is None:
            self.out.act(SendSignal((child,), name))

    # ------------------------------------------------------------------ the deadline
    def _on_deadline_answers(self, given: DeadlineAnswers, now: Now) -> None:
        if self.book.recheck_pending:
            self.book.rechecked(given.answers)
        capacity_before = self.obs.capacity
        cancelled = False  # the ruling deadline's own source took it back
        for answer, news in self.book.take(given.answers):
            cancelled |= news.cancelled
            if news.early_warning:
                self._early_warning(answer.source, news.early_warning, now)
        self._update_capacity()
        new = self.book.ruling()
        if new is not None:
            self._set_deadline(new, now)
        elif cancelled:  # and no other source knows one; a node that left keeps the last one instead
            self._deadline_gone()
        elif self.obs.capacity != capacity_before:
            self._replan(now)

    def _update_capacity(self) -> None:
        self.obs.capacity_is(self.book.capacity(self.roster.nodes))

    def _deadline_gone(self) -> None:
        """No deadline any more: nothing is planned until a new one comes, and that one is planned
        afresh (a new insurance save)."""
        self.book.forget()
        self.planner.forget()
        self.modes.move("deadline gone")

    def _early_warning(self, source: str, warning: str, now: Now) -> None:
        """A new early warning (EC2 rebalance: elevated risk of interruption) asks for a save now,
        once per warning: not a deadline, so the plan stays as it is."""
        why_not = self._why_no_save_now()
        self._log("warning", ev.EARLY_WARNING, source=source, reason=warning, action=why_not or "save now")
        if why_not is None:
            self._request_save("early_warning", now)

    def _why_no_save_now(self) -> str | None:
        if self.stopping.stop is not None or self.mode in (Mode.DRAINING, Mode.STOPPING, Mode.KILLING):
            return "none: stopping"
        if self.saves.request is not None:
            return "none: a save is under way"
        if self._progress_is_saved():
            return "none: the latest step is saved"
        if not self.roster.signal_targets():
            return "none: no trainer attached"
        return None

    def _set_deadline(self, new: Deadline, now: Now) -> None:
        adopted, old = self.book.adopt(new, now, self.obs.capacity)
        if not adopted:
            return
        self.restoring.deadline_known(now, new)
        self.stopping.deadline_moved(new, now)
        later = old is None or new.at > old.at
        if later and self.modes.move("deadline renewed"):  # continuing: training goes on planned
            self.planner.renewed()
        elif old is not None and later and self._renewal_fits_insurance(new.at, now):
            self.planner.reopen()
        if new.at <= now.wall and self.mode in (Mode.RUNNING, Mode.SAVE_REQUESTED):
            self._deadline_already_passed(now)
            return
        self._replan(now)

    def _renewal_fits_insurance(self, deadline: float, now: Now) -> bool:
        """A later deadline while running, after a save: is there room for a new insurance save?"""
        if self.mode is not Mode.RUNNING or self.planner.saves_done == 0:
            return False
        return renewal_reopens_insurance(deadline, self.obs, self.config.policy, now.wall)

    def _deadline_already_passed(self, now: Now) -> None:
        """Learned too late: save at once if anything can, give it --stop-grace, then stop."""
        self._log("warning", ev.DEADLINE_TOO_CLOSE, remaining_s=self._remaining(now), needed_s=None,
                  action="save now, then stop")
        if self.saves.request is None:
            self._request_save("deadline", now)
        if self.mode is Mode.SAVE_REQUESTED:
            self._drain(now)

    def _on_deadline(self, now: Now) -> None:
        if self.saves.last_checkpoint is not None:
            self._begin_stop("deadline reached", EXIT_CHECKPOINTED, "deadline", now)
            return
        if self.roster.signal_targets():
            self._last_chance(now)
            return
        self._missed("deadline passed without an acknowledged save", now)

    def _last_chance(self, now: Now) -> None:
        """The deadline passed with no checkpoint while esiwrap and a trainer still run (the wall
        clock jumped, the loop woke late, the save ran long): the capacity may not be gone yet, so
        a save now may still complete. The save signal goes out at once unless a save is under way,
        and its acknowledgement is waited for up to --stop-grace: exit 75 when it comes (its reason
        says it came after the deadline), 76 when it does not."""
        deadline = self.book.deadline
        assert deadline is not None
        jump = self.clock.latest
        self._log("warning", ev.DEADLINE_PASSED_ALIVE, late_s=rounded(now.wall - deadline.at),
                  deadline=deadline.iso(), clock_jump=jump.fields() if jump is not None else None,
                  action=f"a last-chance save, waited for up to {self.config.stop_grace_s:g}s")
        if self.saves.request is None:
            self._request_save("last_chance", now)
        self._drain(now)
        # The run met its deadline: that is how it ended, for the job's history, whatever the last
        # chance brings (the capacity may go any moment; a run that vanished here must not count
        # as an interruption, nor escape the no-progress guard).
        self.job.ended("deadline", self._remaining(now))
        if self.config.state_file is not None:
            self._keep_state(now)

    def _missed(self, reason: str, now: Now, level: LogLevel = "error", grace_s: float | None = None) -> None:
        """No checkpoint, and none can come now: say why (the last plan, the signal, what was late,
        what never came), then stop with exit 76."""
        self.saves.missed()
        facts = miss_facts(self.saves.request, self.planner.plan, self.obs, now, self._never_came(now),
                           self._last_report_mono, self.clock.latest)
        if self.clock.latest is not None:
            reason = f"{reason} ({self.clock.latest.words()})"
        self._log(level, ev.SAVE_MISSED, remaining_s=self._remaining(now), reason=reason, **facts)
        self._begin_stop(f"{reason}: {facts['never_came'][0]}", EXIT_SAVE_MISSED, "deadline", now,
                         grace_s=grace_s)

    def _never_came(self, now: Now) -> list[str]:
        return never_came(self.saves.request, now, attached_once=self.roster.attached_once,
                          savers=self.roster.savers(), last_error=self.saves.last_error,
                          cannot_save=self.roster.cannot_save())

    # ------------------------------------------------------------------ planning
    def _replan(self, now: Now) -> None:
        deadline = self.book.deadline
        if self.mode is not Mode.RUNNING or deadline is None:
            return
        if self.planner.replan(deadline, now, self._remaining(now)) is None:
            self._no_further_save(now)

    def _on_upload_decision(self, now: Now) -> None:
        """The plan waited for an upload's end as long as it could: decide without it."""
        self._no_further_save(now)

    def _no_further_save(self, now: Now) -> None:
        """The last planned save is done: stop, or let training go on (`--after-save`)."""
        match self.planner.after_last_save(self.book.deadline, now, upload_running=self.uploads.running(),
                                           verify_running=self.verifying.outstanding()):
            case "continue" | "linger":
                self.modes.move("no further save")
            case "stop":
                self._begin_stop("checkpoint complete", EXIT_CHECKPOINTED, "deadline", now)

    def _request_save(self, reason: str, now: Now) -> None:
        targets = self.roster.signal_targets()
        if not targets and reason == "manual":
            self._log("warning", ev.NO_TRAINER_ATTACHED, action="ignored", reason=reason)
            return
        request = self.saves.ask(reason, now, self.planner.plan if reason == "deadline" else None)
        self.modes.move("save asked")  # a save by hand while continuing keeps continuing
        # Nothing registered (yet): a trainer that attaches in time is signalled at once; otherwise
        # the child is stopped gracefully, --stop-grace before the deadline.
        unattached = self.saves.unattached_stop_at(self.mode, self.book.deadline, self.config.stop_grace_s,
                                                   self.roster.attached_once)
        self.saves.announce(request, now, targets, self.config.save_signal, self._remaining(now), unattached)
        if targets:
            self._signal(targets, now)

    def _signal(self, pids: list[int], now: Now) -> None:
        self.saves.signalled(pids)
        self.roster.save_signal_sent(pids, now.mono)
        self.out.act(SendSignal(tuple(pids), self.config.save_signal))

    def _progress_is_saved(self) -> bool:
        """The latest step is in a checkpoint that counts, or may (its verification is pending)."""
        if self.config.verifies and self.saves.last_checkpoint is not None \
                and not self.verifying.pending(self.saves.last_checkpoint):
            valid = self.verifying.valid
            return valid is not None and valid.step >= (self.obs.last_step or 0)
        return self.saves.progress_is_saved(self.obs.last_step)

    # ------------------------------------------------------------------ draining and stopping
    def _drain(self, now: Now) -> None:
        """Stop once the outstanding save is acknowledged; wait for it up to --stop-grace."""
        self.modes.move("drain")
        self.stopping.drain(now)
        self.stopping.extend_timeout(self.mode, now)

    def _on_ack_wait(self, now: Now) -> None:
        """--stop-grace after a SIGTERM (or a deadline learned too late) is over."""
        if self._save_being_written_may_finish(now):
            return
        self.stopping.drained()
        request = self.saves.last_request
        verifying = self.verifying.pending(self.saves.last_checkpoint)
        if self.saves.request is None and request is not None and verifying:
            # acknowledged, still being verified: stop now; the exit waits for it (verifying)
            self._begin_stop(self._complete(request.reason, now), EXIT_CHECKPOINTED,
                             "sigterm" if request.reason == "sigterm" else "deadline", now)
            return
        saved = self._progress_is_saved()
        deadline = self.book.deadline
        if not saved and deadline is not None and now.wall >= deadline.at:
            self._missed("deadline passed without an acknowledged save", now)
            return
        self.saves.missed()
        self._log("warning", ev.SAVE_MISSED, remaining_s=self._remaining(now),
                  reason="no acknowledgement within --stop-grace", never_came=self._never_came(now))
        if saved:
            self._begin_stop("stop requested, latest step already saved", EXIT_CHECKPOINTED, "sigterm", now)
        else:
            self._begin_stop("SIGTERM", None, "sigterm", now)

    def _save_being_written_may_finish(self, now: Now) -> bool:
        """A save is being written: do not kill it while it can still finish in time. True when
        the wait was extended for it."""
        request = self.saves.request
        if request is None or request.save_started_mono is None:
            return False
        estimate = save_estimate_s(self.obs, self.config.policy)
        return self.stopping.wait_for_save(request.save_started_mono, estimate, self.book.deadline, now)

    def _begin_stop(self, reason: str, exit_status: int | None, cause: StopCause, now: Now, *,
                    immediate: bool = False, grace_s: float | None = None) -> None:
        if self.stopping.stop is not None:
            if immediate:
                self._escalate(reason, now)
            return
        self.modes.move("stop")
        self.planner.stopped()
        self.stopping.begin(reason, exit_status, cause, now, grace_s)
        self.out.act(NotifyStopping())
        self.stopping.extend_timeout(self.mode, now)
        first = self.roster.stopped_first()
        if self.roster.child_status is not None:
            self._stop_first(first, None)
            return  # the child is gone already: the tree check decides when we are done
        if immediate:
            self.out.act(StopChild(None))
            self._kill(now)
            return
        signal = self.roster.child_stop_signal(self.config.stop_signal)
        grace = self.config.stop_grace_s if grace_s is None else rounded(grace_s)
        ahead = {"first": [{"pid": pid, "signal": name} for name, pids in first.items() for pid in pids]}
        self._log("info", ev.CHILD_STOPPING, signal=signal, grace_s=grace, reason=reason,
                  **(ahead if first else {}))
        if not first:
            self.out.act(StopChild(signal))
            return
        self.out.act(StopChild(None))  # the tree remembered before anything is signalled
        self._stop_first(first, signal)

    def _escalate(self, reason: str, now: Now) -> None:
        """A second SIGINT while stopping: SIGKILL the tree, or the upload esiwrap waits for."""
        if self.mode is Mode.STOPPING:
            self._kill(now)
        elif self.mode is Mode.VERIFYING:
            self.verifying.abandon()
            self._finish(self.verifying.exit_reason, now)
        elif self.mode is Mode.UPLOADING and self.uploads.cut_off_now(reason, now):
            self._finish(self.uploads.exit_reason, now)

    def _stop_first(self, first: dict[str, list[int]], child_signal: str | None) -> None:
        """The trainers below the child that asked for a stop signal of their own get it now; the
        child's stop signal (and, once the child is gone, the SIGTERM to what is left of its tree)
        waits until they have exited: a launcher stopped first would abort them."""
        for name, pids in first.items():
            self.out.act(SendSignal(tuple(pids), name))
        if first:
            self.stopping.stop_first({pid for pids in first.values() for pid in pids}, child_signal)

    def _kill(self, now: Now) -> None:
        self.modes.move("kill")
        self.stopping.kill(now)

    def _on_stop(self, now: Now) -> None:
        stop = self.stopping.stop
        assert stop is not None
        if self.mode is Mode.STOPPING:
            self._kill(now)
        else:
            self._exit(stop.reason + " (processes survived SIGKILL)", now)

    def _exit(self, reason: str, now: Now) -> None:
        """The child's tree is gone: exit, once the last checkpoint's verification and upload ended."""
        if self.verifying.outstanding():
            self.modes.move("await verify")
            self.verifying.await_at_stop(reason, now, self.book.deadline)
            return
        if self.uploads.outstanding() and self.modes.move("await upload"):
            if self.uploads.await_at_stop(reason, now, self.book.deadline):
                self._finish(self.uploads.exit_reason, now)
            return
        self._finish(reason, now)

    def _finish(self, reason: str, now: Now) -> None:
        if self.mode is Mode.EXITED:
            return
        code = self.stopping.exit_code(self.roster.child_status)
        last = self.saves.last_checkpoint
        ours = self.stopping.stop is not None and self.stopping.stop.exit_status == EXIT_CHECKPOINTED
        if ours and self.config.verifies:  # esiwrap's own 75 (not a child's that exited 75 itself)
            code, reason, last = self._verified_exit(reason)
        if code == EXIT_CHECKPOINTED and self.config.uploads and not self.uploads.last_uploaded(last):
            code, reason = EXIT_NOT_UPLOADED, f"{reason}; {self.uploads.not_uploaded_reason(last)}"
        self.modes.move("exit")
        cause = self.stopping.stop.cause if self.stopping.stop else ""
        self.job.ended(cause, self._remaining(now))
        if self.config.state_file is not None:
            self._keep_state(now)  # how the run ended, for the job's history
        if code == EXIT_CHECKPOINTED:
            self.out.act(ReleaseCapacity())
        self.out.act(Exit(code, reason, cause))


def lateness(obs: Observations) -> dict[str, Any]:
    """The snapshot's lateness figures (None before anything was measured)."""
    timers, reports = obs.timer_late, obs.report_delay
    return {
        "timer_late_p99_s": rounded_opt(timers.quantile_s(0.99)),
        "timer_late_max_s": rounded(timers.max_s) if timers.count else None,
        "report_delay_p99_s": rounded_opt(reports.quantile_s(0.99)),
        "report_delay_max_s": rounded(reports.max_s) if reports.count else None,
    }
