"""The supervisor: the I/O shell around the decision core (`esiwrap.controller`).

One thread, one selector. The loop blocks on the signal wakeup socket, the trainer channel, the
deadline watcher's wake socket, a pidfd per attached trainer and (while stopping) pidfds of the
child's tree, with a timeout the controller sets (`wake_at`). Signal handlers do nothing in
Python: `signal.set_wakeup_fd` writes the signal number to the wakeup socket. Everything that
happens becomes an event for the controller, with the time; the controller's actions (signal
these PIDs, stop the child, log, exit) are carried out here. Nothing here decides.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from esiwrap import controller as core
from esiwrap import durability, process, state, systemd, upload
from esiwrap import events as ev
from esiwrap.channel import ChannelServer, Message
from esiwrap.choices import AfterSave, OnSigterm
from esiwrap.controller import Controller, ControllerConfig, Now
from esiwrap.deadline import Source, ask, remote
from esiwrap.envvars import RUN_ID_ENV, SIGNAL_ENV, SOCKET_ENV
from esiwrap.errors import EXIT_FAILURE, EXIT_NOT_EXECUTABLE, CommandError, Halt
from esiwrap.integrations import bootstrap_dir
from esiwrap.log import get_logger
from esiwrap.observe import Observer, ObserveSettings
from esiwrap.policy import PolicyConfig
from esiwrap.signals import HANDLED, signal_label, signal_number
from esiwrap.tree import ProcessTree
from esiwrap.watcher import DeadlineWatcher

MAX_WAIT_S = 60.0  # re-read the wall clock at least this often: it can jump
POLL_WITHOUT_PIDFD_S = 0.2  # only while stopping, on kernels without pidfd_open
HAS_PIDFD = hasattr(os, "pidfd_open")
LogNote = tuple[str, str, dict[str, Any]]  # level, event, fields
RESERVED_HELLO_KEYS = frozenset({"type", "pid", "event", "level", "timestamp", "run_id"})


@dataclass(frozen=True)
class SupervisorConfig:
    argv: Sequence[str]
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    save_signal: int = signal.SIGUSR1
    stop_signal: int = signal.SIGTERM
    stop_grace_s: float = 30.0
    after_save: AfterSave = "stop"
    on_sigterm: OnSigterm = "checkpoint"
    signal_child: bool = False
    run_id: str = ""
    state_file: str | None = None
    stop_budget_s: float | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)  # the run options, logged at start
    upload: str | None = None  # `--upload CMD`: run after each completed save ({path}, {step})
    local_checkpoints_survive: bool = False

    def controller_config(self) -> ControllerConfig:
        return ControllerConfig(
            policy=self.policy, save_signal=signal_label(self.save_signal),
            stop_signal=signal_label(self.stop_signal), stop_grace_s=self.stop_grace_s,
            after_save=self.after_save, on_sigterm=self.on_sigterm, signal_child=self.signal_child,
            stop_budget_s=self.stop_budget_s, local_checkpoints_survive=self.local_checkpoints_survive,
        )


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        sources: Sequence[Source],
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        observe: ObserveSettings | None = None,
    ) -> None:
        self.config = config
        self.log = get_logger()
        self._job_state, state_note = _load_state(config.state_file, clock())
        prior = self._job_state.prior() if self._job_state is not None else None
        resume_from = self._job_state.checkpoint if self._job_state is not None else None
        self.controller = Controller(config.controller_config(), prior=prior, resume_from=resume_from)
        self._state_note = state_note  # logged once the child runs
        self._kept: tuple[int, int, core.Checkpoint | None] = (0, 0, resume_from)  # what the file holds
        self._state_failed = False
        self._queued: list[core.Event] = []  # what carrying out actions produced, fed next
        self._feeding = False
        self._upload: upload.UploadProcess | None = None
        self._background: queue.SimpleQueue[core.Event] = queue.SimpleQueue()  # from helper threads
        self._environ = dict(os.environ if environ is None else environ)
        self._clock = clock
        # Sources whose answer cannot change are local and instant: asked before the child starts.
        self._static = [s for s in sources if s.period_s is None]
        self._selector = selectors.DefaultSelector()
        self._tree = ProcessTree(self._selector)
        self._trainer_fds: dict[int, int] = {}  # pid -> pidfd
        self._channel: ChannelServer | None = None
        self._signal_r, self._signal_w = socket.socketpair()
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._signal_r, self._signal_w, self._wake_r, self._wake_w):
            sock.setblocking(False)  # a full buffer drops a wake-up byte; it never blocks a thread
        self._watcher = DeadlineWatcher([s for s in sources if s.period_s is not None], self._wake_w)
        self._old_handlers: dict[int, Any] = {}
        self._old_wakeup_fd = -1
        self._systemd = systemd.Notifier.from_environ(self._environ)
        self._observer = Observer(self._selector, observe or ObserveSettings())  # metrics, status file

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        """Supervise until the child and its tree are gone; return esiwrap's exit status."""
        self._install_signal_handlers()
        try:
            self._channel = ChannelServer()
            self._start_child()
            self._watcher.start()
            self._loop()
        except Halt as halt:
            return self._exit(halt.reason, halt.exit_status)
        except CommandError as exc:
            self.log.error(ev.COMMAND_FAILED, reason=str(exc))
            return self._exit(str(exc), exc.exit_status)
        except Exception as exc:  # a bug of ours: say so in one line, leave the child a clean stop
            self.log.error(ev.SUPERVISOR_FAILED, error=f"{type(exc).__name__}: {exc}", exc_info=True)
            self._forward_stop_signal()
            return self._exit(f"internal error: {exc}", EXIT_FAILURE)
        finally:
            self._close()
        return self._exit("loop ended", EXIT_FAILURE)  # pragma: no cover - the loop only halts

    def _exit(self, reason: str, code: int) -> int:
        c = self.controller
        durable = c.durable_checkpoint
        self.log.info(ev.SUPERVISOR_EXIT, code=code, reason=reason, last_step=c.obs.last_step,
                      checkpoint_step=c.last_saved_step, durable_step=durable.step if durable else None)
        return code

    def _start_child(self) -> None:
        assert self._channel is not None
        env = child_environment(self._environ, self._channel.path, self.config)
        process.become_subreaper()
        pid = process.spawn(self.config.argv, env, death_signal=signal.SIGTERM)
        host = socket.gethostname()
        self._feed(core.ChildStarted(pid, tuple(self.config.argv), self.config.settings, host))
        if self._state_note is not None:
            level, event, fields = self._state_note
            getattr(self.log, level)(event, **fields)
        if self._static:  # known before READY, so the first status line already has the deadline
            self._feed(core.DeadlineAnswers(tuple(ask(s, self._clock()) for s in self._static)))
        self._systemd.ready(*self._status_parts(), time.monotonic())
        self._selector.register(self._signal_r, selectors.EVENT_READ, self._on_signal_bytes)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._on_watcher_wake)
        self._selector.register(self._channel, selectors.EVENT_READ, self._on_channel)
        self._reap()  # a child that died before the selector existed

    def _install_signal_handlers(self) -> None:
        self._old_wakeup_fd = signal.set_wakeup_fd(self._signal_w.fileno(), warn_on_full_buffer=False)
        for signum in HANDLED:
            # The C-level handler writes the number to the wakeup fd; the Python one does nothing.
            self._old_handlers[signum] = signal.signal(signum, _noop_handler)

    def _close(self) -> None:
        self._observer.close()
        self._watcher.stop()
        self._keep_state(final=True)
        for signum, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        for pid in list(self._trainer_fds):
            self._forget_trainer(pid)
        self._tree.close()
        self._selector.close()
        for sock in (self._signal_r, self._signal_w, self._wake_r, self._wake_w):
            sock.close()
        if self._channel is not None:
            self._channel.close()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            for key, _ in self._selector.select(self._next_timeout()):
                key.data(key)
            self._apply(self.controller.tick(self._now()))
            self._feed_queued()
            if self._stopping():
                self._check_tree()
            self._tell_systemd()
            self._publish()

    def _publish(self) -> None:
        """The metrics file and endpoint, the status file: the controller's state as of now."""
        now = self._now()
        self._observer.tick(now.mono)
        self._observer.update(self.controller.snapshot(now, self.config.run_id, os.getpid()), now.mono)

    def _now(self) -> Now:
        return Now(self._clock(), time.monotonic())

    def _next_timeout(self) -> float:
        waits = [MAX_WAIT_S, self._systemd.ping_in(time.monotonic())]
        due = self.controller.wake_at(self._now())
        if due is not None:
            waits.append(due)
        if self._stopping() and not HAS_PIDFD:
            waits.append(POLL_WITHOUT_PIDFD_S)
        mono = time.monotonic()
        observer_due = self._observer.next_wake(mono)
        if observer_due is not None:
            waits.append(observer_due - mono)
        return max(0.0, min(waits))

    def _feed(self, event: core.Event) -> None:
        self._queued.append(event)
        self._feed_queued()

    def _feed_queued(self) -> None:
        """Hand the controller each queued event in turn; carrying out its actions may queue more
        (an upload started), which follow in order rather than inside the actions' loop."""
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._queued:
                self._apply(self.controller.handle(self._queued.pop(0), self._now()))
                self._keep_state()
        finally:
            self._feeding = False

    # ------------------------------------------------------------------ the job's state file
    def _keep_state(self, final: bool = False) -> None:
        """Write what this run measured to --state-file after every save and upload, and once at
        the end."""
        obs = self.controller.obs
        path = self.config.state_file
        kept = (len(obs.saves), len(obs.uploads), self.controller.durable_checkpoint)
        if path is None or self._state_failed or not (kept != self._kept or final):
            return
        if final and not obs.saves and obs.last_step is None:
            return  # nothing measured: leave the file as it is
        self._kept = kept
        base = self._job_state or state.JobState()
        after = base.after_run(obs.intervals, [d for _, d in obs.saves], obs.blocking, self._clock(),
                               self.config.argv, uploads=obs.uploads,
                               checkpoint=self.controller.durable_checkpoint,
                               uploaded=self.config.upload is not None)
        try:
            state.write_atomic(path, state.render(after))
        except OSError as exc:
            self._state_failed = True  # once: a full disk must not flood the log or stop training
            self.log.warning(ev.STATE_NOT_SAVED, path=path, error=f"{exc.strerror or exc}")

    def _stopping(self) -> bool:
        return self.controller.mode in (core.Mode.STOPPING, core.Mode.KILLING)

    # ------------------------------------------------------------------ carrying out actions
    def _apply(self, actions: Sequence[core.Action]) -> None:
        for action in actions:
            if isinstance(action, core.Log):
                getattr(self.log, action.level)(action.event, **action.fields)
            elif isinstance(action, core.SendSignal):
                signum = signal_number(action.signal)
                for pid in action.pids:
                    if signum is not None:
                        process.send(pid, signum)
            elif isinstance(action, core.StopChild):
                self._stop_child(action.signal)
            elif isinstance(action, core.KillTree):
                self._kill_tree()
            elif isinstance(action, core.TermLeftovers):
                process.signal_all(self._tree_remaining(), signal.SIGTERM)
            elif isinstance(action, core.NotifyStopping):
                self._systemd.stopping()
            elif isinstance(action, core.ExtendStopTimeout):
                self._systemd.extend_stop(action.seconds)
            elif isinstance(action, core.StartUpload):
                self._start_upload(action)
            elif isinstance(action, core.StopUpload):
                signum = signal_number(action.signal)
                if self._upload is not None and signum is not None:
                    self._upload.signal(signum)
            elif isinstance(action, core.CheckFilesystem):
                self._check_filesystem(action.path)
            elif isinstance(action, core.Exit):
                raise Halt(action.reason, action.code)

    # ------------------------------------------------------------------ uploads and the checkpoint's disk
    def _start_upload(self, action: core.StartUpload) -> None:
        """Run the --upload command for this checkpoint; its end comes through reaping."""
        template = self.config.upload
        if template is None:
            return
        if upload.needs_path(template) and not action.path:
            self._queued.append(core.UploadExited(0, None, error="the trainer reported no checkpoint path "
                                                  "to put in {path}: report it in saving(step, path)"))
            return
        env = {k: v for k, v in self._environ.items() if k not in systemd.CHILD_UNSET}
        if self.config.run_id:
            env[RUN_ID_ENV] = self.config.run_id
        try:
            self._upload = upload.UploadProcess.start(template, action.path, action.step, env)
        except OSError as exc:
            self._queued.append(core.UploadExited(0, EXIT_NOT_EXECUTABLE, error=f"cannot start "
                                                  f"{upload.SHELL}: {exc.strerror or exc}"))
            return
        if self._upload.stderr_fd is not None:
            self._selector.register(self._upload.stderr_fd, selectors.EVENT_READ, self._on_upload_stderr)
        self._queued.append(core.UploadStarted(self._upload.pid))

    def _on_upload_stderr(self, key: selectors.SelectorKey) -> None:
        running = self._upload
        if running is None or running.stderr_fd != key.fd:
            self._unregister(key.fd)
            return
        if not running.read_stderr():
            self._unregister(key.fd)

    def _upload_reaped(self, status: int) -> None:
        running, self._upload = self._upload, None
        if running is None:
            return
        fd = running.stderr_fd
        running.read_stderr()  # what it wrote before it exited is in the pipe now
        if fd is not None:
            self._unregister(fd)
        running.close()
        ended = _child_exited(running.pid, status)
        self._feed(core.UploadExited(running.pid, ended.code, ended.signal, tuple(running.tail)))

    def _unregister(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def _check_filesystem(self, path: str) -> None:
        """One look at what holds the checkpoint, on a thread: a stat can hang on a dead mount."""
        def look() -> None:
            found = durability.filesystem_of(path)
            self._background.put(core.FilesystemChecked(path, found.kind, found.fstype, found.mount_point,
                                                        found.source))
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

        threading.Thread(target=look, name="esiwrap-filesystem", daemon=True).start()

    def _stop_child(self, name: str | None) -> None:
        child = self.controller.child_pid
        if child is None:
            return
        self._tree.snapshot(child)
        signum = signal_number(name) if name else None
        if signum is not None:
            process.send(child, signum)

    def _tree_remaining(self) -> list[Any]:
        """The child's tree as the stop sequence sees it: without the upload helper, whose end the
        controller decides (it may have to outlast the child)."""
        remaining = self._tree.remaining()
        running = self._upload
        if running is None:
            return remaining
        helper = {running.pid, *(p.pid for p in process.descendants(running.pid))}
        return [p for p in remaining if p.pid not in helper]

    def _kill_tree(self) -> None:
        remaining = self._tree_remaining()
        if remaining:
            self.log.warning(ev.CHILD_KILLED, signal="SIGKILL", pids=[p.pid for p in remaining])
        process.signal_all(remaining, signal.SIGKILL)

    def _forward_stop_signal(self) -> None:
        child = self.controller.child_pid
        if child is not None and self.controller.child_status is None:
            process.send(child, self.config.stop_signal)

    def _check_tree(self) -> None:
        """While stopping: reap, watch what is left, and tell the controller how much that is."""
        self._reap()
        remaining = self._tree_remaining()
        self._tree.watch(remaining)
        self._feed(core.TreeChecked(len(remaining)))

    # ------------------------------------------------------------------ inputs
    def _on_signal_bytes(self, _: selectors.SelectorKey) -> None:
        try:
            data = self._signal_r.recv(512)
        except (BlockingIOError, InterruptedError):
            return
        for signum in data:
            if signum == signal.SIGCHLD:
                self._reap()
            else:
                self._feed(core.SignalReceived(signal_label(signum)))

    def _on_watcher_wake(self, _: selectors.SelectorKey) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            self._wake_r.recv(512)
        answers = self._watcher.drain()
        if answers:
            self._feed(core.DeadlineAnswers(tuple(answers)))
        while not self._background.empty():
            self._feed(self._background.get_nowait())

    def _on_channel(self, _: selectors.SelectorKey) -> None:
        assert self._channel is not None
        for message in self._channel.receive():
            event = self._event_of(message)
            if event is not None:
                self._feed(event)

    def _event_of(self, message: Message) -> core.Event | None:
        step = message.get_int("step")
        if message.type == "hello":
            return self._hello(message)
        if message.type == "bye":
            self._forget_trainer(message.pid)
            return core.TrainerGone(message.pid)
        if message.type == "step":
            return core.Step(message.pid, step, _finite(message.get_float("duration_s")))
        peer = message.get_bool("peer", False)  # another node's esiwrap asked for this save
        if message.type == "save_begin":
            return core.SaveBegin(message.pid, step, peer=peer)
        if message.type == "save_snapshot":
            return core.SaveSnapshot(message.pid, step, _finite(message.get_float("duration_s")), peer=peer)
        if message.type == "save_end":
            return core.SaveEnd(
                message.pid, step, ok=message.get_bool("ok", True),
                duration_s=_finite(message.get_float("duration_s")), path=message.get_str("path"),
                error=message.get_str("error"), peer=peer,
            )
        if message.type == "start":  # where training starts (the verl hook, after loading)
            fields = {k: v for k, v in message.fields.items() if k not in RESERVED_HELLO_KEYS | {"step"}}
            return core.TrainingStart(message.pid, step, fields)
        if message.type == "deadline":  # another node's answer, relayed by a Ray driver (ray_nodes)
            answer = remote.from_fields(message.fields)
            return core.DeadlineAnswers((answer,)) if answer is not None else None
        return None

    def _hello(self, message: Message) -> core.Hello:
        wants_signal = message.get_bool("signal", True)
        descendant = process.is_descendant(message.pid, os.getpid()) if wants_signal else True
        stop_name = message.get_str("stop_signal")
        stop_signal = signal_number(stop_name) if stop_name else None
        if descendant:
            self._watch_trainer(message.pid)
        return core.Hello(
            pid=message.pid, rank=message.get_int("rank"), saves=message.get_bool("saves", True),
            wants_signal=wants_signal, descendant=descendant,
            stop_signal=signal_label(stop_signal) if stop_signal is not None else None,
            fields={k: v for k, v in message.fields.items() if k not in RESERVED_HELLO_KEYS},
        )

    def _watch_trainer(self, pid: int) -> None:
        """A pidfd per trainer: the loop learns at once when one exits (no polling)."""
        if pid in self._trainer_fds:
            return
        fd = process.open_pidfd(pid)
        if fd is None:
            return  # no pidfd here (old kernel) or already gone; reaping or a bye will tell
        self._trainer_fds[pid] = fd
        self._selector.register(fd, selectors.EVENT_READ, lambda _key, pid=pid: self._trainer_exited(pid))

    def _trainer_exited(self, pid: int) -> None:
        self._forget_trainer(pid)
        self._feed(core.TrainerGone(pid))

    def _forget_trainer(self, pid: int) -> None:
        fd = self._trainer_fds.pop(pid, None)
        if fd is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _reap(self) -> None:
        """Collect every exited child, ours or orphaned to us, and report the direct child's end."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.controller.child_pid:
                self._forget_trainer(pid)
                self._feed(_child_exited(pid, status))
            elif self._upload is not None and pid == self._upload.pid:
                self._upload_reaped(status)
            elif pid in self._trainer_fds:
                self._trainer_exited(pid)

    # ------------------------------------------------------------------ systemd
    def _tell_systemd(self) -> None:
        """STATUS= when it changed, WATCHDOG=1 when due; both do nothing outside systemd."""
        if self._systemd.enabled:
            mono = time.monotonic()
            self._systemd.status(*self._status_parts(), mono)
            self._systemd.ping_if_due(mono)

    def _status_parts(self) -> tuple[str, str]:
        c = self.controller
        request, plan, deadline = c.request, c.plan, c.deadline
        return systemd.status_parts(systemd.StatusFacts(
            now=self._clock(), phase=c.mode.value,
            deadline_at=deadline.at if deadline else None,
            source=deadline.source if deadline else None,
            deadline_pending=c.deadline_pending,
            plan_kind=plan.kind if plan else None,
            signal_at=plan.nominal_at if plan else None,
            request_kind=request.kind if request else None,
            saving_step=max(request.begun.values()) if request and request.begun else None,
            last_saved_step=c.last_saved_step, last_step=c.obs.last_step,
            step_estimate_s=c.current_step_estimate_s(),
            stop_reason=c.stop.reason if c.stop else None,
            awaiting_ack=c.mode is core.Mode.DRAINING,
        ))


def _load_state(path: str | None, now: float) -> tuple[state.JobState | None, LogNote | None]:
    """The job's state file, and the log line that says what became of it."""
    if path is None:
        return None, None
    try:
        loaded = state.load(path, now)
    except state.StateIgnored as exc:
        return None, ("warning", ev.STATE_IGNORED, {"path": path, "reason": str(exc)})
    if loaded is None:
        return None, ("info", ev.STATE_LOADED, {"path": path, "steps": 0, "saves": 0,
                                               "note": "no state file yet: the job's first run"})
    checkpoint = loaded.checkpoint
    return loaded, ("info", ev.STATE_LOADED, {
        "path": path, "steps": len(loaded.steps), "saves": len(loaded.saves),
        "longest_save_s": max(loaded.saves) if loaded.saves else None,
        "uploads": len(loaded.uploads), "longest_upload_s": max(loaded.uploads) if loaded.uploads else None,
        "checkpoint_step": checkpoint.step if checkpoint is not None else None,
        "age_s": round(now - loaded.updated_at, 3),
    })


def _child_exited(pid: int, status: int) -> core.ChildExited:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        return core.ChildExited(pid, None, signal_label(signum), signum)
    return core.ChildExited(pid, os.waitstatus_to_exitcode(status))


def _finite(value: float) -> float:
    return value if math.isfinite(value) and value >= 0 else 0.0


def child_environment(base: Mapping[str, str], socket_path: str, config: SupervisorConfig) -> dict[str, str]:
    """The child's environment: ours (minus systemd's notify socket and watchdog, which are
    esiwrap's alone), plus where to find us and which signal means "save"."""
    env = {key: value for key, value in base.items() if key not in systemd.CHILD_UNSET}
    env[SOCKET_ENV] = socket_path
    env[SIGNAL_ENV] = signal_label(config.save_signal)
    # Zero-code hooks (verl): our sitecustomize first, inert without the variables above.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap_dir(), base.get("PYTHONPATH", "")) if p)
    if config.run_id:
        env[RUN_ID_ENV] = config.run_id
    return env


def _noop_handler(signum: int, frame: object) -> None:
    """Nothing to do here: the wakeup fd already carries the signal to the loop."""
