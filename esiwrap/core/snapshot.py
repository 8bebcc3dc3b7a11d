"""What the supervisor knows at one moment, as one value: the source of the metrics, the status
file and `esiwrap status`.

The supervisor builds a `Snapshot` after every change and hands it to `esiwrap.shell.observe`. Times
are wall-clock epoch seconds (they are shown to people and compared across processes); durations
are seconds. Unknown is None, never NaN: JSON has no NaN, and Prometheus omits a series it does
not know rather than exporting a made-up number.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

PHASES = ("running", "starting", "save_requested", "draining", "continuing", "stopping", "killing",
          "verifying", "uploading", "exited")


@dataclass(frozen=True)
class Snapshot:
    """The supervisor's state for people and monitoring (see the module docstring)."""

    time: float                      # wall clock when taken (epoch s)
    run_id: str
    pid: int                         # esiwrap's own pid
    child_pid: int | None
    phase: str  # running | save_requested | draining | continuing | stopping | killing | uploading
    deadline_at: float | None        # epoch s
    deadline_source: str | None      # e.g. "cli", "env:MLP", "volcengine", "node:ab12/volcengine-spot"
    next_save_at: float | None       # planned save signal time (epoch s)
    next_save_kind: str | None       # insurance | final | periodic | calibration
    next_save_reason: str | None     # one short phrase: why this save (for people)
    step_estimate_s: float | None
    save_estimate_s: float | None
    last_step: int | None
    last_checkpoint_at: float | None  # wall time the last completed save ended
    last_checkpoint_step: int | None
    # training seconds since the boundary of the last checkpointed step (None: no deadline and no
    # checkpoint info)
    work_at_risk_s: float | None
    saves_completed: int
    saves_failed: int
    saves_missed: int
    trainers: int                    # processes attached
    # what the systemd status line says besides (newer fields: a reader takes the default when absent)
    deadline_pending: bool = False   # the sources have not all answered yet
    requested_save_kind: str | None = None  # a save was asked for and is not acknowledged: its kind
    saving_step: int | None = None   # ...and the trainer has begun writing it, at this step
    stop_reason: str | None = None   # stopping, and why
    # `--upload` (a checkpoint is durable once its upload completed; without, once it completed)
    durable_step: int | None = None  # the step the last durable checkpoint holds
    uploading_step: int | None = None  # an upload runs, of the checkpoint of this step
    uploads_completed: int = 0
    uploads_failed: int = 0
    # esiwrap's own lateness on this node: how late its loop woke for a timer, how long trainer
    # reports took to reach it (the worst and the 99th percentile of the run's recent ones)
    timer_late_p99_s: float | None = None
    timer_late_max_s: float | None = None
    report_delay_p99_s: float | None = None
    report_delay_max_s: float | None = None

    def to_json(self) -> str:
        """One JSON object; a float that is not finite is written as null."""
        return json.dumps({k: _finite(v) for k, v in asdict(self).items()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Snapshot:
        """The snapshot in `text`; ValueError naming the field when it is not one."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            msg = f"not JSON: {exc}"
            raise ValueError(msg) from None
        if not isinstance(data, dict):
            msg = "not a JSON object"
            raise ValueError(msg)
        values = {f.name: _field(f.name, str(f.type), data) for f in fields(cls)
                  if f.name in data or f.default is MISSING}
        return cls(**values)

    def lateness(self) -> dict[str, dict[str, float | None]]:
        """The lateness figures as one object (the log's `supervisor_exit`)."""
        return {"timers": {"p99_s": self.timer_late_p99_s, "max_s": self.timer_late_max_s},
                "reports": {"p99_s": self.report_delay_p99_s, "max_s": self.report_delay_max_s}}

    def remaining_s(self, now: float) -> float | None:
        """Seconds to the deadline at wall time `now` (negative once passed)."""
        return None if self.deadline_at is None else self.deadline_at - now

    def work_at_risk_at(self, now: float) -> float | None:
        """Work at risk at `now`: it grows with wall time while the trainer trains unsaved."""
        if self.work_at_risk_s is None:
            return None
        if self.phase in ("running", "continuing", "save_requested"):
            return self.work_at_risk_s + max(0.0, now - self.time)
        return self.work_at_risk_s


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _field(name: str, annotation: str, data: dict[str, Any]) -> Any:
    """One field, checked against its annotation ('float | None', 'int', 'str', ...)."""
    optional = annotation.endswith("| None")
    if name not in data:
        if optional:
            return None
        msg = f"field {name!r} is missing"
        raise ValueError(msg)
    value = data[name]
    if value is None:
        if optional:
            return None
        msg = f"field {name!r} is null"
        raise ValueError(msg)
    kind = annotation.split("|")[0].strip()
    if _is_a(kind, value):
        return float(value) if kind == "float" else value
    what = "finite float" if kind == "float" else kind
    msg = f"field {name!r}: {value!r} is not a {what}"
    raise ValueError(msg)


def _is_a(kind: str, value: Any) -> bool:
    if isinstance(value, bool) or kind == "bool":
        return isinstance(value, bool) and kind == "bool"
    if kind == "float":
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, {"int": int, "str": str}[kind])
