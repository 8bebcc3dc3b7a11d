"""A `Snapshot` in the Prometheus text exposition format (version 0.0.4).

Every series carries `run_id`, so two esiwraps writing into one node_exporter textfile directory
never clash, and a restarted job is a new series. A value esiwrap does not know (no deadline yet,
no planned save, no checkpoint) is left out rather than exported as a made-up number; its HELP
and TYPE lines stay, so the family is always listed.

Times are unix epoch seconds (`_timestamp_seconds`), durations seconds (`_seconds`), counters end
in `_total`: https://prometheus.io/docs/practices/naming/.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from esiwrap.core.snapshot import PHASES, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # gauge | counter
    help: str


# Every family esiwrap exports, in the order written (docs/observe/metrics.md lists the same).
INFO = Family("esiwrap_info", "gauge",
              "Always 1; labels name this esiwrap (run_id, pid, child_pid, version).")
PHASE = Family("esiwrap_phase", "gauge", "1 for the supervisor's current phase, 0 for the others.")
DEADLINE = Family("esiwrap_deadline_timestamp_seconds", "gauge",
                  "When the capacity is reclaimed (unix time), labelled with the source that said so.")
REMAINING = Family("esiwrap_deadline_remaining_seconds", "gauge",
                   "Seconds left before the deadline (negative once passed).")
NEXT_SAVE = Family("esiwrap_next_save_timestamp_seconds", "gauge",
                   "When the next planned save signal is due (unix time), labelled with its kind.")
STEP = Family("esiwrap_step_estimate_seconds", "gauge",
              "The step time the plan allows for (a high quantile of recent steps).")
SAVE = Family("esiwrap_save_estimate_seconds", "gauge",
              "The save time the plan allows for (the longest save measured, else --save-duration).")
LAST_STEP = Family("esiwrap_last_step", "gauge", "The last training step the trainer reported.")
CHECKPOINT_TIME = Family("esiwrap_last_checkpoint_timestamp_seconds", "gauge",
                         "When the last completed checkpoint was acknowledged (unix time).")
CHECKPOINT_STEP = Family("esiwrap_last_checkpoint_step", "gauge",
                         "The step the last completed checkpoint holds.")
AT_RISK = Family("esiwrap_work_at_risk_seconds", "gauge",
                 "Training seconds since the last checkpointed step's boundary: lost if stopped now.")
COMPLETED = Family("esiwrap_saves_completed_total", "counter", "Saves acknowledged by the trainer(s).")
FAILED = Family("esiwrap_saves_failed_total", "counter", "Saves the trainer reported as failed.")
MISSED = Family("esiwrap_saves_missed_total", "counter",
                "Saves asked for and not acknowledged in time (deadline passed, or --stop-grace over).")
TRAINERS = Family("esiwrap_trainers", "gauge", "Trainer processes attached to the channel.")
UPDATED = Family("esiwrap_snapshot_timestamp_seconds", "gauge",
                 "When esiwrap last changed what it exports (unix time): the age of a metrics file.")

FAMILIES = (INFO, PHASE, DEADLINE, REMAINING, NEXT_SAVE, STEP, SAVE, LAST_STEP, CHECKPOINT_TIME,
            CHECKPOINT_STEP, AT_RISK, COMPLETED, FAILED, MISSED, TRAINERS, UPDATED)


def render(snapshot: Snapshot, now: float, version: str = "") -> str:
    """The exposition text; `now` is the wall time remaining seconds and work at risk are for."""
    s = snapshot
    run: Labels = (("run_id", s.run_id),)
    info: Labels = (*run, ("pid", str(s.pid)), ("child_pid", "" if s.child_pid is None else str(s.child_pid)),
                    ("version", version))
    samples: dict[Family, list[tuple[Labels, float | None]]] = {
        INFO: [(info, 1)],
        PHASE: [((*run, ("phase", phase)), 1 if phase == s.phase else 0)
                for phase in _phases(s.phase)],
        DEADLINE: [((*run, ("source", s.deadline_source or "")), s.deadline_at)],
        REMAINING: [(run, s.remaining_s(now))],
        NEXT_SAVE: [((*run, ("kind", s.next_save_kind or "")), s.next_save_at)],
        STEP: [(run, s.step_estimate_s)],
        SAVE: [(run, s.save_estimate_s)],
        LAST_STEP: [(run, s.last_step)],
        CHECKPOINT_TIME: [(run, s.last_checkpoint_at)],
        CHECKPOINT_STEP: [(run, s.last_checkpoint_step)],
        AT_RISK: [(run, s.work_at_risk_at(now))],
        COMPLETED: [(run, s.saves_completed)],
        FAILED: [(run, s.saves_failed)],
        MISSED: [(run, s.saves_missed)],
        TRAINERS: [(run, s.trainers)],
        UPDATED: [(run, s.time)],
    }
    lines: list[str] = []
    for family in FAMILIES:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        lines.extend(_sample(family.name, labels, value) for labels, value in samples[family]
                     if value is not None)
    return "\n".join(lines) + "\n"


def _phases(current: str) -> Iterable[str]:
    """The state set: every known phase, and the current one should it be new."""
    return PHASES if current in PHASES else (*PHASES, current)


def _sample(name: str, labels: Labels, value: float) -> str:
    pairs = ",".join(f'{key}="{escape_label(text)}"' for key, text in labels)
    return f"{name}{{{pairs}}} {_number(value)}"


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def escape_label(text: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
