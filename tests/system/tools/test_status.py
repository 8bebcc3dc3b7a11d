"""`esiwrap status` against live processes that keep a status file the way the supervisor does
(the real Observer in a real selector loop: tests/lib/children/esiwrap_observed.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import CHILDREN, PYTHON
from full_snapshot import snapshot

from esiwrap.core.snapshot import Snapshot
from esiwrap.shell.statusfile import default_status_file
from esiwrap.tools.status import describe, summary

OBSERVED = CHILDREN / "esiwrap_observed.py"


class Observed:
    """A live process with a status file; `show()` hands it a snapshot and waits until written."""

    def __init__(self, status_arg: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([PYTHON, str(OBSERVED), status_arg], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().split()  # blocks until the child says ready (or dies)
        assert ready[:1] == ["ready"], ready
        self.status_file = ready[1]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def show(self, s: Snapshot) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(replace(s, pid=self.pid).to_json() + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "updated"

    def finish(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)


@pytest.fixture
def observed() -> Iterator[Callable[..., Observed]]:
    started: list[Observed] = []

    def start(status_arg: str, **env: str) -> Observed:
        started.append(Observed(status_arg, {**os.environ, **env}))
        return started[-1]

    yield start
    for item in started:
        with contextlib.suppress(ProcessLookupError):
            item.proc.kill()
        item.proc.wait(timeout=10)


def status(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "esiwrap", "status", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


def live_snapshot() -> Snapshot:
    """Deadline in 41 min, insurance save in 28, checkpoint 6 min ago (a margin for slow starts)."""
    now = time.time()
    return replace(snapshot(), time=now, deadline_at=now + 41 * 60 + 40, next_save_at=now + 28 * 60 + 40,
                   last_checkpoint_at=now - 6 * 60 - 5, work_at_risk_s=6 * 60 + 5.0)


@pytest.mark.system
def test_status_tells_a_person_what_a_live_esiwrap_knows(
        observed: Callable[..., Observed], tmp_path: Path) -> None:
    """The facts a person needs, each on its line; --json gives the same for scripts."""
    path = tmp_path / "job.json"
    run = observed(str(path))
    run.show(live_snapshot())
    done = status("--status-file", str(path))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"esiwrap {run.pid} (run 3f2a9c0d1e2f): running; child 4250, 1 trainer attached" in text
    assert "deadline    in 41m (" in text and ") from volcengine" in text
    assert "insurance save at " in text and "(in 28m): last safe moment before the deadline" in text
    assert "checkpoint  step 1200, 6m ago (2 completed, 1 failed, 0 missed)" in text
    assert "at risk     6m of training" in text
    assert "estimates   step 1.25s, save 45s; last step 1300" in text

    done = status("--json", ESIWRAP_STATUS_FILE=str(path))
    assert done.returncode == 0
    (item,) = json.loads(done.stdout)["runs"]
    assert item["pid"] == run.pid and item["status_file"] == str(path)
    assert 41 * 60 < item["remaining_s"] <= 41 * 60 + 40
    assert item["deadline_source"] == "volcengine" and item["last_checkpoint_step"] == 1200
    assert run.finish() == 0
    assert not path.exists()  # esiwrap removes its status file on the way out
    gone = status("--status-file", str(path))
    assert gone.returncode == 3 and gone.stdout == ""
    assert gone.stderr.strip() == f"esiwrap: no esiwrap is running (no live status file in {path})"


@pytest.mark.system
def test_default_location_and_several_runs(observed: Callable[..., Observed], tmp_path: Path) -> None:
    """Without --status-file: $XDG_RUNTIME_DIR/esiwrap/<pid>.json; every live run is listed,
    --pid picks one, and an unknown pid says which ones run."""
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    first, second = observed("auto", **env), observed("auto", **env)
    assert first.status_file == str(tmp_path / "esiwrap" / f"{first.pid}.json")
    first.show(live_snapshot())
    second.show(replace(live_snapshot(), run_id="second0000ab", phase="save_requested"))
    listed = status(**env)
    assert listed.returncode == 0
    assert f"esiwrap {first.pid} (run 3f2a9c0d1e2f): running" in listed.stdout
    assert f"esiwrap {second.pid} (run second0000ab): save requested" in listed.stdout
    oneline = status("--oneline", **env)
    assert f"esiwrap {first.pid}: deadline in 41m (" in oneline.stdout
    assert f"esiwrap {second.pid}: deadline in 41m (" in oneline.stdout
    picked = status("--pid", str(second.pid), **env)
    assert picked.returncode == 0 and "second0000ab" in picked.stdout and "3f2a9c0d1e2f" not in picked.stdout
    missing = status("--pid", "1", **env)
    assert missing.returncode == 3 and missing.stdout == ""
    assert "no running esiwrap has pid 1 (running: " in missing.stderr and str(first.pid) in missing.stderr


@pytest.mark.system
def test_a_killed_esiwrap_is_not_reported_as_running(
        observed: Callable[..., Observed], tmp_path: Path) -> None:
    """SIGKILL leaves the file behind; its pid is dead, so status says nothing runs, and why."""
    path = tmp_path / "job.json"
    run = observed(str(path))
    run.show(live_snapshot())
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(timeout=10)
    assert path.exists()
    done = status("--status-file", str(path))
    assert done.returncode == 3
    assert "no esiwrap is running" in done.stderr
    assert f"ignored 1 left by exited processes: {path}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.system
def test_not_a_status_file_is_said_so(tmp_path: Path) -> None:
    """A file that is not a snapshot: named as such, exit 3, no traceback."""
    path = tmp_path / "other.json"
    path.write_text('{"hello": 1}')
    done = status("--status-file", str(path))
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert f"not status files: {path}" in done.stderr


def test_default_status_file_skips_a_directory_someone_else_made(tmp_path: Path) -> None:
    """Under /tmp a directory of the right name could be planted by another user or be a
    symlink: such a directory is not used."""
    planted = tmp_path / "planted"
    planted.mkdir()
    (tmp_path / "esiwrap").symlink_to(planted)
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    chosen = default_status_file(env, 4242, os.getuid())
    assert chosen is not None and not chosen.startswith(str(tmp_path))


def test_summary_line_and_a_run_without_a_deadline() -> None:
    """One line for prompts; and nothing known yet reads as such, not as zeros."""
    s = live_snapshot()
    line = summary(s, s.time)
    assert line.startswith("deadline in 41m (") and "; insurance save at " in line
    assert "; last checkpoint step 1200, 6m ago" in line and line.endswith("; work at risk 6m")
    blank: dict[str, Any] = {k: None for k in ("deadline_at", "deadline_source", "next_save_at",
                                                "next_save_kind", "next_save_reason", "step_estimate_s",
                                                "save_estimate_s", "last_step", "last_checkpoint_at",
                                                "last_checkpoint_step", "work_at_risk_s", "child_pid")}
    text = describe(replace(s, **blank, saves_completed=0, saves_failed=0, saves_missed=0), s.time)
    assert "deadline    none known" in text and "next save   none planned" in text
    assert "checkpoint  none yet (0 completed, 0 failed, 0 missed)" in text
    assert "at risk     unknown" in text and "estimates   step unknown, save unknown" in text


def test_the_status_lines_fields_round_trip_and_an_older_file_still_reads() -> None:
    """The fields the systemd status line reads travel in the status file; a file written before
    they existed reads with them unknown (False, None), and a wrong type is named."""
    s = replace(snapshot(), deadline_pending=True, requested_save_kind="sigterm", saving_step=7,
                stop_reason="SIGTERM")
    assert Snapshot.from_json(s.to_json()) == s
    older = {k: v for k, v in json.loads(s.to_json()).items()
             if k not in ("deadline_pending", "requested_save_kind", "saving_step", "stop_reason")}
    read = Snapshot.from_json(json.dumps(older))
    assert (read.deadline_pending, read.requested_save_kind, read.saving_step, read.stop_reason) == (
        False, None, None, None)
    with pytest.raises(ValueError, match="deadline_pending"):
        Snapshot.from_json(json.dumps({**older, "deadline_pending": 1}))
