"""The supervisor's modes, and every move between them in one table.

One `Mode` says what the supervisor is doing; `TRANSITIONS` lists, for each mode, the causes that
move it and where to. `Modes.move` is the only place the mode changes, and a move the table does
not list is refused at once (`IllegalMove`: a bug in the controller, never a user's error). The
design page's diagram is drawn from this table (`scripts/gen_reference.py`).

    RUNNING         training; the planned save signal and the deadline are the timers
    STARTING        the shell is about to start the command (`Launch`): the no-progress guard; with
                    `--restore`, the job's durable checkpoint is looked for, found in its
                    manifests, brought back and verified first (the restore's retry and its
                    cut-off: the insurance save must still fit before the deadline)
    SAVE_REQUESTED  a save was asked for and is not acknowledged; the deadline (a miss), and the
                    latest graceful stop while no trainer has attached to take the signal
    DRAINING        stopping as soon as the outstanding save is acknowledged (SIGTERM, a deadline
                    learned too late); the acknowledgement wait
    CONTINUING      the planned saves are done, the child keeps running: until the stop must begin
                    to end before the deadline (`--after-save linger`: a deadline that moves later
                    is followed), or for good (`--after-save continue`)
    STOPPING        the stop signal went to the child; its grace period
    KILLING         SIGKILL went to the tree; the wait for it to vanish
    VERIFYING       the child's tree is gone; the last checkpoint's verification is ending: until it
                    does, or until it must be given up to exit before the deadline
    UPLOADING       the child's tree is gone; the last checkpoint's upload (`--upload`) is ending:
                    until it does, or until it must be cut off to exit before the deadline
    EXITED          the exit is decided (`Exit`): no timer fires, nothing moves any more

Each mode lists every cause that can reach it: where it goes, or `STAY` (the cause leaves this mode
as it is: a save asked for by hand while continuing keeps continuing; an acknowledgement while
stopping changes no mode). A cause a mode does not list is a bug (`IllegalMove`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Literal


class Mode(enum.Enum):
    RUNNING = "running"
    STARTING = "starting"
    SAVE_REQUESTED = "save_requested"
    DRAINING = "draining"
    CONTINUING = "continuing"
    STOPPING = "stopping"
    KILLING = "killing"
    VERIFYING = "verifying"
    UPLOADING = "uploading"
    EXITED = "exited"


Cause = Literal[
    "save asked", "acknowledged", "no further save", "deadline renewed", "deadline gone", "drain", "stop",
    "kill", "await upload", "exit", "not started", "launch", "started", "await verify",
]


class Stay(enum.Enum):
    """The cause is listed and leaves the mode as it is."""

    STAY = "stay"


STAY = Stay.STAY
Target = Mode | Stay

_STOP: Mapping[Cause, Target] = {"drain": Mode.DRAINING, "stop": Mode.STOPPING}
# A save, its acknowledgement and the deadline's news while no save is planned any more: nothing moves.
_STOPPED_STAYS: Mapping[Cause, Target] = {
    "save asked": STAY, "acknowledged": STAY, "deadline renewed": STAY, "deadline gone": STAY,
}

TRANSITIONS: Mapping[Mode, Mapping[Cause, Target]] = {
    Mode.RUNNING: {"save asked": Mode.SAVE_REQUESTED, "no further save": Mode.CONTINUING, **_STOP,
                   "launch": Mode.STARTING,  # the shell is about to start the command
                   "acknowledged": STAY, "deadline renewed": STAY, "deadline gone": STAY},
    Mode.STARTING: {"started": Mode.RUNNING,  # at once, or once --restore brought the checkpoint back
                    "not started": Mode.EXITED,  # the no-progress guard, a restore that failed
                    "deadline renewed": STAY, "deadline gone": STAY},
    Mode.SAVE_REQUESTED: {"acknowledged": Mode.RUNNING, **_STOP,
                          "save asked": STAY, "deadline renewed": STAY, "deadline gone": STAY},
    Mode.DRAINING: {"stop": Mode.STOPPING, "save asked": STAY, "acknowledged": STAY,
                    "deadline renewed": STAY, "deadline gone": STAY},
    Mode.CONTINUING: {"deadline renewed": Mode.RUNNING, "deadline gone": Mode.RUNNING, **_STOP,
                      "save asked": STAY, "acknowledged": STAY},
    Mode.STOPPING: {"kill": Mode.KILLING, "await verify": Mode.VERIFYING, "await upload": Mode.UPLOADING,
                    "exit": Mode.EXITED, **_STOPPED_STAYS},
    Mode.KILLING: {"await verify": Mode.VERIFYING, "await upload": Mode.UPLOADING, "exit": Mode.EXITED,
                   **_STOPPED_STAYS},
    Mode.VERIFYING: {"await upload": Mode.UPLOADING, "exit": Mode.EXITED, "await verify": STAY,
                     **_STOPPED_STAYS},
    Mode.UPLOADING: {"exit": Mode.EXITED, "await upload": STAY, **_STOPPED_STAYS},
    Mode.EXITED: {**_STOPPED_STAYS},
}
"""What each cause does in each mode: where it goes, or STAY. A cause a mode does not list is a bug."""


class IllegalMove(RuntimeError):
    """The controller asked for a move the table does not list."""


class Modes:
    """The current mode; it changes only by a move the table lists."""

    def __init__(self) -> None:
        self._mode = Mode.RUNNING

    @property
    def mode(self) -> Mode:
        return self._mode

    def move(self, cause: Cause) -> bool:
        """Move as the table says; True when the mode changed (False: the table says STAY)."""
        target = TRANSITIONS[self._mode].get(cause)
        if target is None:
            msg = f"no move from {self._mode.value} on {cause!r}"
            raise IllegalMove(msg)
        if target is STAY:
            return False
        assert isinstance(target, Mode)
        self._mode = target
        return True
