"""The supervisor's modes: what it is doing now."""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    RUNNING = "running"
    SAVE_REQUESTED = "save_requested"
    DRAINING = "draining"
    CONTINUING = "continuing"
    STOPPING = "stopping"
    KILLING = "killing"
    UPLOADING = "uploading"
