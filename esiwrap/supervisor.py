"""The supervisor: one thread, one selector, one state machine.

The loop blocks on the signal wakeup socket, the trainer channel, the deadline watcher's wake
socket, and (while stopping) pidfds of the child tree, with a timeout set by the next timer:
the planned save signal, the deadline, or a stop grace period. Signal handlers do nothing in
Python; `signal.set_wakeup_fd` writes the signal number to the wakeup socket and the loop
dispatches it to `_handle_<signame>`.

Phases: RUNNING (no save outstanding or one requested) -> STOPPING -> exit; or RUNNING ->
CONTINUING when `--after-save continue` leaves the child running after the last planned save.
"""

from __future__ import annotations

import contextlib
import enum
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psutil

from esiwrap import process, systemd
from esiwrap.channel import SIGNAL_ENV, SOCKET_ENV, ChannelServer, Message
from esiwrap.deadline import Answer, Deadline, Source, iso_utc, remote, winner
from esiwrap.errors import (
    EXIT_CHECKPOINTED,
    EXIT_FAILURE,
    EXIT_SAVE_MISSED,
    CommandError,
    Halt,
    exit_status_of,
)
from esiwrap.integrations import bootstrap_dir
from esiwrap.log import get_logger
from esiwrap.policy import (
    Observations,
    PolicyConfig,
    SavePlan,
    moved_enough,
    needed_s,
    renewal_reopens_insurance,
    replan,
    save_estimate_s,
    step_estimate_s,
)
from esiwrap.signals import signal_number
from esiwrap.tree import ProcessTree
from esiwrap.watcher import DeadlineWatcher

FORWARDED = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD, *FORWARDED)
MAX_WAIT_S = 60.0  # re-read the wall clock at least this often: it can jump
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the tree to vanish
STOP_TIMEOUT_MARGIN_S = 5.0  # asked of systemd on top of our own stop timeline
POLL_WITHOUT_PIDFD_S = 0.2  # only while stopping, on kernels without pidfd_open
HAS_PIDFD = hasattr(os, "pidfd_open")
DEADLINE_CHANGE_S = 1.0  # smaller moves are the same deadline said twice
AfterSave = Literal["stop", "continue"]
OnSigterm = Literal["checkpoint", "forward"]


class Phase(enum.Enum):
    RUNNING = "running"
    CONTINUING = "continuing"
    STOPPING = "stopping"


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


@dataclass
class Trainer:
    """A process that said hello on the channel."""

    pid: int
    rank: int
    saves: bool
    signal: bool
    stop_signal: int | None
    attached_at: float


@dataclass
class SaveRequest:
    reason: str
    kind: str
    requested_at: float
    signalled: set[int] = field(default_factory=set)
    begun: dict[int, int] = field(default_factory=dict)  # pid -> step
    done: dict[int, Message] = field(default_factory=dict)
    save_started_mono: float | None = None


@dataclass
class StopState:
    reason: str
    exit_status: int | None  # None: the child's own status
    grace_until: float  # monotonic
    killed: bool = False
    kill_until: float = 0.0
    leftovers_signalled: bool = False


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        sources: Sequence[Source],
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.log = get_logger()
        self._sources = list(sources)
        self._environ = dict(os.environ if environ is None else environ)
        self._clock = clock
        self.obs = Observations(config.policy.step_window)
        self.phase = Phase.RUNNING
        self.deadline: Deadline | None = None
        self._known: dict[str, Deadline] = {}
        self._unavailable: dict[str, str] = {}
        self.trainers: dict[int, Trainer] = {}
        self.child_pid: int | None = None
        self.child_status: int | None = None
        self.request: SaveRequest | None = None
        self.plan: SavePlan | None = None
        self._logged_signal_at: float | None = None
        self._warned_too_close = False
        self.saves_done = 0  # acknowledged saves against the current deadline
        self.any_save_completed = False
        self.last_saved_step: int | None = None
        self._ack_until: float | None = None  # monotonic: waiting for a save before stopping
        self._sigint_count = 0
        self.stop: StopState | None = None
        self._selector = selectors.DefaultSelector()
        self._tree = ProcessTree(self._selector)
        self._channel: ChannelServer | None = None
        self._signal_r, self._signal_w = socket.socketpair()
        self._wake_r, self._wake_w = socket.socketpair()
        self._watcher = DeadlineWatcher(self._sources, self._wake_w)
        self._old_handlers: dict[int, Any] = {}
        self._old_wakeup_fd = -1
        self._systemd = systemd.Notifier.from_environ(self._environ)

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
            self.log.error("command_failed", reason=str(exc))
            return self._exit(str(exc), exc.exit_status)
        except Exception as exc:  # a bug of ours: say so in one line, leave the child a clean stop
            self.log.error("supervisor_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
            self._forward(self._stop_signal())
            return self._exit(f"internal error: {exc}", EXIT_FAILURE)
        finally:
            self._close()
        return self._exit("loop ended", EXIT_FAILURE)  # pragma: no cover - the loop only halts

    def _exit(self, reason: str, code: int) -> int:
        self.log.info("supervisor_exit", code=code, reason=reason)
        return code

    def _start_child(self) -> None:
        assert self._channel is not None
        env = child_environment(self._environ, self._channel.path, self.config)
        process.become_subreaper()
        self.child_pid = process.spawn(self.config.argv, env, death_signal=signal.SIGTERM)
        self.log.info("child_started", pid=self.child_pid, argv=list(self.config.argv))
        self._systemd.ready(*self._status_parts(), time.monotonic())
        for sock in (self._signal_r, self._wake_r):
            sock.setblocking(False)
        self._selector.register(self._signal_r, selectors.EVENT_READ, self._on_signal_bytes)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._on_watcher_wake)
        self._selector.register(self._channel, selectors.EVENT_READ, self._on_channel)
        self._reap()  # a child that died before the selector existed

    def _install_signal_handlers(self) -> None:
        self._signal_w.setblocking(False)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._signal_w.fileno(), warn_on_full_buffer=False)
        for signum in HANDLED:
            # The C-level handler writes the number to the wakeup fd; the Python one does nothing.
            self._old_handlers[signum] = signal.signal(signum, _noop_handler)

    def _close(self) -> None:
        self._watcher.stop()
        for signum, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._old_wakeup_fd)
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
            self._housekeeping()
            self._tell_systemd()

    def _next_timeout(self) -> float:
        now, mono = self._clock(), time.monotonic()
        waits = [MAX_WAIT_S, self._systemd.ping_in(mono)]
        if self.phase is Phase.RUNNING and self.deadline is not None:
            waits.append(self.deadline.at - now)
            if self.plan is not None and self.request is None:
                waits.append(self.plan.signal_at - now)
            if self._waiting_for_a_trainer():
                waits.append((self._unattached_stop_at() or now) - now)
        if self._ack_until is not None:
            waits.append(self._ack_until - mono)
        if self.stop is not None:
            waits.append((self.stop.kill_until if self.stop.killed else self.stop.grace_until) - mono)
            if not HAS_PIDFD:
                waits.append(POLL_WITHOUT_PIDFD_S)
        return max(0.0, min(waits))

    def _housekeeping(self) -> None:
        now, mono = self._clock(), time.monotonic()
        if self.phase is Phase.STOPPING:
            self._advance_stop(mono)
            return
        if self._ack_until is not None:
            if mono >= self._ack_until:
                self._ack_wait_over(mono)
            return  # stopping after this save, whatever the deadline says
        if self.phase is not Phase.RUNNING or self.deadline is None:
            return
        if now >= self.deadline.at:
            self._deadline_reached(now)
        elif self._waiting_for_a_trainer() and now >= (self._unattached_stop_at() or now):
            self._begin_stop("no trainer attached to save", EXIT_SAVE_MISSED)
        elif self.plan is not None and self.request is None and now >= self.plan.signal_at:
            self._request_save("deadline", now)

    # ------------------------------------------------------------------ dispatch
    def _on_signal_bytes(self, _: selectors.SelectorKey) -> None:
        try:
            data = self._signal_r.recv(512)
        except (BlockingIOError, InterruptedError):
            return
        for signum in data:
            name = process.signal_name(signum).lower()
            handler = getattr(self, f"_handle_{name}", None)
            if handler is not None:
                handler()
            elif signum in FORWARDED:
                self._forward(signum)

    def _on_watcher_wake(self, _: selectors.SelectorKey) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            self._wake_r.recv(512)
        self._take_answers(self._watcher.drain())

    def _on_channel(self, _: selectors.SelectorKey) -> None:
        assert self._channel is not None
        for message in self._channel.receive():
            handler = getattr(self, f"_on_{message.type}")
            handler(message)

    # ------------------------------------------------------------------ signals to esiwrap
    def _handle_sigchld(self) -> None:
        self._reap()

    def _handle_sigint(self) -> None:
        self._sigint_count += 1
        if self._sigint_count >= 2:
            self.log.warning("child_stopping", signal="SIGKILL", grace_s=0, reason="second SIGINT")
            self._begin_stop("interrupted twice", None, immediate=True)
        else:
            self._forward(signal.SIGINT)

    def _handle_sigterm(self) -> None:
        if self.config.on_sigterm == "forward" or self.phase is Phase.STOPPING:
            self._forward(signal.SIGTERM)
            return
        if self._ack_until is not None:
            return  # already turning a SIGTERM into a checkpoint
        self._systemd.stopping()
        if self._progress_is_saved() or not self._signal_targets():
            status = EXIT_CHECKPOINTED if self._progress_is_saved() else None
            self._begin_stop("SIGTERM", status)
            return
        self._ack_until = time.monotonic() + self.config.stop_grace_s
        self._extend_stop_timeout()
        if self.request is None:
            self._request_save("sigterm", self._clock())
        else:
            self.request.reason = "sigterm"

    def _handle_sigusr1(self) -> None:
        if self.phase is not Phase.STOPPING and self.request is None:
            self._request_save("manual", self._clock())

    def _forward(self, signum: int) -> None:
        if self.child_pid is not None and self.child_status is None:
            process.send(self.child_pid, signum)

    # ------------------------------------------------------------------ channel messages
    def _on_hello(self, message: Message) -> None:
        wants_signal = message.get_bool("signal", True)
        if wants_signal and not process.is_descendant(message.pid, os.getpid()):
            # we only ever signal our own tree; relayed processes say signal=false
            self.log.warning("trainer_rejected", pid=message.pid, reason="not a descendant of esiwrap")
            return
        now = self._clock()
        stop_name = message.get_str("stop_signal")
        self.trainers[message.pid] = Trainer(
            pid=message.pid,
            rank=message.get_int("rank"),
            saves=message.get_bool("saves", True),
            signal=wants_signal,
            stop_signal=signal_number(stop_name) if stop_name else None,
            attached_at=now,
        )
        extra = {k: v for k, v in message.fields.items() if k not in _RESERVED_KEYS}
        self.log.info("trainer_attached", pid=message.pid, **extra)
        self.obs.trainer_started(now)
        if self.request is not None and wants_signal and message.pid not in self.request.signalled:
            self._signal([message.pid])  # a save is due: this trainer joins it at once
        self._replan(now)

    def _on_bye(self, message: Message) -> None:
        self.trainers.pop(message.pid, None)

    def _on_step(self, message: Message) -> None:
        if message.pid != self._timing_pid():
            return
        now = self._clock()
        step = message.get_int("step")
        interval = self.obs.record_step(step, message.get_float("duration_s"), now)
        self.log.debug("step_observed", step=step, duration_s=round(interval, 3))
        self._replan(now)

    def _on_save_begin(self, message: Message) -> None:
        step = message.get_int("step")
        self._adopt_peer_request(message)
        request = self.request
        if request is not None:
            first = not request.begun
            request.begun[message.pid] = step
            if first:
                request.save_started_mono = time.monotonic()
                self.log.info("save_started", step=step, pid=message.pid, requested=True)
        else:
            self.log.info("save_started", step=step, pid=message.pid, requested=False)

    def _on_save_end(self, message: Message) -> None:
        now = self._clock()
        step = message.get_int("step")
        if not message.get_bool("ok", True):
            self.log.error("save_failed", step=step, pid=message.pid, error=message.get_str("error"))
            return  # the trainer keeps its flag and tries again at the next boundary
        self._adopt_peer_request(message)
        request = self.request
        if request is None:
            self.obs.record_save(message.get_float("duration_s"))
            self._save_completed_log(step, [message], now, requested=False)
            self.last_saved_step = step
            return
        request.done[message.pid] = message
        if self._all_acknowledged(request):
            self._acknowledged(request, now)

    # ------------------------------------------------------------------ deadline
    def _take_answers(self, answers: Sequence[Answer]) -> None:
        for answer in answers:
            if answer.withdrawn:  # a node that left the cluster: its deadline no longer counts
                known = self._known.pop(answer.source, None)
                if known is not None or self._unavailable.pop(answer.source, None) is not None:
                    self.log.info("deadline_withdrawn", source=answer.source, reason=answer.reason)
            elif answer.deadline is not None:
                self._known[answer.source] = answer.deadline
                self._unavailable.pop(answer.source, None)
            elif self._unavailable.get(answer.source) != answer.reason:
                self._unavailable[answer.source] = answer.reason
                level = self.log.info if answer.expected else self.log.warning
                level("deadline_unavailable", source=answer.source, reason=answer.reason)
        new = winner(Answer(d.source, deadline=d) for d in self._known.values())
        if new is not None:
            self._set_deadline(new)

    def _set_deadline(self, new: Deadline) -> None:
        now = self._clock()
        old = self.deadline
        if old is not None and abs(old.at - new.at) < DEADLINE_CHANGE_S:
            return
        self.deadline = new
        if old is None:
            self.log.info(
                "deadline_resolved", source=new.source, deadline=new.iso(),
                remaining_s=round(new.at - now, 3), raw=new.raw, lead_s=new.lead_s, **new.detail,
            )
        else:
            self.log.warning(
                "deadline_changed", old=old.iso(), new=new.iso(), source=new.source,
                remaining_s=round(new.at - now, 3), raw=new.raw, **new.detail,
            )
        if self.phase is Phase.CONTINUING and (old is None or new.at > old.at):
            self.phase, self.saves_done = Phase.RUNNING, 0  # a renewal: plan against it afresh
        elif old is not None and new.at > old.at and self._renewal_fits_insurance(new.at, now):
            self.saves_done, self.plan = 0, None  # renewed after a save: insure the new stretch too
        if new.at <= now and self.phase is Phase.RUNNING and self._ack_until is None:
            self._deadline_already_passed(now)
            return
        self._replan(now)

    def _renewal_fits_insurance(self, deadline: float, now: float) -> bool:
        """A later deadline while running, after a save: is there room for a new insurance save?"""
        if self.phase is not Phase.RUNNING or self.request is not None or self.saves_done == 0:
            return False
        return renewal_reopens_insurance(deadline, self.obs, self.config.policy, now)

    def _deadline_already_passed(self, now: float) -> None:
        """Learned too late: save at once if anything can, give it --stop-grace, then stop."""
        self.log.warning("deadline_too_close", remaining_s=round(self._remaining(now), 3),
                         needed_s=None, action="save now, then stop")
        self._ack_until = time.monotonic() + self.config.stop_grace_s
        if self.request is None:
            self._request_save("deadline", now)

    def _deadline_reached(self, now: float) -> None:
        if self.any_save_completed:
            self._begin_stop("deadline reached", EXIT_CHECKPOINTED)
            return
        self.log.error("save_missed", remaining_s=round(self._remaining(now), 3))
        self._begin_stop("deadline passed without an acknowledged save", EXIT_SAVE_MISSED)

    # ------------------------------------------------------------------ planning
    def _replan(self, now: float) -> None:
        if self.phase is not Phase.RUNNING or self.deadline is None or self.request is not None:
            return
        plan = replan(self.deadline.at, self.obs, self.config.policy, self.saves_done, self.plan, now)
        if plan is None:
            self._no_further_save()
            return
        self.plan = plan
        if self.saves_done == 0 and plan.signal_at <= now and not self._warned_too_close:
            self._warned_too_close = True
            self.log.warning(
                "deadline_too_close", remaining_s=round(self._remaining(now), 3),
                needed_s=round(needed_s(plan), 3),
            )
        # The log shows the plan while steps keep their usual length; the timer may come earlier
        # when a step runs long, and that is logged when the signal is sent.
        if moved_enough(self._logged_signal_at, plan.nominal_at):
            self._logged_signal_at = plan.nominal_at
            self.log.info(
                "save_scheduled", kind=plan.kind, signal_at=iso_utc(plan.nominal_at),
                in_s=round(plan.nominal_at - now, 3), step_estimate_s=round(plan.step_estimate_s, 3),
                save_estimate_s=round(plan.save_estimate_s, 3), redundant_s=plan.reserve_s,
            )

    def _no_further_save(self) -> None:
        self.plan = None
        if self.config.after_save == "stop":
            self._begin_stop("checkpoint complete", EXIT_CHECKPOINTED)
        else:
            self.phase = Phase.CONTINUING
            self.log.info("training_continues", reason="--after-save continue")

    def _request_save(self, reason: str, now: float) -> None:
        targets = self._signal_targets()
        if not targets and reason == "manual":
            self.log.warning("no_trainer_attached", action="ignored", reason=reason)
            return
        kind = self.plan.kind if reason == "deadline" and self.plan is not None else reason
        self.request = SaveRequest(reason=reason, kind=kind, requested_at=now)
        plan = self.plan if reason == "deadline" and self.plan is not None else None
        planned = {} if plan is None else {  # the plan as it stood when it fired (for `esiwrap report`)
            "planned_at": iso_utc(plan.signal_at), "step_estimate_s": round(plan.step_estimate_s, 3),
            "save_estimate_s": round(plan.save_estimate_s, 3),
        }
        self.log.info(
            "save_requested", reason=reason, kind=kind, remaining_s=round(self._remaining(now), 3),
            signal=process.signal_name(self.config.save_signal), pids=targets, **planned,
        )
        if targets:
            self._signal(targets)
        else:
            # Nothing registered (yet): a trainer that attaches in time is signalled at once;
            # otherwise the child is stopped gracefully, --stop-grace before the deadline.
            self.log.warning("no_trainer_attached", action="stop", stop_at=self._unattached_stop_iso())

    def _signal(self, pids: Sequence[int]) -> None:
        assert self.request is not None
        for pid in pids:
            process.send(pid, self.config.save_signal)
            self.request.signalled.add(pid)

    def _unattached_stop_at(self) -> float | None:
        """When a save is due but nothing can save: the latest graceful stop, --stop-grace before
        the deadline; if that had passed when the save was asked for, a trainer may still attach
        and save up to the deadline itself."""
        if self.deadline is None:
            return None
        graceful = self.deadline.at - self.config.stop_grace_s
        asked = self.request.requested_at if self.request is not None else graceful
        return graceful if graceful > asked else self.deadline.at

    def _unattached_stop_iso(self) -> str | None:
        at = self._unattached_stop_at()
        return iso_utc(at) if at is not None else None

    def _waiting_for_a_trainer(self) -> bool:
        return self.request is not None and not self.request.signalled

    def _signal_targets(self) -> list[int]:
        if self.config.signal_child and self.child_pid is not None and self.child_status is None:
            return [self.child_pid]
        return [t.pid for t in self._live_trainers() if t.signal]

    def _live_trainers(self) -> list[Trainer]:
        for pid in [pid for pid in self.trainers if not psutil.pid_exists(pid)]:
            del self.trainers[pid]
        return list(self.trainers.values())

    def _timing_pid(self) -> int | None:
        trainers = sorted(self.trainers.values(), key=lambda t: (t.rank, t.attached_at))
        return trainers[0].pid if trainers else None

    def _all_acknowledged(self, request: SaveRequest) -> bool:
        savers = {t.pid for t in self._live_trainers() if t.saves}
        if not savers:  # e.g. --signal-child with a trainer that only reports saves
            return bool(request.done)
        return savers <= set(request.done)

    def _acknowledged(self, request: SaveRequest, now: float) -> None:
        messages = list(request.done.values())
        self.obs.record_requested_save(max(m.get_float("duration_s") for m in messages), now)
        self.any_save_completed = True
        self.request = None
        step = max(m.get_int("step") for m in messages)
        self.last_saved_step = step
        self._save_completed_log(step, messages, now, requested=True, kind=request.kind)
        if self._ack_until is not None:
            self._ack_until = None
            self._begin_stop(f"checkpoint complete after {request.reason}", EXIT_CHECKPOINTED)
            return
        if request.reason == "peer":
            self._begin_stop("checkpoint complete after a peer node's request", EXIT_CHECKPOINTED)
            return
        if request.reason == "manual":
            return  # a save by hand changes nothing in the plan
        self.saves_done += 1
        self.plan = None
        self._logged_signal_at = None  # the next plan is a new save: always log it
        self._replan(now)

    def _save_completed_log(
        self, step: int, messages: list[Message], now: float, *, requested: bool, kind: str = ""
    ) -> None:
        paths = sorted({m.get_str("path") for m in messages if m.get_str("path")})
        self.log.info(
            "save_completed", step=step, requested=requested, kind=kind or None,
            duration_s=round(max(m.get_float("duration_s") for m in messages), 3),
            path=paths[0] if len(paths) == 1 else (paths or None),
            remaining_s=round(self._remaining(now), 3) if self.deadline else None,
        )

    def _progress_is_saved(self) -> bool:
        """A completed save holds the latest step: nothing would be gained by another."""
        return self.last_saved_step is not None and self.last_saved_step >= (self.obs.last_step or 0)

    def _ack_wait_over(self, mono: float) -> None:
        """--stop-grace after a SIGTERM (or a deadline learned too late) is over."""
        request = self.request
        if request is not None and request.save_started_mono is not None:
            # A save is being written: do not kill it while it can still finish in time.
            limit = request.save_started_mono + max(
                self.config.stop_grace_s, 3 * save_estimate_s(self.obs, self.config.policy)
            )
            if mono < limit and (self.deadline is None or self._clock() < self.deadline.at):
                self._ack_until = limit
                self.log.info("stop_extended", until_s=round(limit - mono, 3), reason="save in progress")
                self._extend_stop_timeout()
                return
        self._ack_until = None
        self.log.warning("save_missed", remaining_s=round(self._remaining(self._clock()), 3),
                         reason="no acknowledgement within --stop-grace")
        if self._progress_is_saved():
            self._begin_stop("stop requested, latest step already saved", EXIT_CHECKPOINTED)
        elif self.deadline is not None and self._clock() >= self.deadline.at:
            self._begin_stop("deadline passed without an acknowledged save", EXIT_SAVE_MISSED)
        else:
            self._begin_stop("SIGTERM", None)

    def _remaining(self, now: float) -> float:
        return self.deadline.at - now if self.deadline is not None else float("nan")

    # ------------------------------------------------------------------ several nodes
    def _on_deadline(self, message: Message) -> None:
        """Another node's deadline answer, relayed by a Ray driver (`ray_nodes`)."""
        answer = remote.from_fields(message.fields)
        if answer is not None:
            self._take_answers([answer])

    def _adopt_peer_request(self, message: Message) -> None:
        """A save another node's esiwrap asked for (the ranks agreed on it in their all-reduce)
        is this node's save too: the job ends after it on every node, so it is this node's
        request, and esiwrap stops after it (`peer: true` in the trainer's save messages)."""
        if self.request is not None or self.phase is Phase.STOPPING or not message.get_bool("peer", False):
            return
        now = self._clock()
        self.request = SaveRequest(reason="peer", kind="peer", requested_at=now, signalled={message.pid})
        self.log.info("save_requested", reason="peer", kind="peer", pids=[],
                      remaining_s=round(self._remaining(now), 3) if self.deadline else None)

    # ------------------------------------------------------------------ systemd
    def _tell_systemd(self) -> None:
        """STATUS= when it changed, WATCHDOG=1 when due; both do nothing outside systemd."""
        if self._systemd.enabled:
            mono = time.monotonic()
            self._systemd.status(*self._status_parts(), mono)
            self._systemd.ping_if_due(mono)

    def _status_parts(self) -> tuple[str, str]:
        request, plan = self.request, self.plan
        return systemd.status_parts(systemd.StatusFacts(
            now=self._clock(), phase=self.phase.value,
            deadline_at=self.deadline.at if self.deadline else None,
            source=self.deadline.source if self.deadline else None,
            plan_kind=plan.kind if plan else None,
            signal_at=self._logged_signal_at if plan else None,
            request_kind=request.kind if request else None,
            saving_step=max(request.begun.values()) if request and request.begun else None,
            last_saved_step=self.last_saved_step, last_step=self.obs.last_step,
            step_estimate_s=step_estimate_s(self.obs, self.config.policy),
            stop_reason=self.stop.reason if self.stop else None,
            awaiting_ack=self._ack_until is not None,
        ))

    def _extend_stop_timeout(self) -> None:
        """While systemd stops us: ask for the time the checkpoint and the stop sequence need."""
        mono = time.monotonic()
        if self._ack_until is not None:  # the save, then the child's stop grace
            until = self._ack_until + self.config.stop_grace_s
        elif self.stop is not None:
            until = self.stop.grace_until
        else:
            return
        self._systemd.extend_stop(until - mono + KILL_WAIT_S + STOP_TIMEOUT_MARGIN_S)

    # ------------------------------------------------------------------ stopping and reaping
    def _begin_stop(self, reason: str, exit_status: int | None, *, immediate: bool = False) -> None:
        mono = time.monotonic()
        if self.phase is Phase.STOPPING:
            if immediate and self.stop is not None and not self.stop.killed:
                self._kill_tree(mono)
            return
        self.phase = Phase.STOPPING
        self.plan = None
        self._ack_until = None
        self.stop = StopState(reason, exit_status, grace_until=mono + self.config.stop_grace_s)
        self._systemd.stopping()
        self._extend_stop_timeout()
        if self.child_pid is not None and self.child_status is None:
            self._tree.snapshot(self.child_pid)
            if immediate:
                self._kill_tree(mono)
            else:
                signum = self._stop_signal()
                self.log.info("child_stopping", signal=process.signal_name(signum),
                              grace_s=self.config.stop_grace_s, reason=reason)
                process.send(self.child_pid, signum)
        self._advance_stop(mono)

    def _stop_signal(self) -> int:
        trainer = self.trainers.get(self.child_pid or -1)
        if trainer is not None and trainer.stop_signal is not None:
            return trainer.stop_signal
        return self.config.stop_signal

    def _kill_tree(self, mono: float) -> None:
        assert self.stop is not None
        remaining = self._tree.remaining()
        if remaining:
            self.log.warning("child_killed", signal="SIGKILL", pids=[p.pid for p in remaining])
        process.signal_all(remaining, signal.SIGKILL)
        self.stop.killed = True
        self.stop.kill_until = mono + KILL_WAIT_S

    def _advance_stop(self, mono: float) -> None:
        """Called on every wake-up while stopping: escalate on time, leave when all are gone."""
        stop = self.stop
        assert stop is not None
        self._reap()
        remaining = self._tree.remaining()
        child_gone = self.child_status is not None
        if child_gone and not remaining:
            raise Halt(stop.reason, self._stop_exit_status())
        if stop.killed and mono >= stop.kill_until:
            raise Halt(stop.reason + " (processes survived SIGKILL)", self._stop_exit_status())
        if not stop.killed and mono >= stop.grace_until:
            self._kill_tree(mono)
            return
        if child_gone and not stop.leftovers_signalled:
            stop.leftovers_signalled = True
            process.signal_all(remaining, signal.SIGTERM)
        self._tree.watch(remaining)

    def _stop_exit_status(self) -> int:
        assert self.stop is not None
        if self.stop.exit_status is not None:
            return self.stop.exit_status
        return exit_status_of(self.child_status) if self.child_status is not None else EXIT_FAILURE

    def _reap(self) -> None:
        """Collect every exited child, ours or orphaned to us, and note the direct child's end."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.trainers.pop(pid, None)
            if pid == self.child_pid:
                self.child_status = status
                self._child_exited(status)

    def _child_exited(self, status: int) -> None:
        fields: dict[str, Any] = {"pid": self.child_pid}
        if os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)
            fields.update(code=None, signal=process.signal_name(signum))
            if signum == signal.SIGKILL and self.stop is None:
                fields["hint"] = "killed by SIGKILL: out of memory?"
        else:
            fields.update(code=os.WEXITSTATUS(status), signal=None)
        self.log.info("child_exited", **fields)
        if self.phase is not Phase.STOPPING:
            self._begin_stop("child exited", None)


def child_environment(base: Mapping[str, str], socket_path: str, config: SupervisorConfig) -> dict[str, str]:
    """The child's environment: ours (minus systemd's notify socket and watchdog, which are
    esiwrap's alone), plus where to find us and which signal means "save"."""
    env = {key: value for key, value in base.items() if key not in systemd.CHILD_UNSET}
    env[SOCKET_ENV] = socket_path
    env[SIGNAL_ENV] = process.signal_name(config.save_signal)
    # Zero-code hooks (verl): our sitecustomize first, inert without the variables above.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap_dir(), base.get("PYTHONPATH", "")) if p)
    if config.run_id:
        env["ESIWRAP_RUN_ID"] = config.run_id
    return env


_RESERVED_KEYS = frozenset({"type", "pid", "event", "level", "timestamp", "run_id"})


def _noop_handler(signum: int, frame: object) -> None:
    """Nothing to do here: the wakeup fd already carries the signal to the loop."""
