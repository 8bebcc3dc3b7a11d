"""The job's history and the no-progress guard, with real esiwrap runs sharing one `--state-file`.

* A job whose every slot is shorter than a step: three runs end with no checkpoint (exit 76); the
  fourth does not start its command, logs `no_progress` naming the runs, the steps, the cause and
  the fix, and exits 78; the run after it (started again by hand) runs.
* A job that progresses: five runs, each resuming from the last checkpoint, all exit 75.
* A run killed with SIGKILL leaves its record open; the next run on this host closes it with the
  exposure it had: `killed` (its machine lived on: no interruption of the capacity; the state
  file's lock says so). A run that vanished with its machine is `test_state_lock.py`'s.
"""

from __future__ import annotations

import itertools
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import PLAIN_TRAINER, PYTHON, EsiwrapRun, kill_leftovers

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_NO_PROGRESS, EXIT_SAVE_MISSED

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
FAST = ["--stop-grace", "2", "--status-file", "none", "--redundant-time", "1", "--save-duration", "0.3",
        "--final-margin", "0.5", "--no-probe-storage"]


def _run(tmp: Path, deadline: str, step_s: float, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    run = EsiwrapRun(["--deadline", deadline, *FAST, "--state-file", str(tmp / "state.json"), *extra, "--",
                      PYTHON, str(PLAIN_TRAINER), "--ckpt", str(tmp / "ckpt.json"), "--step-seconds",
                      str(step_s)])
    try:
        code = run.finish(timeout=120)
    finally:
        run.kill()
    return code, run.events


def _runs(tmp: Path) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = json.loads((tmp / "state.json").read_text())["runs"]
    return runs


def test_too_short_slots_are_stopped_at_run_n_plus_one(tmp_path: Path) -> None:
    codes = [_run(tmp_path, "+3s", 8.0)[0] for _ in range(3)]
    assert codes == [EXIT_SAVE_MISSED] * 3
    code, events = _run(tmp_path, "+3s", 8.0, "--slurm-requeue")
    assert code == EXIT_NO_PROGRESS
    names = [e["event"] for e in events]
    assert "child_started" not in names  # the command never ran
    assert not [n for n in names if n.startswith("slurm_requeue")]  # only exit 75 is requeued
    (guard,) = [e for e in events if e["event"] == "no_progress"]
    assert guard["level"] == "error" and guard["limit"] == 3
    assert [r["end_step"] for r in guard["runs"]] == [None, None, None]
    assert [r["run_id"] for r in guard["runs"]] == [r["run_id"] for r in _runs(tmp_path)[:3]]
    assert guard["cause"].startswith("slot shorter than a step plus a save")
    assert "longer slots" in guard["fix"]
    (exit_line,) = [e for e in events if e["event"] == "supervisor_exit"]
    assert exit_line["code"] == EXIT_NO_PROGRESS and "--max-no-progress-runs" in exit_line["reason"]
    assert [r["ending"] for r in _runs(tmp_path)] == ["announced"] * 3 + ["no_progress"]
    # started again after the fix (here: by hand, unchanged): the stopped run ended the count
    assert _run(tmp_path, "+3s", 8.0)[0] == EXIT_SAVE_MISSED


def test_the_guard_is_off_at_zero(tmp_path: Path) -> None:
    assert _run(tmp_path, "+3s", 8.0, "--max-no-progress-runs", "1")[0] == EXIT_SAVE_MISSED
    assert _run(tmp_path, "+3s", 8.0, "--max-no-progress-runs", "0")[0] == EXIT_SAVE_MISSED
    assert _run(tmp_path, "+3s", 8.0, "--max-no-progress-runs", "1")[0] == EXIT_NO_PROGRESS


def test_a_job_that_progresses_is_never_stopped(tmp_path: Path) -> None:
    codes = [_run(tmp_path, "+5s", 0.2)[0] for _ in range(4)]
    code, events = _run(tmp_path, "+5s", 0.2, "--slurm-requeue")
    assert [*codes, code] == [EXIT_CHECKPOINTED] * 5
    assert "slurm_requeue_failed" in [e["event"] for e in events]  # exit 75 is (here: outside Slurm)
    runs = _runs(tmp_path)
    assert [r["ending"] for r in runs] == ["announced"] * 5
    ends = [r["end_step"] for r in runs]
    assert all(b > a for a, b in itertools.pairwise(ends)), ends
    assert [r.get("start_step") for r in runs[1:]] == ends[:-1]  # each run starts where the last ended


def test_a_killed_run_is_closed_with_its_exposure(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    run = EsiwrapRun(["--deadline", "+120s", *FAST, "--log-level", "debug", "--state-file", str(state),
                      "--", PYTHON, str(PLAIN_TRAINER), "--ckpt", str(tmp_path / "ckpt.json"),
                      "--step-seconds", "0.2"])
    try:
        run.wait_event("child_started", timeout=60)
        run.wait_for(lambda e: state.exists() and e["event"] == "step_observed", 60)
        child = run.child_pid()
        run.signal(signal.SIGKILL)
        run.finish(timeout=30)
    finally:
        run.kill()
        kill_leftovers(run.pid)
    kill_leftovers(child)
    (open_record,) = _runs(tmp_path)
    assert open_record["ending"] == "running"
    assert _run(tmp_path, "+4s", 0.2)[0] == EXIT_CHECKPOINTED
    killed, after = _runs(tmp_path)
    assert killed["run_id"] == open_record["run_id"] and killed["ending"] == "killed"
    assert killed["seen_at"] >= open_record["seen_at"] > killed["started_at"]
    assert after["ending"] == "announced" and after["host"] == killed["host"]
