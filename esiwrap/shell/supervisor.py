"""The supervisor: the I/O shell around the decision core (`esiwrap.core.controller`).

One thread, one selector. The loop blocks on the signal wakeup pipe, the trainer channel, the
deadline watcher's wake socket, a pidfd per attached trainer and (while stopping) pidfds of the
child's tree, with a timeout the controller sets (`wake_at`). Signal handlers do nothing in
Python: `signal.set_wakeup_fd` writes the signal number to the wakeup pipe, which `esiwrap.shell.early`
set up first thing at start (signals that came while esiwrap loaded wait there). Everything that
happens becomes an input for the controller, with the time; every input of a wake-up is applied
before the timers that fell due fire (`tick`). The controller's actions (signal these PIDs, stop
the child, log, keep the job's state, check the tree, start or stop an upload, look at the
checkpoint's filesystem, exit) are carried out here. The loop never waits on a disk
or a log reader: the state, status and metrics files are written by a thread of their own
(`esiwrap.shell.writer`), and so are the log's lines (`esiwrap.shell.log`). The `--upload`,
`--verify`, `--restore` and `--restore-manifests` helpers are the shell's own children, reaped in the
loop like the rest; what holds a checkpoint, whether it is whole (`esiwrap.shell.verify`), its
manifest and whether it is on this instance are looked at on threads (a stat can hang on a dead
mount). With `--restore`, the loop runs before the command starts: the command waits until the
controller says `StartCommand`.
Nothing here decides, and nothing here reads the controller's state but its `snapshot` (for the
status line, the metrics and the status file).
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from esiwrap import events as ev
from esiwrap.core import controller as core
from esiwrap.core import state
from esiwrap.core.controller import Controller, ControllerConfig, Now
from esiwrap.core.controller.job import Job
from esiwrap.core.effects import Effects
from esiwrap.core.runner import Runner
from esiwrap.core.snapshot import Snapshot
from esiwrap.envvars import HOOK_SWITCH_ENV, RUN_ID_ENV, SIGNAL_ENV, SOCKET_ENV
from esiwrap.errors import (
    EXIT_CHECKPOINTED,
    EXIT_FAILURE,
    EXIT_NOT_EXECUTABLE,
    CommandError,
    Halt,
)
from esiwrap.paths import bootstrap_dir
from esiwrap.shell import checkpoints, durability, early, process, statefile, systemd
from esiwrap.shell import upload_process as upload
from esiwrap.shell.channel import TrainerChannel
from esiwrap.shell.log import get_logger
from esiwrap.shell.observe import Observer, ObserveSettings
from esiwrap.shell.storage_probe import StorageProber
from esiwrap.shell.tree import ProcessTree
from esiwrap.shell.writer import FileWriter
from esiwrap.signals import signal_label, signal_number
from esiwrap.sources.base import Source
from esiwrap.sources.chain import ask, release
from esiwrap.sources.watcher import DeadlineWatcher

MAX_WAIT_S = 60.0  # re-read the wall clock at least this often: it can jump
POLL_WITHOUT_PIDFD_S = 0.2  # only while stopping, on kernels without pidfd_open
FILES_AT_EXIT_S = 10.0  # leaving waits this long at most for the last state and status writes
HAS_PIDFD = hasattr(os, "pidfd_open")
if TYPE_CHECKING:
    from esiwrap.shell.verify import Verdict

LogNote = tuple[str, str, dict[str, Any]]  # level, event, fields


@dataclass(frozen=True)
class SupervisorConfig:
    argv: Sequence[str]
    controller: ControllerConfig = field(default_factory=ControllerConfig)  # `options.controller_config`
    run_id: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)  # the run options, logged at start
    child_env: Mapping[str, str] = field(default_factory=dict)  # added for the platform (Slurm's)
    upload: str | None = None  # `--upload CMD`: run after each completed save ({path}, {step}, {manifest})
    verify: str | None = None  # `--verify CMD`: run after the built-in check ({path}, {step}); 0 = valid
    verify_builtin: bool = True  # `--verify-builtin auto`: esiwrap's own check of each checkpoint
    restore: str | None = None  # `--restore CMD`: bring the checkpoint back ({path}, {step})
    restore_manifests: str | None = None  # `--restore-manifests CMD`: copy the manifests into {dir}


@dataclass
class _Helper:
    """A helper command (upload, verify, restore, manifests), and what its end does."""

    process: upload.UploadProcess
    ended: Callable[[upload.UploadProcess, core.ChildExited], None]


@dataclass
class _NotStarted:
    """Why a helper command did not start, and the exit code that stands for it, if any."""

    error: str
    code: int | None = None


class _VerifyJob:
    """One verification the controller asked for; one that was given up is no longer the current."""

    def __init__(self, action: core.VerifyCheckpoint) -> None:
        self.action = action
        self.pid: int | None = None  # its --verify command, once it runs


class Supervisor(Effects):
    """Runs the command and carries out the core's actions in the real world (`Effects`)."""

    def __init__(
        self,
        config: SupervisorConfig,
        sources: Sequence[Source],
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        observe: ObserveSettings | None = None,
        before_checkpointed_exit: Callable[[], LogNote] | None = None,
    ) -> None:
        self.config = config
        self._before_checkpointed_exit = before_checkpointed_exit  # the Slurm requeue
        self.logger = get_logger()
        started, host = clock(), socket.gethostname()
        state_file = config.controller.state_file
        # One live run per state file: its lock first (another live run: StateLocked, exit 2), then
        # what it holds; the notes are logged as the run begins.
        self._state_lock, self._lock_notes = _lock_state(state_file, config.run_id, host, started)
        killed = ""
        for note in self._lock_notes:
            killed = note[2].get("killed_run_id") or killed
        loaded, self._state_note = _load_state(state_file, started)
        # This run's place in its job: what the state file says, what it will say (`esiwrap.core.job`)
        job = Job(loaded, started, run_id=config.run_id, host=host, argv=config.argv,
                  max_no_progress_runs=config.controller.max_no_progress_runs, killed=killed)
        self.controller = Controller(config.controller, job=job)
        self._runner = Runner(self.controller, self, self._now)  # the core, driven in the one order
        self._state_failed = False
        self._child_pid: int | None = None  # what we spawned...
        self._child_reaped = False  # ...and whether its exit was collected
        self._stopping = False  # the controller asked for the tree to be checked: it stops for good
        self._upload: upload.UploadProcess | None = None
        self._helpers: dict[int, _Helper] = {}  # upload, verify, restore, manifests: pid -> helper
        self._verify_job: _VerifyJob | None = None
        self._verified_files: dict[str, int] = {}  # a checkpoint that passed: how many files it had
        self._restore_pid: int | None = None  # the restore's (or manifests') helper
        self._restore_wanted: core.StartRestore | None = None  # asked for, its directory being made
        self._manifests: dict[int, str] = {}  # step -> its manifest file, once written
        self._manifest_files: dict[str, str] = {}  # checkpoint path -> its manifest, written by this run
        self._manifest_writes: set[int] = set()  # steps whose manifest is being written
        self._waiting_uploads: dict[int, core.StartUpload] = {}  # ...and their uploads, waiting for it
        self._held = False  # the controller looks for the checkpoint or restores it: no command yet
        self._opened = self._watching = False
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()  # from helper threads
        self._environ = dict(os.environ if environ is None else environ)
        self._clock = clock
        self._sources = list(sources)
        # Sources whose answer cannot change are local and instant: asked before the child starts.
        self._static = [s for s in sources if s.period_s is None]
        self._selector = selectors.DefaultSelector()
        self._tree = ProcessTree(self._selector)
        self._trainer_fds: dict[int, int] = {}  # pid -> pidfd
        self._trainers_polled: set[int] = set()  # trainers without a pidfd: looked at while stopping
        self._channel: TrainerChannel | None = None
        self._signals: early.Caught | None = None  # the wakeup pipe, once `run` caught the signals
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)  # a full buffer drops a wake-up byte; it never blocks a thread
        self._watcher = DeadlineWatcher([s for s in sources if s.period_s is not None], self._wake_w)
        self._prober = StorageProber(self._poke)  # the checkpoint storage's speed, off the loop
        self._systemd = systemd.Notifier.from_environ(self._environ)
        self._files = FileWriter()  # the state, status and metrics files, off the loop
        self._observer = Observer(self._selector, observe or ObserveSettings(), self._files)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        """Supervise until the child and its tree are gone; return esiwrap's exit status."""
        self._signals = early.catch()  # already done by the `esiwrap` executable, before its imports
        try:
            notes = [*self._lock_notes, *([self._state_note] if self._state_note else [])]
            for level, event, fields in notes:
                shown = {k: v for k, v in fields.items() if k != "killed_run_id"}
                getattr(self.logger, level)(event, **shown)
            self._channel = TrainerChannel(self.logger, self._clock, self._trainer_fds.__contains__)
            self._feed(core.Launch())  # the no-progress guard may end the run here (exit 78)
            if self._held:  # the checkpoint comes back first, planned against the deadline: the loop now
                self._open()
            elif self._child_pid is None:
                self._start_child()
            self._start_watcher()
            self._loop()
        except Halt as halt:
            return self._exit(halt.reason, halt.exit_status)
        except CommandError as exc:
            self.logger.error(ev.COMMAND_FAILED, reason=str(exc))
            return self._exit(str(exc), exc.exit_status)
        except Exception as exc:  # a bug of ours: say so in one line, leave the child a clean stop
            self.logger.error(ev.SUPERVISOR_FAILED, error=f"{type(exc).__name__}: {exc}", exc_info=True)
            self._forward_stop_signal()
            return self._exit(f"internal error: {exc}", EXIT_FAILURE)
        finally:
            self._close()
        return self._exit("loop ended", EXIT_FAILURE)  # pragma: no cover - the loop only halts

    def _exit(self, reason: str, code: int) -> int:
        if code == EXIT_CHECKPOINTED and self._before_checkpointed_exit is not None:
            # Last, once the child's tree is gone: a Slurm requeue signals every process of the job.
            level, event, fields = self._before_checkpointed_exit()
            getattr(self.logger, level)(event, **fields)
        if self._channel is not None:
            self._channel.tell_untold()  # refusals not logged yet: before the last line
        snapshot = self._snapshot()
        self.logger.info(ev.SUPERVISOR_EXIT, code=code, reason=reason, last_step=snapshot.last_step,
                      checkpoint_step=snapshot.last_checkpoint_step, durable_step=snapshot.durable_step,
                      lateness=snapshot.lateness())
        return code

    def _start_child(self) -> None:
        assert self._channel is not None
        env = child_environment(self._environ, self._channel.path, self.config)
        process.become_subreaper()
        pid = self._child_pid = process.spawn(self.config.argv, env, death_signal=signal.SIGTERM,
                                              signals=self._signals, callers_env=self._environ)
        host = socket.gethostname()  # which instance this run is on (`esiwrap report`)
        self._feed(core.ChildStarted(pid, tuple(self.config.argv), self.config.settings, host))
        self._open()
        self._reap()  # a child that died before the selector existed

    def _open(self) -> None:
        """The static sources asked, READY, the loop's file descriptors: once, before the loop runs
        (after the command started, or before it when a restore comes first)."""
        if self._opened:
            return
        self._opened = True
        if self._static:  # known before READY, so the first status line already has the deadline
            self._feed(core.DeadlineAnswers(tuple(ask(s, self._clock()) for s in self._static)))
        self._systemd.ready(*systemd.status_parts(self._snapshot()), time.monotonic())
        assert self._signals is not None and self._channel is not None
        self._selector.register(self._signals.read_fd, selectors.EVENT_READ, self._on_signal_bytes)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._on_watcher_wake)
        self._selector.register(self._channel, selectors.EVENT_READ, self._on_channel)

    def _start_watcher(self) -> None:
        if not self._watching:
            self._watching = True
            self._watcher.start()

    def _close(self) -> None:
        self._observer.close()
        self._watcher.stop()
        self._prober.stop()
        self._runner.finish()  # the job's state, with how this run ended, kept once more
        self._files.close(FILES_AT_EXIT_S)
        if self._state_lock is not None:
            self._state_lock.release()  # after the last state write
        for pid in list(self._trainer_fds):
            self._forget_trainer(pid)
        self._tree.close()
        self._selector.close()
        if self._signals is not None:
            early.release()  # the handlers, mask and wakeup fd this process had before
        for sock in (self._wake_r, self._wake_w):
            sock.close()
        if self._channel is not None:
            self._channel.close()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            timeout = self._next_timeout()
            wake_at = time.monotonic() + timeout
            ready = self._selector.select(timeout)
            if not ready:
                # A signal past the timeout (SIGCONT after a stop) ends select without a look at
                # the sockets (PEP 475): what waits there is taken before a timer decides.
                ready = self._selector.select(0)
            for key, _ in ready:
                key.data(key)
            now = self._now()
            # how late the loop ran against the wake-up it asked for (a starved node): plan margin
            late = now.mono - wake_at if now.mono >= wake_at else None
            self._runner.wake(late)
            snapshot = self._snapshot()
            self._tell_systemd(snapshot)
            self._publish(snapshot)

    def _snapshot(self) -> Snapshot:
        return self.controller.snapshot(self._now(), self.config.run_id, os.getpid())

    def _publish(self, snapshot: Snapshot) -> None:
        """The metrics file and endpoint, the status file: the controller's state as of now."""
        mono = time.monotonic()
        self._observer.tick(mono)
        self._observer.update(snapshot, mono)

    def _now(self) -> Now:
        return Now(self._clock(), time.monotonic())

    def _next_timeout(self) -> float:
        waits = [MAX_WAIT_S, self._systemd.ping_in(time.monotonic())]
        due = self._runner.wake_in()
        if due is not None:
            waits.append(due)
        if self._stopping and not HAS_PIDFD:
            waits.append(POLL_WITHOUT_PIDFD_S)
        mono = time.monotonic()
        observer_due = self._observer.next_wake(mono)
        if observer_due is not None:
            waits.append(observer_due - mono)
        return max(0.0, min(waits))

    def _feed(self, input_: core.Input) -> None:
        """What happened, to the core (`esiwrap.core.runner`: applied now, or after the actions
        being carried out when it follows from one of them)."""
        self._runner.feed(input_)

    # ------------------------------------------------------------------ the job's state file
    def _state_written(self, path: str, error: OSError | None) -> None:
        """From the files' thread: a state write that failed is one warning, then no more tries
        (a full disk must not flood the log or stop training)."""
        if error is not None and not self._state_failed:
            self._state_failed = True
            self.logger.warning(ev.STATE_NOT_SAVED, path=path, error=f"{error.strerror or error}")

    # ------------------------------------------------------------------ effects: the core's actions
    def log(self, action: core.Log) -> None:
        getattr(self.logger, action.level)(action.event, **action.fields)

    def send_signal(self, action: core.SendSignal) -> None:
        signum = signal_number(action.signal)
        if signum is not None:
            for pid in action.pids:
                process.send(pid, signum)

    def stop_child(self, action: core.StopChild) -> None:
        """Remember the child's tree, then send the child the stop sequence's first signal."""
        child = self._child_pid
        if child is None:
            return
        self._tree.snapshot(child)
        signum = signal_number(action.signal) if action.signal else None
        if signum is not None:
            process.send(child, signum)

    def kill_tree(self, action: core.KillTree) -> None:
        remaining = self._tree_remaining()
        if remaining:
            self.logger.warning(ev.CHILD_KILLED, signal="SIGKILL", pids=[p.pid for p in remaining])
        process.signal_all(remaining, signal.SIGKILL)

    def term_leftovers(self, action: core.TermLeftovers) -> None:
        process.signal_all(self._tree_remaining(), signal.SIGTERM)

    def check_tree(self, action: core.CheckTree) -> None:
        """While stopping: reap, watch what is left, and tell the controller how much that is."""
        self._stopping = True
        self._reap()
        for pid in sorted(self._trainers_polled):  # the stop waits for a trainer it stopped first
            if not process.pid_exists(pid):
                self._trainer_exited(pid)
        remaining = self._tree_remaining()
        self._tree.watch(remaining)
        self._feed(core.TreeChecked(len(remaining)))

    def keep_state(self, action: core.KeepState) -> None:
        """Have the job's state the core decided written to --state-file, by the files' thread: the
        newest state wins, the loop does not wait for the disk."""
        path = self.config.controller.state_file
        if path is not None and not self._state_failed:
            self._files.replace(path, state.render(action.state), self._write_state,
                                done=self._state_written)

    def _write_state(self, path: str, text: str) -> None:
        """On the files' thread: read-modify-write under the lock (no other run's record is lost,
        even one an older esiwrap wrote meanwhile), and this run's hold on the lock refreshed."""
        statefile.write_merged(path, text, self.config.run_id)
        if self._state_lock is not None:
            self._state_lock.refresh(self._clock())

    def notify_stopping(self, action: core.NotifyStopping) -> None:
        self._systemd.stopping()

    def extend_stop_timeout(self, action: core.ExtendStopTimeout) -> None:
        self._systemd.extend_stop(action.seconds)

    def probe_storage(self, action: core.ProbeStorage) -> None:
        self._prober.submit(action.path, action.previous, action.max_bytes)

    def stop_upload(self, action: core.StopUpload) -> None:
        signum = signal_number(action.signal)
        if self._upload is not None and signum is not None:
            self._upload.signal(signum)
        elif self._waiting_uploads:  # cut off before its manifest was written: it never starts
            self._waiting_uploads.clear()
            self._feed(core.UploadExited(0, None, action.signal))

    def resolve_deadline(self, action: core.ResolveDeadline) -> None:
        """Every source asked again now: the local ones here (instant), the others on their threads."""
        if self._static:
            self._feed(core.DeadlineAnswers(tuple(ask(s, self._clock()) for s in self._static)))
        self._watcher.ask_now()

    def exit(self, action: core.Exit) -> None:
        raise Halt(action.reason, action.code, action.cause)

    # ------------------------------------------------------------------ uploads and the checkpoint's disk
    def start_upload(self, action: core.StartUpload) -> None:
        """Run the --upload command for this checkpoint; its end comes through reaping. Its manifest
        is written first: an upload whose manifest is being written starts once it is."""
        template = self.config.upload
        if template is None:
            return
        if action.step in self._manifest_writes:
            self._waiting_uploads[action.step] = action
            return

        def ended(helper: upload.UploadProcess, exited: core.ChildExited) -> None:
            self._upload = None
            self._feed(core.UploadExited(exited.pid, exited.code, exited.signal, tuple(helper.tail)))

        started = self._start_helper(template, action.path, action.step, ended,
                                     manifest=self._manifests.get(action.step, ""))
        if isinstance(started, _NotStarted):
            self._feed(core.UploadExited(0, started.code, error=started.error))
            return
        self._upload = started
        self._feed(core.UploadStarted(started.pid))

    def _unregister(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def check_filesystem(self, action: core.CheckFilesystem) -> None:
        """One look at what holds the checkpoint, on a thread: a stat can hang on a dead mount."""
        path = action.path

        def work() -> Callable[[], None]:
            found = durability.filesystem_of(path)
            checked = core.FilesystemChecked(path, found.kind, found.fstype, found.mount_point, found.source)
            return lambda: self._feed(checked)

        self._off_loop(work, "esiwrap-filesystem")

    def _helper_env(self) -> dict[str, str]:
        """A helper command's environment: esiwrap's own, less systemd's, with the run's id."""
        env = {k: v for k, v in self._environ.items() if k not in systemd.CHILD_UNSET}
        if self.config.run_id:
            env[RUN_ID_ENV] = self.config.run_id
        return env

    def _off_loop(self, work: Callable[[], Callable[[], None]], name: str) -> None:
        """Run `work` on a thread; what it returns is called in the loop (a stat can hang)."""

        def run() -> None:
            self._calls.put(work())
            self._poke()

        threading.Thread(target=run, name=name, daemon=True).start()

    def _start_helper(self, template: str, path: str, step: int,
                      ended: Callable[[upload.UploadProcess, core.ChildExited], None], *,
                      manifest: str = "", directory: str = "") -> upload.UploadProcess | _NotStarted:
        """Start a helper command, its own child reaped in the loop (`ended` then), its stderr passed
        on as it comes; or why it could not start."""
        if upload.needs_path(template) and not path:
            return _NotStarted("the trainer reported no checkpoint path to put in {path}: report it in "
                               "saving(step, path)")
        try:
            helper = upload.UploadProcess.start(template, path, step, self._helper_env(), manifest=manifest,
                                                directory=directory)
        except OSError as exc:
            return _NotStarted(f"cannot start {upload.SHELL}: {exc.strerror or exc}", EXIT_NOT_EXECUTABLE)
        self._helpers[helper.pid] = _Helper(helper, ended)
        if helper.stderr_fd is not None:
            self._selector.register(helper.stderr_fd, selectors.EVENT_READ,
                                    lambda key, helper=helper: self._on_helper_stderr(key, helper))
        return helper

    def _on_helper_stderr(self, key: selectors.SelectorKey, helper: upload.UploadProcess) -> None:
        if not helper.read_stderr():
            self._unregister(key.fd)

    def _helper_reaped(self, pid: int, status: int) -> None:
        found = self._helpers.pop(pid)
        running = found.process
        fd = running.stderr_fd
        running.read_stderr()  # what it wrote before it exited is in the pipe now
        if fd is not None:
            self._unregister(fd)
        running.close()
        found.ended(running, _child_exited(pid, status))

    # ------------------------------------------------------------------ verification
    def verify_checkpoint(self, action: core.VerifyCheckpoint) -> None:
        """The built-in check on a thread, then the --verify command; CheckpointVerified."""
        job = self._verify_job = _VerifyJob(action)
        builtin = self.config.verify_builtin

        files_then = self._verified_files.get(action.previous)

        def work() -> Callable[[], None]:
            verdict = checkpoints.check(action.path, action.step, builtin)
            gone = checkpoints.previous_gone(action.previous, files_then)
            return lambda: self._checked(job, verdict, gone)

        self._off_loop(work, "esiwrap-verify")

    def _checked(self, job: _VerifyJob, verdict: Verdict, previous_gone: bool) -> None:
        """The built-in check ended: that is the answer, or the --verify command runs now."""
        if job is not self._verify_job:
            return  # given up meanwhile
        action = job.action
        by = "built-in" if self.config.verify_builtin and action.path else ""
        answer = core.CheckpointVerified(
            action.step, action.path, verdict.ok, verdict.format, verdict.checked, verdict.problem,
            verdict.fix, verdict.bytes, verdict.files, verdict.read_bytes, by or "--verify", previous_gone)
        template = self.config.verify
        if verdict.ok:
            self._verified_files = {action.path: verdict.files}  # what the next one's previous holds
        if not verdict.ok or template is None:
            self._verify_job = None
            self._feed(answer._replace(by=by or "nothing"))
            return

        def ended(helper: upload.UploadProcess, exited: core.ChildExited) -> None:
            if job is not self._verify_job:
                return
            self._verify_job = None
            both = f"{by}, --verify" if by else "--verify"
            checked = "; ".join(part for part in (verdict.checked if by else "", "--verify exited 0") if part)
            if exited.code == 0:
                self._feed(answer._replace(checked=checked, by=both))
                return
            how = f"killed by {exited.signal}" if exited.signal else f"exited with code {exited.code}"
            last = f": {helper.tail[-1]}" if helper.tail else ""
            self._feed(answer._replace(ok=False, by=both, checked=verdict.checked if by else "",
                                       problem=f"--verify {how}{last}", fix=""))

        started = self._start_helper(template, action.path, action.step, ended)
        if isinstance(started, _NotStarted):
            self._verify_job = None
            self._feed(answer._replace(ok=False, by="--verify", fix="check the --verify command",
                                       problem=f"--verify could not run: {started.error}"))
        else:
            job.pid = started.pid

    def stop_verify(self, action: core.StopVerify) -> None:
        """Give the verification up: its command is killed; a built-in check is left to end."""
        job, self._verify_job = self._verify_job, None
        signum = signal_number(action.signal)
        found = self._helpers.get(job.pid) if job is not None and job.pid is not None else None
        if found is not None and signum is not None:
            found.process.signal(signum)

    # ------------------------------------------------------------------ manifests
    def write_manifest(self, action: core.WriteManifest) -> None:
        """Beside the checkpoint, on a thread; its upload waits for it."""
        self._manifest_writes.add(action.step)
        earlier = dict(self._manifest_files)

        def work() -> Callable[[], None]:
            try:
                written, error = checkpoints.write_manifest(action)
            except OSError as exc:
                written, error = "", f"{exc.strerror or exc}"
            gone = checkpoints.remove_stale_manifests(earlier)
            return lambda: self._manifest_written(action, written, error, gone)

        self._off_loop(work, "esiwrap-manifest")

    def _manifest_written(self, action: core.WriteManifest, written: str, error: str,
                          gone: list[str]) -> None:
        self._manifest_writes.discard(action.step)
        for path in gone:
            self._manifest_files.pop(path, None)
        if written:
            self._manifest_files[action.path] = written
            self._manifests = {step: f for step, f in self._manifests.items() if step >= action.step - 100}
            self._manifests[action.step] = written
        if error:
            self.logger.warning(ev.MANIFEST_NOT_WRITTEN, path=checkpoints.manifest_path(action.path)
                                if action.path else None, error=error, written_to=written or None)
        waiting = self._waiting_uploads.pop(action.step, None)
        if waiting is not None:
            self.start_upload(waiting)

    # ------------------------------------------------------------------ before the command: the way back
    def look_for_checkpoint(self, action: core.LookForCheckpoint) -> None:
        self._held = True
        path = action.path

        def work() -> Callable[[], None]:
            here = checkpoints.present(path)
            return lambda: self._feed(core.CheckpointLooked(path, here))

        self._off_loop(work, "esiwrap-look")

    def fetch_manifests(self, action: core.FetchManifests) -> None:
        """Run --restore-manifests into an empty directory, then read what it put there."""
        self._held = True
        template = self.config.restore_manifests
        if template is None:
            self._feed(core.ManifestsFetched(None, error="no --restore-manifests command"))
            return
        directory = checkpoints.empty_dir()

        def ended(helper: upload.UploadProcess, exited: core.ChildExited) -> None:
            self._restore_pid = None
            tail = tuple(helper.tail)

            def work() -> Callable[[], None]:
                found, rejected = checkpoints.read_manifests(directory, self._clock())
                checkpoints.remove_dir(directory)
                return lambda: self._feed(core.ManifestsFetched(exited.code, exited.signal, tuple(found),
                                                                tuple(rejected), tail))

            self._off_loop(work, "esiwrap-manifests")

        started = self._start_helper(template, "", 0, ended, directory=directory)
        if isinstance(started, _NotStarted):
            checkpoints.remove_dir(directory)
            self._feed(core.ManifestsFetched(None, error=started.error))
        else:
            self._restore_pid = started.pid

    def start_restore(self, action: core.StartRestore) -> None:
        self._held = True
        template = self.config.restore
        if template is None:
            self._feed(core.RestoreExited(0, None, error="no --restore command"))
            return
        self._restore_wanted = action

        def work() -> Callable[[], None]:  # where it goes back to may be a mount that hangs
            checkpoints.prepare_restore(action.path)
            return lambda: self._run_restore(template, action)

        self._off_loop(work, "esiwrap-restore")

    def _run_restore(self, template: str, action: core.StartRestore) -> None:
        if self._restore_wanted is not action:
            return  # stopped (cut off, SIGTERM) while its directory was being made
        self._restore_wanted = None

        def ended(helper: upload.UploadProcess, exited: core.ChildExited) -> None:
            self._restore_pid = None
            self._feed(core.RestoreExited(exited.pid, exited.code, exited.signal, tuple(helper.tail)))

        started = self._start_helper(template, action.path, action.step, ended)
        if isinstance(started, _NotStarted):
            self._feed(core.RestoreExited(0, None, error=started.error))
            return
        self._restore_pid = started.pid
        self._feed(core.RestoreStarted(started.pid))

    def stop_restore(self, action: core.StopRestore) -> None:
        self._restore_wanted = None
        signum = signal_number(action.signal)
        found = self._helpers.get(self._restore_pid) if self._restore_pid is not None else None
        if found is not None and signum is not None:
            found.process.signal(signum)

    def start_command(self, action: core.StartCommand) -> None:
        """The checkpoint is back (or need not be): the command starts now."""
        self._held = False
        if self._child_pid is None:
            self._start_child()

    def release_capacity(self, action: core.ReleaseCapacity) -> None:
        """On the way out with exit 75: each source may let its platform go ahead. Only the
        exit waits for it (the child's tree is gone), each source bounding its own time."""
        for source in self._sources:
            released = release(source)
            if released is not None:
                log = self.logger.info if released.ok else self.logger.warning
                log(ev.CAPACITY_RELEASED, source=source.name, ok=released.ok, detail=released.detail)

    def _tree_remaining(self) -> list[Any]:
        """The child's tree as the stop sequence sees it: without the helpers (upload, verify),
        whose end the controller decides (they may have to outlast the child)."""
        remaining = self._tree.remaining()
        if not self._helpers:
            return remaining
        theirs = {pid for helper in self._helpers
                  for pid in (helper, *(p.pid for p in process.descendants(helper)))}
        return [p for p in remaining if p.pid not in theirs]

    def _forward_stop_signal(self) -> None:
        child = self._child_pid
        signum = signal_number(self.config.controller.stop_signal)
        if child is not None and not self._child_reaped and signum is not None:
            process.send(child, signum)

    def _on_signal_bytes(self, _: selectors.SelectorKey) -> None:
        assert self._signals is not None
        try:
            data = os.read(self._signals.read_fd, 512)
        except (BlockingIOError, InterruptedError):
            return
        for signum in data:
            if signum == signal.SIGCHLD:
                self._reap()
            else:
                self._feed(core.SignalReceived(signal_label(signum)))

    def _poke(self) -> None:
        """Wake the loop from another thread (a full buffer already holds a wake-up)."""
        with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
            self._wake_w.send(b"\0")

    def _on_watcher_wake(self, _: selectors.SelectorKey) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            self._wake_r.recv(512)
        answers = self._watcher.drain()
        if answers:
            self._feed(core.DeadlineAnswers(tuple(answers)))
        for m in self._prober.drain():
            self._feed(core.StorageProbed(m.path, m.bandwidth_bps, m.written_bytes, m.seconds, m.source,
                                          m.error))
        while not self._calls.empty():
            self._calls.get_nowait()()

    def _on_channel(self, _: selectors.SelectorKey) -> None:
        """What trainers said (`esiwrap.shell.channel`: what may not be believed is refused there,
        or by the controller); a trainer that said hello from our tree is watched until it exits."""
        assert self._channel is not None
        for input_ in self._channel.receive(time.monotonic()):
            if isinstance(input_, core.Hello) and input_.descendant:
                self._watch_trainer(input_.pid)  # after a bye too: its exit frees the pid
            self._feed(input_)

    def refuse_message(self, action: core.RefuseMessage) -> None:
        if self._channel is not None:
            self._channel.refuse(action)

    def _watch_trainer(self, pid: int) -> None:
        """A pidfd per trainer: the loop learns at once when one exits (no polling)."""
        if pid in self._trainer_fds:
            return
        fd = process.open_pidfd(pid)
        if fd is None:  # no pidfd here (old kernel) or already gone: reaping tells, or the stop's look
            self._trainers_polled.add(pid)
            return
        self._trainer_fds[pid] = fd
        self._selector.register(fd, selectors.EVENT_READ, lambda _key, pid=pid: self._trainer_exited(pid))

    def _trainer_exited(self, pid: int) -> None:
        self._trainers_polled.discard(pid)
        self._forget_trainer(pid)
        self._feed(core.TrainerGone(pid))

    def _forget_trainer(self, pid: int) -> None:
        if self._channel is not None:
            self._channel.forget(pid)
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
            if pid == self._child_pid:
                self._child_reaped = True
                self._forget_trainer(pid)
                self._feed(_child_exited(pid, status))
            elif pid in self._helpers:
                self._helper_reaped(pid, status)
            elif pid in self._trainer_fds or pid in self._trainers_polled:
                self._trainer_exited(pid)

    # ------------------------------------------------------------------ systemd
    def _tell_systemd(self, snapshot: Snapshot) -> None:
        """STATUS= when it changed, WATCHDOG=1 when due; both do nothing outside systemd."""
        if self._systemd.enabled:
            mono = time.monotonic()
            self._systemd.status(*systemd.status_parts(snapshot), mono)
            self._systemd.ping_if_due(mono)


def _lock_state(path: str | None, run_id: str, host: str, now: float,
                ) -> tuple[statefile.StateLock | None, list[LogNote]]:
    """The state file's lock (`statefile.StateLock`) and what to log about it: one taken over from
    a run that is gone (`state_lock_taken_over`; "killed_run_id" names a run killed on this very
    machine), or why there is none (a lock file that cannot be made: the run goes on without)."""
    if path is None:
        return None, []
    me = statefile.Holder(host, os.getpid(), run_id, now, now, statefile.boot_id())
    try:
        lock, taken = statefile.StateLock.take(path, me, now)
    except OSError as exc:
        return None, [("warning", ev.STATE_LOCK_FAILED, {
            "path": path + statefile.LOCK_SUFFIX, "error": f"{exc.strerror or exc}",
            "note": "no lock: nothing keeps a second run off this state file"})]
    if taken is None:
        return lock, []
    fields: dict[str, Any] = {"path": path, **taken.holder.fields(), "why": taken.why,
                              "recorded_as": "killed" if taken.killed else "interrupted"}
    if taken.killed:
        fields["killed_run_id"] = taken.holder.run_id
    return lock, [("warning", ev.STATE_LOCK_TAKEN_OVER, fields)]


def _load_state(path: str | None, now: float) -> tuple[state.JobState | None, LogNote | None]:
    """The job's state file, and the log line that says what became of it."""
    if path is None:
        return None, None
    try:
        loaded = statefile.load(path, now)
    except state.StateIgnored as exc:
        return None, ("warning", ev.STATE_IGNORED, {"path": path, "reason": str(exc)})
    if loaded is None:
        return None, ("info", ev.STATE_LOADED, {"path": path, "steps": 0, "saves": 0,
                                               "note": "no state file yet: the job's first run"})
    return loaded, ("info", ev.STATE_LOADED, {
        "path": path, "steps": len(loaded.steps), "saves": len(loaded.saves),
        "longest_save_s": max(loaded.saves) if loaded.saves else None,
        "uploads": len(loaded.uploads), "longest_upload_s": max(loaded.uploads) if loaded.uploads else None,
        "checkpoint_step": loaded.checkpoint.step if loaded.checkpoint is not None else None,
        "runs": len(loaded.runs),
        "age_s": round(now - loaded.updated_at, 3),
    })


def _child_exited(pid: int, status: int) -> core.ChildExited:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        return core.ChildExited(pid, None, signal_label(signum), signum)
    return core.ChildExited(pid, os.waitstatus_to_exitcode(status))


def child_environment(base: Mapping[str, str], socket_path: str, config: SupervisorConfig) -> dict[str, str]:
    """The child's environment: ours (minus systemd's notify socket and watchdog, which are
    esiwrap's alone), plus where to find us and which signal means "save"."""
    env = {key: value for key, value in base.items() if key not in systemd.CHILD_UNSET}
    env[SOCKET_ENV] = socket_path
    env[SIGNAL_ENV] = config.controller.save_signal
    env.update(config.child_env)
    # Zero-code hooks (verl): our sitecustomize first, inert without the variables above; with the
    # hooks off (ESIWRAP_HOOK=0), PYTHONPATH stays the caller's.
    if base.get(HOOK_SWITCH_ENV, "1") != "0":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap_dir(), base.get("PYTHONPATH", "")) if p)
    if config.run_id:
        env[RUN_ID_ENV] = config.run_id
    return env

