"""The trainer roster: the child, and the processes that said hello on the channel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from esiwrap.core.controller.protocol import ChildExited, Hello


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
    cannot_save: str | None = None  # why it cannot save on request (the verl hook says), if so


class Roster:
    """Who is there: the child (until it exits) and the attached trainers; who said bye; when each
    process last got the save signal."""

    def __init__(self, signal_child: bool) -> None:
        self.signal_child = signal_child  # --signal-child: the save signal goes to the child itself
        self.trainers: dict[int, Trainer] = {}
        self.child_pid: int | None = None
        self.child_status: int | None = None  # esiwrap's exit status for the child's end
        self.attached_once = False  # a trainer said hello at some point (a miss says if none did)
        self.nodes = 1  # the most nodes a trainer's hello said its job spans
        self.checkpoint_dir: str | None = None  # the first directory a trainer named
        self.left: dict[int, float | None] = {}  # said bye (when it sent it): signalled no more
        self.save_signalled_mono: dict[int, float] = {}  # pid -> when it last got the save signal
        self.warned: set[tuple[int, str]] = set()  # (pid, event): a trainer's warnings, logged once

    def warn_once(self, pid: int, event: str) -> bool:
        """True the first time for this process and warning: say it once."""
        if (pid, event) in self.warned:
            return False
        self.warned.add((pid, event))
        return True

    def view(self) -> dict[str, Any]:
        return {"child_pid": self.child_pid, "trainers": len(self.trainers)}

    def child_started(self, pid: int) -> None:
        self.child_pid = pid

    def child_exited(self, exited: ChildExited) -> None:
        self.child_status = exited.code if exited.code is not None else 128 + exited.signum
        self.trainers.pop(exited.pid, None)
        self.left.pop(exited.pid, None)

    def attach(self, hello: Hello, now_wall: float) -> bool:
        """A trainer said hello (again); True when it says the job spans more nodes than known."""
        self.trainers[hello.pid] = _merged(self.trainers.get(hello.pid), hello, now_wall)
        self.attached_once = True
        if self.checkpoint_dir is None and hello.checkpoint_dir:
            self.checkpoint_dir = hello.checkpoint_dir
        if hello.nodes is not None and hello.nodes > self.nodes:
            self.nodes = hello.nodes
            return True
        return False

    def gone(self, pid: int) -> bool:
        """A trainer's process exited (its pid may be another process's later); True when it was
        attached."""
        self.left.pop(pid, None)
        return self.trainers.pop(pid, None) is not None

    def leave(self, pid: int, sent_mono: float | None = None) -> bool:
        """A trainer said bye: it ignores the save signal from now on. True when it was attached,
        or is the direct child that --signal-child signals: it is signalled no more."""
        attached = self.trainers.pop(pid, None) is not None or (self.signal_child and pid == self.child_pid)
        if attached:
            self.left[pid] = sent_mono
        return attached

    def has_left(self, pid: int, hello_sent_mono: float | None = None) -> bool:
        """Said bye, its process not seen to exit, and a hello of it is not known to be sent after
        the bye (one sent before it, read late, must not attach it again)."""
        if pid not in self.left:
            return False
        bye_sent = self.left[pid]
        return bye_sent is None or hello_sent_mono is None or hello_sent_mono <= bye_sent

    def back(self, pid: int) -> None:
        """A process that said bye said hello again, after it (`install()` after `uninstall()`)."""
        self.left.pop(pid, None)

    def save_signal_sent(self, pids: list[int], now_mono: float) -> None:
        for pid in pids:
            self.save_signalled_mono[pid] = now_mono

    def attached(self, pid: int) -> bool:
        """Said hello; with --signal-child the direct child needs not (it handles the signal itself)."""
        return pid in self.trainers or (self.signal_child and pid == self.child_pid)

    def said_checkpoint_size(self, pid: int, checkpoint_bytes: float) -> bool:
        trainer = self.trainers.get(pid)
        if trainer is None or not checkpoint_bytes > 0:
            return False
        trainer.checkpoint_bytes = checkpoint_bytes
        return True

    def checkpoint_bytes(self) -> float | None:
        """A checkpoint is what every saving process writes of it, on this node's storage."""
        parts = [t.checkpoint_bytes for t in self.trainers.values() if t.saves and t.checkpoint_bytes]
        return sum(parts) if parts else None

    def signal_targets(self) -> list[int]:
        if self.signal_child:
            child = self.child_pid
            if child is None or self.child_status is not None or child in self.left:
                return []  # not started, exited, or said bye
            return [child]
        return [t.pid for t in self.trainers.values() if t.signal]

    def savers(self) -> set[int]:
        return {t.pid for t in self.trainers.values() if t.saves}

    def timing_pid(self) -> int | None:
        """The trainer whose steps are the job's: the lowest rank, the first to attach."""
        trainers = sorted(self.trainers.values(), key=lambda t: (t.rank, t.attached_at))
        return trainers[0].pid if trainers else None

    def child_stop_signal(self, default: str) -> str:
        trainer = self.trainers.get(self.child_pid) if self.child_pid is not None else None
        if trainer is not None and trainer.stop_signal is not None:
            return trainer.stop_signal
        return default

    def stopped_first(self) -> dict[str, list[int]]:
        """The trainers below the child that asked for a stop signal of their own (a Ray driver
        behind `bash run.sh`: SIGINT; a rank that takes SIGTERM as a save request in a Slurm job:
        SIGHUP), by signal. They get it before the child gets its own: a launcher stopped first
        would abort them (bash dies of SIGTERM and leaves its command to the tree's SIGTERM;
        `uv run` and torchrun pass SIGTERM on)."""
        by_signal: dict[str, list[int]] = {}
        for trainer in self.trainers.values():
            if trainer.stop_signal and trainer.pid != self.child_pid:
                by_signal.setdefault(trainer.stop_signal, []).append(trainer.pid)
        return by_signal

    def cannot_save(self) -> list[str]:
        """What attached trainers said of why they cannot save on request, when no trainer saves."""
        if self.savers():
            return []
        return [t.cannot_save for t in self.trainers.values() if t.cannot_save]


def _merged(earlier: Trainer | None, hello: Hello, now_wall: float) -> Trainer:
    """A process may say hello more than once (a Ray driver: `esiwrap.trainer.install()` and the
    start-up hook's `ray.init`, in either order): a later hello adds to what an earlier one asked
    for, never undoes it. It saves or is signalled if either said so; the stop signal is the
    latest one named, and so is the checkpoint's size."""
    if earlier is None:
        return Trainer(pid=hello.pid, rank=hello.rank, saves=hello.saves, signal=hello.wants_signal,
                       stop_signal=hello.stop_signal, attached_at=now_wall,
                       checkpoint_bytes=hello.checkpoint_bytes, sigterm_saves=hello.sigterm_saves,
                       cannot_save=None if hello.saves else hello.cannot_save)
    saves = earlier.saves or hello.saves
    return Trainer(pid=hello.pid, rank=hello.rank, saves=saves,
                   signal=earlier.signal or hello.wants_signal,
                   stop_signal=hello.stop_signal or earlier.stop_signal, attached_at=earlier.attached_at,
                   checkpoint_bytes=hello.checkpoint_bytes or earlier.checkpoint_bytes,
                   sigterm_saves=earlier.sigterm_saves or hello.sigterm_saves,
                   cannot_save=None if saves else hello.cannot_save or earlier.cannot_save)


def second_stop_signal(earlier: Trainer | None, hello: Hello) -> str | None:
    """The stop signal a process asked for before, when this hello of it asks for another one:
    only one can be honoured (the latest)."""
    if earlier is None or earlier.stop_signal is None or hello.stop_signal is None:
        return None
    return earlier.stop_signal if earlier.stop_signal != hello.stop_signal else None
