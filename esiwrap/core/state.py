"""The job's state file (`--state-file`): what earlier runs measured, so the next run starts from it.

A job is reclaimed and resumed on a new instance again and again. The file, placed next to the
checkpoints (the storage that survives reclamation), keeps the step intervals and save durations
the runs measured; a new run plans its first save with them instead of a guess. It is small JSON:

    {"format": "esiwrap-state/1", "updated_at": 1796008906.1, "command": ["python", "train.py"],
     "steps": [1.02, 0.98, ...], "saves": [61.3, 58.9], "blocking": [4.1], "uploads": [240.5],
     "verifies": [0.004], "restores": [95.2],
     "checkpoint": {"step": 1200, "path": "/ckpt/global_step_1200", "at": 1796008850.3,
                    "durable": "upload"},
     "runs": [{"started_at": 1796001706.0, "seen_at": 1796008906.1, "nodes": 1, "capacity": "spot",
               "source": "aws-spot", "ending": "announced", "start_step": 900, "end_step": 1200,
               "saves": 3}]}

`checkpoint` is the last durable checkpoint: with `--upload`, the last one whose upload completed
(`durable: upload`); without, the last one completed (`durable: completed`); with verification,
only a checkpoint that passed it. The next run checks that the trainer really resumed from it
(`resumed`, `resume_missed`), and `--restore` brings it back when it is not on the instance.
`verifies` and `restores` (the last 10 of each) are written only once measured: a file without
them is read as before, and an older esiwrap ignores them.

`runs` is the job's history (`esiwrap.core.history`): one record per run, the newest KEEP_RUNS. A run
adds its record as it starts, refreshes it while it runs and closes it with how it ended; the
interruption rate is learned from it and the no-progress guard reads it.

Reading is strict and never fatal: a file that is not there is the first run; a file that cannot
be parsed, is not ours, holds values that are not durations, or is older than MAX_AGE_S is ignored
with a reason (`parse`). The file itself is read and written by the shell (`esiwrap.shell.statefile`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from esiwrap.core.history import KEEP_RUNS, RunRecord, close_vanished, record_from_json, record_to_json
from esiwrap.core.policy import Prior
from esiwrap.core.values import Checkpoint, finite_number

FORMAT = "esiwrap-state/1"
MAX_AGE_S = 30 * 86_400.0  # older measurements describe other hardware, storage or code
KEEP_STEPS = 100
KEEP_SAVES = 10
LATER_FIELDS = ("verifies", "restores")  # measurements kept since: written (and shown) once there are some


@dataclass(frozen=True, repr=False)
class JobState:
    steps: tuple[float, ...] = ()
    saves: tuple[float, ...] = ()
    blocking: tuple[float, ...] = ()
    updated_at: float = 0.0
    command: tuple[str, ...] = ()
    uploads: tuple[float, ...] = ()
    checkpoint: Checkpoint | None = None
    checkpoint_durable: str = ""  # upload | completed
    runs: tuple[RunRecord, ...] = ()  # the job's history, oldest first
    verifies: tuple[float, ...] = ()  # how long verifications took
    restores: tuple[float, ...] = ()  # how long bringing the checkpoint back took (`--restore`)

    def __repr__(self) -> str:
        """Every field, as a dataclass says it; the measurements added later only once there are some."""
        shown = [f for f in fields(self) if f.name not in LATER_FIELDS or getattr(self, f.name)]
        return f"JobState({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    def prior(self, now: float = 0.0) -> Prior:
        """What the policy plans with; the ended runs' ages count from `now` (this run's start)."""
        ended = tuple(r for r in self.runs if r.ending != "running")
        return Prior(self.steps, self.saves, self.blocking, self.uploads, ended, now, self.verifies,
                     self.restores)

    def starting(self, now: float, host: str = "", killed: str = "") -> JobState:
        """As a new run on `host` finds it: open records of runs that are gone are runs that
        vanished (interrupted with no notice); the run `killed` names was killed (`close_vanished`)."""
        return replace(self, runs=close_vanished(self.runs, now, host, killed))

    def with_run(self, run: RunRecord) -> JobState:
        """The history with this run's record in it (replacing its earlier version), newest last."""
        others = [r for r in self.runs if not (r.run_id and r.run_id == run.run_id)]
        return replace(self, runs=(*others, run)[-KEEP_RUNS:])

    def after_run(self, window: Sequence[float], saves: Sequence[float], blocking: Sequence[float],
                  now: float, command: Sequence[str], uploads: Sequence[float] = (),
                  checkpoint: Checkpoint | None = None, uploaded: bool = False,
                  verifies: Sequence[float] = (), restores: Sequence[float] = ()) -> JobState:
        """What the file holds after a run: its step window (which began with this state's steps),
        its saves and uploads after the earlier runs', the newest kept, and its last durable
        checkpoint (else the earlier run's)."""
        durable = self.checkpoint_durable
        if checkpoint is not None:
            durable = "upload" if uploaded else "completed"
        return JobState(
            steps=tuple(window)[-KEEP_STEPS:],
            saves=tuple([*self.saves, *saves][-KEEP_SAVES:]),
            blocking=tuple([*self.blocking, *blocking][-KEEP_SAVES:]),
            updated_at=now, command=tuple(command),
            uploads=tuple([*self.uploads, *uploads][-KEEP_SAVES:]),
            checkpoint=checkpoint if checkpoint is not None else self.checkpoint,
            checkpoint_durable=durable, runs=self.runs,
            verifies=tuple([*self.verifies, *verifies][-KEEP_SAVES:]),
            restores=tuple([*self.restores, *restores][-KEEP_SAVES:]),
        )


def merged(on_disk: JobState, ours: JobState, run_id: str) -> JobState:
    """`ours` (this run's state, whose record is `run_id`), with the other runs' records as the
    file on disk has them now: each by its latest version, none dropped (newest KEEP_RUNS)."""
    records: dict[str, RunRecord] = {}
    anonymous: list[RunRecord] = []
    for record in (*ours.runs, *on_disk.runs):
        if not record.run_id:
            if record not in anonymous:
                anonymous.append(record)
            continue
        kept = records.get(record.run_id)
        mine = record.run_id == run_id
        if kept is None or (not mine and _newer(record, kept)):
            records[record.run_id] = record
    runs = sorted([*records.values(), *anonymous], key=lambda r: (r.started_at, r.run_id))
    return replace(ours, runs=tuple(runs[-KEEP_RUNS:]))


def _newer(one: RunRecord, other: RunRecord) -> bool:
    """The later of two versions of one run's record: seen later, or closed where the other is open."""
    return (one.seen_at, one.ending != "running") > (other.seen_at, other.ending != "running")


class StateIgnored(Exception):
    """The file exists but cannot be used; the message says why (for the log)."""


def parse(text: str, now: float) -> JobState:
    """The state in `text`, or StateIgnored with the reason."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        msg = f"corrupt: not JSON ({exc})"
        raise StateIgnored(msg) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        msg = f"not an esiwrap state file (expected format {FORMAT!r})"
        raise StateIgnored(msg)
    raw_updated = obj.get("updated_at")
    if not finite_number(raw_updated) or float(raw_updated) > now + 86_400.0:
        msg = "corrupt: updated_at is not a time"
        raise StateIgnored(msg)
    updated_at = float(raw_updated)
    if now - updated_at > MAX_AGE_S:
        days, limit = (now - updated_at) / 86_400.0, MAX_AGE_S / 86_400.0
        msg = f"stale: last written {days:.0f} days ago (limit {limit:.0f})"
        raise StateIgnored(msg)
    command = obj.get("command", [])
    if not isinstance(command, list) or not all(isinstance(w, str) for w in command):
        command = []
    checkpoint, durable = _checkpoint(obj.get("checkpoint"))
    return JobState(
        steps=_durations(obj, "steps", KEEP_STEPS), saves=_durations(obj, "saves", KEEP_SAVES),
        blocking=_durations(obj, "blocking", KEEP_SAVES), updated_at=updated_at,
        command=tuple(command), uploads=_durations(obj, "uploads", KEEP_SAVES),
        checkpoint=checkpoint, checkpoint_durable=durable, runs=_runs(obj.get("runs", [])),
        verifies=_durations(obj, "verifies", KEEP_SAVES), restores=_durations(obj, "restores", KEEP_SAVES),
    )


def render(state: JobState) -> str:
    obj: dict[str, Any] = {
        "format": FORMAT, "updated_at": round(state.updated_at, 3), "command": list(state.command),
        "steps": [round(s, 6) for s in state.steps], "saves": [round(s, 6) for s in state.saves],
        "blocking": [round(s, 6) for s in state.blocking], "uploads": [round(s, 6) for s in state.uploads],
    }
    for key in LATER_FIELDS:  # only once measured: the file reads as before without them
        values = getattr(state, key)
        if values:
            obj[key] = [round(s, 6) for s in values]
    if state.checkpoint is not None:
        c = state.checkpoint
        obj["checkpoint"] = {"step": c.step, "path": c.path, "at": round(c.completed_at, 3),
                             "durable": state.checkpoint_durable or "completed"}
    if state.runs:
        obj["runs"] = [record_to_json(r) for r in state.runs]
    return json.dumps(obj, separators=(",", ":")) + "\n"


def _checkpoint(value: object) -> tuple[Checkpoint | None, str]:
    """The recorded checkpoint; one that is malformed is dropped (the measurements still count)."""
    if not isinstance(value, dict):
        return None, ""
    step, path, at = value.get("step"), value.get("path", ""), value.get("at")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(path, str) \
            or not finite_number(at):
        return None, ""
    durable = value.get("durable")
    return Checkpoint(step, float(at), path), durable if isinstance(durable, str) else "completed"


def _runs(value: object) -> tuple[RunRecord, ...]:
    """The history; a record that is malformed is dropped (the others and the measurements count)."""
    if not isinstance(value, list):
        return ()
    records = (record_from_json(v) for v in value[-KEEP_RUNS:])
    return tuple(r for r in records if r is not None)


def _durations(obj: dict[str, Any], key: str, keep: int) -> tuple[float, ...]:
    values = obj.get(key, [])
    if not isinstance(values, list) or not all(finite_number(v) and v >= 0 for v in values):
        msg = f"corrupt: {key} must be a list of durations in seconds"
        raise StateIgnored(msg)
    return tuple(float(v) for v in values[-keep:])
