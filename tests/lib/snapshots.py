"""A `Snapshot` for tests that care about a few fields: the rest unknown (None) or zero."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from esiwrap.core.snapshot import Snapshot


def snapshot(time: float, phase: str = "running", **given: Any) -> Snapshot:
    required = {f.name: None for f in fields(Snapshot) if f.default is MISSING}
    counts = {"pid": 1, "run_id": "", "trainers": 0, "saves_completed": 0, "saves_failed": 0,
              "saves_missed": 0}
    return Snapshot(**{**required, **counts, "time": time, "phase": phase, **given})
