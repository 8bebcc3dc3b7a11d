"""The stop sequence and the drain before it: the wait for a save's acknowledgement after SIGTERM,
the stop signal and its grace period, SIGKILL and the wait for the tree to vanish, the exit code.

The order of the stop: the trainers below the child that asked for a stop signal of their own get it
first; the child gets its stop signal once they have exited and it has not exited by itself within
`LAUNCHER_EXIT_S`; what is left of the tree once the child is gone gets SIGTERM, also only after
them; SIGKILL to everything left when `--stop-grace`, counted from the first signal, is over."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from esiwrap import events as ev
from esiwrap.core.controller.modes import Mode
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import (
    KILL_WAIT_S,
    LAUNCHER_EXIT_S,
    SAVE_WRITE_GRACE_FACTOR,
    STOP_TIMEOUT_MARGIN_S,
    ExtendStopTimeout,
    KillTree,
    Now,
    StopCause,
    TermLeftovers,
)
from esiwrap.core.controller.timers import Timer
from esiwrap.core.values import Deadline
from esiwrap.errors import EXIT_FAILURE


@dataclass
class StopState:
    reason: str
    exit_status: int | None  # None: the child's own status
    until: float  # monotonic: the end of the grace period, or of the wait after SIGKILL
    cause: StopCause = ""  # why, for the job's history
    leftovers_signalled: bool = False
    first: set[int] = field(default_factory=set)  # trainers sent their own stop signal, not yet exited
    child_signal: str | None = None  # the child's stop signal, sent once `first` have all exited...
    child_signal_at: float | None = None  # ...and the child has not exited by itself (monotonic)


class StopSequence:
    def __init__(self, out: Outbox, stop_grace_s: float) -> None:
        self._out = out
        self._grace_s = stop_grace_s
        self.stop: StopState | None = None
        self.ack_until: float | None = None  # monotonic, while draining

    def drain(self, now: Now) -> None:
        """Stop once the outstanding save is acknowledged; wait for it up to --stop-grace."""
        self.ack_until = now.mono + self._grace_s

    def wait_for_save(self, started_mono: float, save_estimate_s: float, deadline: Deadline | None,
                      now: Now) -> bool:
        """The drain's wait is over while a save is being written: wait on while it can still
        finish (a few estimates, never past the deadline: the capacity is gone then). True when
        the wait goes on."""
        limit = started_mono + max(self._grace_s, SAVE_WRITE_GRACE_FACTOR * save_estimate_s)
        if deadline is not None:
            limit = min(limit, now.mono + deadline.at - now.wall)
        if now.mono >= limit:
            return False
        self.ack_until = limit
        self._out.log("info", ev.STOP_EXTENDED, until_s=rounded(limit - now.mono), reason="save in progress")
        self.extend_timeout(Mode.DRAINING, now)
        return True

    def deadline_moved(self, deadline: Deadline, now: Now) -> None:
        """A drain's wait ends by the deadline at the latest (the capacity is gone then): one that
        moved earlier than the wait (a save being written was given until the old deadline) cuts
        it short."""
        if self.ack_until is not None:
            self.ack_until = min(self.ack_until, now.mono + max(0.0, deadline.at - now.wall))

    def drained(self) -> None:
        self.ack_until = None

    def begin(self, reason: str, exit_status: int | None, cause: StopCause, now: Now,
              grace_s: float | None = None) -> None:
        """The stop begins: the child gets its stop signal, then `grace_s` (--stop-grace) before
        SIGKILL."""
        self.ack_until = None
        grace = self._grace_s if grace_s is None else grace_s
        self.stop = StopState(reason, exit_status, until=now.mono + grace, cause=cause)

    def stop_first(self, pids: set[int], child_signal: str | None) -> None:
        """These trainers got their own stop signal: the child's (`child_signal`, None when the
        child needs none) and the leftovers' SIGTERM wait until they have exited."""
        assert self.stop is not None
        self.stop.first, self.stop.child_signal = set(pids), child_signal

    def first_exited(self, pid: int, now: Now) -> None:
        """A process exited: when it was the last of the trainers stopped first, the child may
        exit by itself for `LAUNCHER_EXIT_S` (bash, a launcher, reaps its command and exits with
        it), then it gets its stop signal (the "child stop" timer), within the grace."""
        stop = self.stop
        if stop is None or pid not in stop.first:
            return
        stop.first.discard(pid)
        if not stop.first and stop.child_signal is not None:
            stop.child_signal_at = min(now.mono + LAUNCHER_EXIT_S, stop.until)

    def child_signal_due(self) -> str | None:
        """The child's stop signal that waited for the trainers stopped first, once."""
        assert self.stop is not None
        signal, self.stop.child_signal, self.stop.child_signal_at = self.stop.child_signal, None, None
        return signal

    def kill(self, now: Now) -> None:
        assert self.stop is not None
        self.stop.until = now.mono + KILL_WAIT_S
        self._out.act(KillTree())

    def tree_checked(self, remaining: int) -> bool:
        """The child is gone and its tree was looked at: True when nothing is left (esiwrap may
        exit); otherwise SIGTERM to what is left, once."""
        assert self.stop is not None
        if remaining == 0:
            return True
        if self.stop.first:
            return False  # the trainers stopped first are still shutting down: no SIGTERM yet
        if not self.stop.leftovers_signalled:
            self.stop.leftovers_signalled = True
            self._out.act(TermLeftovers())
        return False

    def extend_timeout(self, mode: Mode, now: Now) -> None:
        """While a service manager stops us: ask for the time the checkpoint and the stop need."""
        if mode is Mode.DRAINING and self.ack_until is not None:
            until = self.ack_until + self._grace_s  # the save, then the child's stop grace
        elif mode is Mode.STOPPING and self.stop is not None:
            until = self.stop.until
        else:
            return
        self._out.act(ExtendStopTimeout(until - now.mono + KILL_WAIT_S + STOP_TIMEOUT_MARGIN_S))

    def exit_code(self, child_status: int | None) -> int:
        """The stop's own exit status, else the child's, else esiwrap's failure."""
        assert self.stop is not None
        if self.stop.exit_status is not None:
            return self.stop.exit_status
        return child_status if child_status is not None else EXIT_FAILURE

    def view(self) -> dict[str, Any]:
        return {"stop_reason": self.stop.reason if self.stop else None}

    def timers(self, mode: Mode) -> list[Timer]:
        if self.ack_until is not None:  # only ever set while draining
            return [Timer("ack wait", "mono", self.ack_until)]
        if mode in (Mode.STOPPING, Mode.KILLING) and self.stop is not None:
            child = self.stop.child_signal_at
            later = [Timer("child stop", "mono", child)] if child is not None and mode is Mode.STOPPING \
                else []
            return [Timer("stop", "mono", self.stop.until), *later]
        return []
