"""The save cycle: a save asked for, its begin, snapshot and end from each saving process, its
acknowledgement, the last checkpoint and the run's save counts."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from esiwrap import events as ev
from esiwrap.core.controller.modes import Mode
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import Now, SaveBegin, SaveEnd, SaveSnapshot
from esiwrap.core.controller.timers import Timer
from esiwrap.core.policy import Observations, SavePlan
from esiwrap.core.values import Checkpoint, Deadline
from esiwrap.times import iso_utc

MAX_OPEN_SAVES = 16  # saves begun and not yet ended, per process (asynchronous writes overlap)


@dataclass
class SaveRequest:
    reason: str  # deadline | sigterm | manual | early_warning | peer
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


class SaveCycle:
    def __init__(self, out: Outbox, obs: Observations) -> None:
        self._out = out
        self._obs = obs
        self.request: SaveRequest | None = None
        self.last_request: SaveRequest | None = None  # the last one acknowledged
        self.last_checkpoint: Checkpoint | None = None  # any completed save, the trainer's own too
        self.last_error: tuple[float, str] | None = None  # wall time, what the trainer said
        # This run's counts, for the metrics: saves completed (asked for, or the trainer's own),
        # failed (the trainer said so), missed (no acknowledgement in time).
        self.completed_total = self.failed_total = self.missed_total = 0
        # The steps each process began a save of and has not ended (oldest first): a save_end or
        # save_snapshot is evidence only of a save its sender began.
        self.open: dict[int, list[int]] = {}

    def ask(self, reason: str, now: Now, plan: SavePlan | None = None,
            signalled: set[int] | None = None) -> SaveRequest:
        """A save is asked for: of the plan's kind for a deadline save, else of its reason."""
        kind = plan.kind if plan is not None else reason
        self.request = SaveRequest(reason=reason, kind=kind, requested_at=now.wall, plan=plan,
                                   signalled=signalled or set())
        return self.request

    def announce(self, request: SaveRequest, now: Now, targets: list[int], signal: str,
                 remaining_s: float | None, unattached_stop_at: float | None) -> None:
        """Log the request, with the plan as it stood when it fired (for `esiwrap report`), and
        what happens when no process is there to take the signal."""
        plan = request.plan
        planned = {} if plan is None else {
            "planned_at": iso_utc(plan.signal_at), "late_s": rounded(now.wall - plan.signal_at),
            "step_estimate_s": rounded(plan.step_estimate_s),
            "save_estimate_s": rounded(plan.save_estimate_s), "why": plan.why,
        }
        waiting = {}  # nobody to signal yet: a trainer that attaches by then is signalled at once
        if not targets and unattached_stop_at is not None:
            waiting = {"attach_by": iso_utc(unattached_stop_at)}
        self._out.log("info", ev.SAVE_REQUESTED, reason=request.reason, kind=request.kind,
                      remaining_s=remaining_s, signal=signal, pids=targets, **planned, **waiting)

    def signalled(self, pids: list[int]) -> None:
        assert self.request is not None
        self.request.signalled.update(pids)

    def retell(self, reason: str) -> None:
        """The outstanding save now serves another reason (SIGTERM: stop once it is done)."""
        assert self.request is not None
        self.request.reason = reason

    def boundary(self) -> None:
        """A step report came: one more boundary since the save was asked for, if one was."""
        if self.request is not None:
            self.request.boundaries += 1

    def began(self, pid: int, step: int) -> bool:
        """`pid` began a save of `step` and has not ended it."""
        return step in self.open.get(pid, ())

    def ends(self, pid: int, step: int) -> bool:
        """`pid` ends its save of `step` (done or failed): True when it had begun one."""
        steps = self.open.get(pid, [])
        if step not in steps:
            return False
        steps.remove(step)
        if not steps:
            del self.open[pid]
        return True

    def forget(self, pid: int) -> None:
        """The process left: the saves it began will not end."""
        self.open.pop(pid, None)

    def begin(self, begin: SaveBegin, now: Now) -> None:
        steps = self.open.setdefault(begin.pid, [])
        if begin.step not in steps:
            steps.append(begin.step)
            del steps[:-MAX_OPEN_SAVES]
        request = self.request
        if request is None:
            self._out.log("info", ev.SAVE_STARTED, step=begin.step, pid=begin.pid, requested=False)
            return
        first = not request.begun
        request.begun[begin.pid] = begin.step
        if first:
            request.save_started_mono, request.save_started_at = now.mono, now.wall
            self._out.log("info", ev.SAVE_STARTED, step=begin.step, pid=begin.pid, requested=True)

    def snapshot(self, snapshot: SaveSnapshot, now: Now) -> None:
        """An asynchronous save's blocking part is done: training resumes now, the write goes on."""
        request = self.request
        if request is None or snapshot.pid in request.snapshots:
            return  # the trainer's own asynchronous save: its end is what counts
        first = not request.snapshots
        request.snapshots[snapshot.pid] = snapshot
        if first:
            self._obs.record_blocking(snapshot.duration_s, now.wall)

    def failed(self, end: SaveEnd, now: Now) -> None:
        """The trainer says its save failed; it keeps its flag and tries again at the next boundary."""
        self.failed_total += 1
        self.last_error = (now.wall, end.error)
        self._out.log("error", ev.SAVE_FAILED, step=end.step, pid=end.pid, error=end.error)

    def ended(self, end: SaveEnd, savers: set[int]) -> bool:
        """A saving process says its part is on disk: True once every saver has (the save asked
        for is acknowledged; with no saver left, e.g. --signal-child, any report does)."""
        assert self.request is not None
        self.request.done[end.pid] = end
        return self.acknowledged_by(savers)

    def acknowledged_by(self, savers: set[int]) -> bool:
        request = self.request
        return request is not None and bool(request.done) and (savers <= set(request.done) or not savers)

    def acknowledge(self, now: Now) -> tuple[SaveRequest, int, list[SaveEnd]]:
        """The save asked for is complete: measure it, and close the request."""
        request = self.request
        assert request is not None
        messages = list(request.done.values())
        duration = max(m.duration_s for m in messages)
        if request.snapshots:  # asynchronous: the blocking part was counted at the snapshot
            self._obs.record_save(duration, now.wall, request.save_started_at)
        else:
            self._obs.record_requested_save(duration, now.wall, request.save_started_at)
        self.request, self.last_request = None, request
        return request, max(m.step for m in messages), messages

    def complete(self, step: int, messages: list[SaveEnd], now: Now, remaining_s: float | None, *,
                 requested: bool, kind: str = "") -> Checkpoint:
        """A checkpoint of `step` is complete: count it and log it."""
        self.completed_total += 1
        paths = sorted({m.path for m in messages if m.path})
        self.last_checkpoint = Checkpoint(step, now.wall, checkpoint_path(paths))
        self._out.log(
            "info", ev.SAVE_COMPLETED, step=step, requested=requested, kind=kind or None,
            duration_s=rounded(max(m.duration_s for m in messages)),
            path=paths[0] if len(paths) == 1 else (paths or None), remaining_s=remaining_s,
        )
        return self.last_checkpoint

    def view(self, now: Now) -> dict[str, Any]:
        checkpoint, request = self.last_checkpoint, self.request
        boundary = self._obs.checkpoint_at  # the boundary the last checkpoint holds (or the start)
        return {
            "last_checkpoint_at": checkpoint.completed_at if checkpoint else None,
            "last_checkpoint_step": checkpoint.step if checkpoint else None,
            "work_at_risk_s": max(0.0, now.wall - boundary) if boundary is not None else None,
            "saves_completed": self.completed_total, "saves_failed": self.failed_total,
            "saves_missed": self.missed_total, "requested_save_kind": request.kind if request else None,
            "saving_step": max(request.begun.values()) if request and request.begun else None,
        }

    def missed(self) -> None:
        self.missed_total += 1

    def progress_is_saved(self, last_step: int | None) -> bool:
        """A completed save holds the latest step: nothing would be gained by another."""
        checkpoint = self.last_checkpoint
        return checkpoint is not None and checkpoint.step >= (last_step or 0)

    def unattached_stop_at(self, mode: Mode, deadline: Deadline | None, stop_grace_s: float,
                           attached_once: bool = True) -> float | None:
        """A save is due but nothing took the signal: the end of the attach window, when the child
        is stopped (exit 76). It keeps time before the deadline for the stop: --stop-grace once a
        trainer has attached (a save may be under way in it), but only `unattached_stop_s` while
        none ever has (a process that never said hello has no save to finish, only an exit: the rest
        is the trainer's, to start and attach in). If that moment had passed when the save was asked
        for, a trainer may still attach and save up to the deadline itself."""
        request = self.request
        if mode is not Mode.SAVE_REQUESTED or request is None or deadline is None or request.signalled:
            return None
        graceful = deadline.at - unattached_stop_s(stop_grace_s, attached_once)
        return graceful if graceful > request.requested_at else deadline.at

    def timers(self, mode: Mode, deadline: Deadline | None, stop_grace_s: float,
               attached_once: bool = True) -> list[Timer]:
        at = self.unattached_stop_at(mode, deadline, stop_grace_s, attached_once)
        return [] if at is None else [Timer("unattached stop", "wall", at)]


UNATTACHED_STOP_S = 5.0  # what a stop needs while no trainer has ever attached: an exit, no save


def unattached_stop_s(stop_grace_s: float, attached_once: bool) -> float:
    """The time before the deadline kept for stopping a child with nobody attached to save."""
    return stop_grace_s if attached_once else min(stop_grace_s, UNATTACHED_STOP_S)


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
