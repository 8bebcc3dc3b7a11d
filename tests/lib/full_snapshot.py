"""A `Snapshot` with every field set, of a job running on plan: the value the metrics, observer
and status tests show (`snapshot(**changes)` for another)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from esiwrap.core.snapshot import Snapshot

NOW = 1_800_000_000.0


def snapshot(**changes: Any) -> Snapshot:
    base = Snapshot(
        time=NOW, run_id="3f2a9c0d1e2f", pid=4242, child_pid=4250, phase="running",
        deadline_at=NOW + 2460.0, deadline_source="volcengine", next_save_at=NOW + 1680.0,
        next_save_kind="insurance", next_save_reason="last safe moment before the deadline",
        step_estimate_s=1.25, save_estimate_s=45.0, last_step=1300, last_checkpoint_at=NOW - 360.0,
        last_checkpoint_step=1200, work_at_risk_s=362.5, saves_completed=2, saves_failed=1,
        saves_missed=0, trainers=1,
    )
    return replace(base, **changes)
