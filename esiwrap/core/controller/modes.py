"""The supervisor's modes, and every move between them in one table.

One `Mode` says what the supervisor is doing; `TRANSITIONS` lists, for each mode, the causes that
move it and where to. `Modes.move` is the only place the mode changes, and a move the table does
not list is refused at once (`IllegalMove`: a bug in the controller, never a user's error). The
design page's diagram is drawn from this table (`scripts/gen_reference.py`).

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
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Literal


class Mode(enum.Enum):
    RUNNING = "running"
    SAVE_REQUESTED = "save_requested"
    DRAINING = "draining"
    CONTINUING = "continuing"
    STOPPING = "stopping"
    KILLING = "killing"
    UPLOADING = "uploading"


Cause = Literal[
    "save asked", "acknowledged", "no further save", "deadline renewed", "deadline gone", "drain", "stop",
    "kill", "await upload",
]

_STOP: Mapping[Cause, Mode] = {"drain": Mode.DRAINING, "stop": Mode.STOPPING}

TRANSITIONS: Mapping[Mode, Mapping[Cause, Mode]] = {
    Mode.RUNNING: {"save asked": Mode.SAVE_REQUESTED, "no further save": Mode.CONTINUING, **_STOP},
    Mode.SAVE_REQUESTED: {"acknowledged": Mode.RUNNING, **_STOP},
    Mode.DRAINING: {"stop": Mode.STOPPING},
    Mode.CONTINUING: {"deadline renewed": Mode.RUNNING, "deadline gone": Mode.RUNNING, **_STOP},
    Mode.STOPPING: {"kill": Mode.KILLING, "await upload": Mode.UPLOADING},
    Mode.KILLING: {"await upload": Mode.UPLOADING},
    Mode.UPLOADING: {},
}
"""What moves each mode, and where to. Everything else that happens leaves the mode as it is."""


class IllegalMove(RuntimeError):
    """The controller asked for a move the table does not list."""


class Modes:
    """The current mode; it changes only by a move the table lists."""

    def __init__(self) -> None:
        self._mode = Mode.RUNNING

    @property
    def mode(self) -> Mode:
        return self._mode

    def move(self, cause: Cause) -> Mode:
        target = TRANSITIONS[self._mode].get(cause)
        if target is None:
            msg = f"no move from {self._mode.value} on {cause!r}"
            raise IllegalMove(msg)
        self._mode = target
        return target
