"""`esiwrap status`: what a running esiwrap knows, read from its status file.

Every supervisor writes its latest `Snapshot` as JSON to a status file (atomically, like the
metrics file) and removes it when it exits; `esiwrap.shell.statusfile` says where. `esiwrap status`
looks in every candidate directory (for its own user) and shows each esiwrap whose process is
alive; a file left by a process that is gone (killed with SIGKILL, the machine restarted) is
ignored.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from esiwrap.core.snapshot import Snapshot
from esiwrap.shell.process import pid_exists
from esiwrap.shell.statusfile import candidate_dirs
from esiwrap.shell.systemd.status_line import human_duration


# ---------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Found:
    path: str
    snapshot: Snapshot


@dataclass
class Search:
    running: list[Found]
    stale: list[str]  # status files of processes that are gone
    unreadable: list[str]  # not a snapshot (another program's file, a newer format)
    looked_in: list[str]


def find_running(explicit: str | None, environ: Mapping[str, str], uid: int) -> Search:
    """The status files of running esiwraps: `explicit` alone when given, else every candidate
    directory's `*.json`."""
    if explicit:
        paths, looked = [explicit], [explicit]
    else:
        looked = candidate_dirs(environ, uid)
        if uid != 0:
            looked.append("/run/esiwrap")  # a root service's, readable by all
        paths = sorted({os.path.join(d, name) for d in looked for name in _listdir(d)
                        if name.endswith(".json")})
    search = Search([], [], [], looked)
    seen: set[str] = set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        _classify(path, search)
    search.running.sort(key=lambda f: f.snapshot.pid)
    return search


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _classify(path: str, search: Search) -> None:
    try:
        with open(path, "rb") as handle:
            snapshot = Snapshot.from_json(handle.read())
    except FileNotFoundError:
        return  # removed as we looked: that esiwrap has just exited
    except (OSError, ValueError):
        search.unreadable.append(path)
        return
    if is_esiwrap(snapshot.pid):
        search.running.append(Found(path, snapshot))
    else:
        search.stale.append(path)


def is_esiwrap(pid: int) -> bool:
    """The process exists and, where /proc says so, runs esiwrap (a reused pid does not count)."""
    if not pid_exists(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return True  # no /proc (or hidden): existence is all we can know
    return b"esiwrap" in cmdline


# ---------------------------------------------------------------------- for people
def render_text(found: Sequence[Found], now: float) -> str:
    return "\n\n".join(describe(f.snapshot, now, f.path) for f in found) + "\n"


def describe(s: Snapshot, now: float, path: str | None = None) -> str:
    """A few lines a person reads in seconds: deadline, next save, checkpoint, work at risk."""
    trainers = f"{s.trainers} trainer{'' if s.trainers == 1 else 's'} attached"
    child = f"child {s.child_pid}, " if s.child_pid is not None else ""
    age = now - s.time
    updated = f"; updated {human_duration(age)} ago" if age >= 60 else ""
    lines = [f"esiwrap {s.pid} (run {s.run_id}): {s.phase.replace('_', ' ')}; {child}{trainers}{updated}"]
    lines.append(_row("deadline", _deadline(s, now)))
    lines.append(_row("next save", _next_save(s, now)))
    lines.append(_row("checkpoint", _checkpoint(s, now)))
    risk = s.work_at_risk_at(now)
    lines.append(_row("at risk", "unknown" if risk is None else f"{human_duration(risk)} of training"))
    lines.append(_row("estimates", _estimates(s)))
    if path is not None:
        lines.append(_row("file", path))
    return "\n".join(lines)


def summary(s: Snapshot, now: float) -> str:
    """The same facts on one line (for a prompt, a tmux status bar, a log)."""
    parts = ["deadline " + _deadline(s, now)]
    if s.next_save_at is not None:
        parts.append(_next_save(s, now))
    if s.last_checkpoint_step is not None:
        parts.append(f"last checkpoint step {s.last_checkpoint_step}{_checkpoint_age(s, now)}")
    risk = s.work_at_risk_at(now)
    if risk is not None:
        parts.append(f"work at risk {human_duration(risk)}")
    return "; ".join(parts)


def _row(label: str, text: str) -> str:
    return f"  {label:<11} {text}"


def _deadline(s: Snapshot, now: float) -> str:
    if s.deadline_at is None:
        return "none known"
    when = _relative(s.deadline_at, now, "passed")
    return f"{when} ({clock(s.deadline_at, now)}) from {s.deadline_source or 'unknown'}"


def _relative(at: float, now: float, past: str) -> str:
    """'in 28m', or '<past> 5m ago' once the moment has gone by."""
    left = at - now
    return f"in {human_duration(left)}" if left >= 0 else f"{past} {human_duration(-left)} ago"


def _next_save(s: Snapshot, now: float) -> str:
    if s.next_save_at is None:
        return "none planned"
    when = _relative(s.next_save_at, now, "due")
    reason = f": {s.next_save_reason}" if s.next_save_reason else ""
    return f"{s.next_save_kind or 'save'} save at {clock(s.next_save_at, now)} ({when}){reason}"


def _checkpoint(s: Snapshot, now: float) -> str:
    counts = f"{s.saves_completed} completed, {s.saves_failed} failed, {s.saves_missed} missed"
    if s.last_checkpoint_step is None and s.last_checkpoint_at is None:
        return f"none yet ({counts})"
    step = f"step {s.last_checkpoint_step}" if s.last_checkpoint_step is not None else "step unknown"
    return f"{step}{_checkpoint_age(s, now)} ({counts})"


def _checkpoint_age(s: Snapshot, now: float) -> str:
    return "" if s.last_checkpoint_at is None else f", {human_duration(now - s.last_checkpoint_at)} ago"


def _estimates(s: Snapshot) -> str:
    step = f"step {s.step_estimate_s:.3g}s" if s.step_estimate_s is not None else "step unknown"
    save = f"save {s.save_estimate_s:.3g}s" if s.save_estimate_s is not None else "save unknown"
    last = f"; last step {s.last_step}" if s.last_step is not None else ""
    return f"{step}, {save}{last}"


def clock(epoch_s: float, now: float) -> str:
    """Local time of day, with the date when it is not within the next or last 12 hours."""
    fmt = "%H:%M:%S %Z" if abs(epoch_s - now) < 12 * 3600 else "%Y-%m-%d %H:%M:%S %Z"
    return time.strftime(fmt, time.localtime(epoch_s))


def to_json(found: Sequence[Found], now: float) -> str:
    """For scripts: every running esiwrap's snapshot, plus where it was read and its age."""
    runs = []
    for f in found:
        item = json.loads(f.snapshot.to_json())
        item.update(status_file=f.path, age_s=round(now - f.snapshot.time, 3),
                    remaining_s=_rounded(f.snapshot.remaining_s(now)),
                    work_at_risk_now_s=_rounded(f.snapshot.work_at_risk_at(now)))
        runs.append(item)
    return json.dumps({"runs": runs}, indent=2) + "\n"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
