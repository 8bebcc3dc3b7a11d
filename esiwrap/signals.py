"""Signal names as they travel between esiwrap and the trainer: `ESIWRAP_SIGNAL` (the save signal)
and a hello's `stop_signal`. Standard library only: loaded in every hooked Ray worker."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

SIGNAL_ENV = "ESIWRAP_SIGNAL"


def signal_number(name: str) -> int | None:
    """`SIGINT`, `int`, `Int` or `2` as a signal number; None for anything else."""
    text = name.strip().upper()
    if text.isdigit():
        try:
            return int(signal.Signals(int(text)))
        except ValueError:
            return None
    member = getattr(signal.Signals, text if text.startswith("SIG") else "SIG" + text, None)
    return int(member) if member is not None else None


def save_signal(environ: Mapping[str, str] = os.environ) -> int:
    """The save signal esiwrap exported to this process; SIGUSR1 when none (or nonsense) was."""
    return signal_number(environ.get(SIGNAL_ENV, "")) or int(signal.SIGUSR1)
