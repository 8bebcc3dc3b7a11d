"""esiwrap in real Slurm jobs: a cluster of Debian's slurmctld, slurmd and munged (22.05),
started by this module and stopped by PID at its end (tests/lib/slurm_cluster.py).

The end-to-end run: `sbatch --time=2 --requeue` a job that execs `esiwrap --slurm-requeue --
tiny_trainer.py`; a TimeLimit update moves the end a minute earlier; esiwrap follows it, saves
before it, requeues, exits 75; the job runs again with SLURM_RESTART_COUNT=1 and resumes from
the checkpoint; then `scancel` (SIGCONT and SIGTERM to every process of the job, SIGKILL after
KillWait, as at the time limit) checkpoints once more, without a requeue.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import PYTHON, TINY_TRAINER, wait_until
from slurm_cluster import SlurmCluster, missing_programs, wait_for_file_text

from esiwrap.times import iso_utc

pytestmark = pytest.mark.system

Event = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_programs()
    assert not missing, f"{missing} missing: scripts/test.sh installs slurmctld slurmd slurm-client munge"
    started = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield started
    finally:
        started.stop()
    assert started.leftovers() == []


def log_events(path: Path) -> list[Event]:
    events = []
    if path.exists():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line being written
    return events


def wait_event(path: Path, match: Callable[[Event], bool], timeout: float, what: str) -> Event:
    found: list[Event] = []

    def seen() -> bool:
        found[:] = [e for e in log_events(path) if match(e)]
        return bool(found)

    if not wait_until(seen, timeout, interval=0.2):
        names = [e.get("event") for e in log_events(path)]
        msg = f"no {what} in {path} within {timeout:g}s; events: {names}"
        raise AssertionError(msg)
    return found[0]


def first_event(path: Path, name: str, run_id: str) -> Event:
    return next(e for e in log_events(path) if e.get("event") == name and e["run_id"] == run_id)


def esiwrap_job(tmp: Path, *esiwrap_args: str, trainer_args: tuple[str, ...] = ()) -> Path:
    """A batch script that execs esiwrap (so Slurm's SIGTERM reaches esiwrap, not a shell that
    would die of it and leave the rest to SIGKILL)."""
    script = tmp / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "job run, SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-unset}"\n'
        f"exec {PYTHON} -m esiwrap {' '.join(esiwrap_args)} -- "
        f"{PYTHON} {TINY_TRAINER} {' '.join(trainer_args)}\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script


def test_time_limit_checkpoint_requeue_resume_then_scancel(cluster: SlurmCluster, tmp_path: Path) -> None:
    """The end from Slurm, moved by scontrol update, saved before, requeued, resumed; a scancel
    checkpoints the resumed run and does not bring the job back."""
    log, out, ckpt = tmp_path / "esiwrap.jsonl", tmp_path / "job.out", tmp_path / "ckpt"
    script = esiwrap_job(
        tmp_path, "--slurm-requeue", "--refresh", "5", "--redundant-time", "10", "--save-duration", "2",
        "--log-file", str(log), trainer_args=("--ckpt-dir", str(ckpt), "--step-seconds", "0.5"))
    job = cluster.sbatch(script, "--time=2", "--requeue", "--open-mode=append", f"--output={out}")

    first = wait_event(log, lambda e: e.get("event") == "trainer_attached", 90, "trainer_attached")
    run1 = first["run_id"]
    resolved = first_event(log, "deadline_resolved", run1)
    assert resolved["source"] == "slurm" and resolved["job"] == job
    assert first["sigterm"] == "save" and first["stop_signal"] == "SIGHUP"

    # One minute earlier: the new limit is the one Slurm enforces, and esiwrap plans with it.
    cluster.client("scontrol", "update", f"JobId={job}", "TimeLimit=1")
    new_end = cluster.end_time(job)
    changed = wait_event(log, lambda e: e.get("event") == "deadline_changed" and e["run_id"] == run1, 30,
                         "deadline_changed")
    assert changed["source"] == "slurm" and changed["new"] == iso_utc(new_end)

    exit1 = wait_event(log, lambda e: e.get("event") == "supervisor_exit" and e["run_id"] == run1, 120,
                       "the first run's exit")
    events1 = [e for e in log_events(log) if e["run_id"] == run1]
    names1 = [e["event"] for e in events1]
    assert exit1["code"] == 75
    assert names1.index("slurm_requeued") < names1.index("supervisor_exit")
    requeued = next(e for e in events1 if e["event"] == "slurm_requeued")
    assert requeued["job"] == job and requeued["restart_count"] == 1
    saves = [e for e in events1 if e["event"] == "save_completed"]
    assert saves and all(e["remaining_s"] > 0 for e in saves)
    last_saved = saves[-1]["step"]
    assert exit1["timestamp"] < iso_utc(new_end)  # done before the end: no time-limit cancel
    assert next(e for e in events1 if e["event"] == "child_exited")["signal"] == "SIGHUP"

    # The second run: SLURM_RESTART_COUNT=1, resumed from the checkpoint.
    second = wait_event(log, lambda e: e.get("event") == "trainer_attached" and e["run_id"] != run1, 90,
                        "the second run's trainer_attached")
    run2 = second["run_id"]
    resolved2 = first_event(log, "deadline_resolved", run2)
    assert resolved2["restart_count"] == "1"
    text = wait_for_file_text(out, f"starting at step {last_saved}", 30)
    assert "SLURM_RESTART_COUNT=1" in text
    assert "Restarts=1" in cluster.client("scontrol", "show", "job", job).stdout

    # scancel: Slurm sends SIGTERM to esiwrap and to the trainer itself; the trainer saves
    # instead of dying, esiwrap stops it after the acknowledgement and does not requeue.
    cluster.client("scancel", job)
    exit2 = wait_event(log, lambda e: e.get("event") == "supervisor_exit" and e["run_id"] == run2, 30,
                       "the second run's exit")
    events2 = [e for e in log_events(log) if e["run_id"] == run2]
    assert exit2["code"] == 75
    requested = next(e for e in events2 if e["event"] == "save_requested")
    assert requested["reason"] == "sigterm"
    assert any(e["event"] == "save_completed" for e in events2)
    assert next(e for e in events2 if e["event"] == "child_exited")["signal"] == "SIGHUP"
    skipped = next(e for e in events2 if e["event"] == "slurm_requeue_skipped")
    assert skipped["job"] == job and "cancelled" in skipped["reason"]

    assert wait_until(lambda: cluster.job_field(job, "%T") == "", 60, interval=0.5), "the job did not end"
    output = out.read_text(encoding="utf-8", errors="replace")
    assert "DUE TO TIME LIMIT" not in output
    assert len(re.findall(r"^job run,", output, re.MULTILINE)) == 2
    assert {e["run_id"] for e in log_events(log)} == {run1, run2}


def test_an_array_task_reads_its_own_end(cluster: SlurmCluster, tmp_path: Path) -> None:
    """`esiwrap deadline` in array task 3: the slurm source asks for <array job>_3, whose end it
    shows (the array's own id would name every task)."""
    out = tmp_path / "deadline.json"
    job = cluster.client("sbatch", "--parsable", "--array=3", "--time=5", f"--output={tmp_path / 'task.out'}",
                         f"--wrap={PYTHON} -m esiwrap deadline --json --sources slurm > {out}").stdout.strip()
    assert wait_until(lambda: out.exists() and out.stat().st_size > 0, 60, interval=0.3)
    wait_until(lambda: cluster.job_field(f"{job}_3", "%T") == "", 30, interval=0.3)
    report = json.loads(out.read_text())
    (answer,) = report["sources"]
    assert answer["ok"] and answer["job"] == f"{job}_3" and answer["via"] == "squeue"
    assert report["source"] == "slurm"
    assert 4 * 60 - 30 < answer["remaining_s"] <= 5 * 60
