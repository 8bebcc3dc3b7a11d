"""`esiwrap report` on logs written by real runs of the demo trainer under esiwrap.

Three runs start together (about 60 s in all; the deadlines are generous because torch imports
are slow on a loaded machine, and the moving run's first one is set once its trainer is ready): a
happy path whose stdout and stderr go to one file that esiwrap takes for the journal
(`JOURNAL_STREAM`), so trainer output is interleaved with `<N>`-prefixed JSON lines; a save that
cannot finish before the deadline; and a deadline that moves earlier mid-run. The first two also
append to one shared `--log-file`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import PYTHON, ROOT, TINY_TRAINER, EsiwrapRun, event_time

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED, EXIT_USAGE
from esiwrap.times import iso_epoch

pytestmark = pytest.mark.system

CHANGING_DEADLINE = ROOT / "tests" / "lib" / "changing_deadline.py"


@dataclass
class Logs:
    journal: Path  # the happy run's stdout+stderr, as journald would receive them
    shared: Path  # --log-file of the happy run and the missed-save run
    change: Path  # --log-file of the run whose deadline moved
    happy_code: int
    missed_code: int
    change_code: int
    happy_run_id: str
    deadlines: tuple[float, float]  # the changing run's deadline, before and after the move


def _trainer(ckpt: Path, *extra: str) -> list[str]:
    return [PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(ckpt), "--step-seconds", "0.3", *extra]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ESIWRAP_", "NOTIFY_", "JOURNAL_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("report")
    shared, journal, change = tmp / "shared.jsonl", tmp / "journal.log", tmp / "change.jsonl"
    # the insurance save lands 12 s before the deadline: a final save still fits after a step
    # that a stalled node stretched to seconds
    quick = ["--redundant-time", "12", "--save-duration", "1", "--final-margin", "2"]

    journal_file = open(journal, "wb")  # noqa: SIM115 - handed to the child, closed below
    stat = os.fstat(journal_file.fileno())
    happy = subprocess.Popen(
        [PYTHON, "-m", "esiwrap", "--deadline", "+60s", *quick, "--log-file", str(shared),
         "--log-format", "console",  # ignored on the journal: lines stay JSON
         "--", *_trainer(tmp / "happy")],
        stdout=journal_file, stderr=journal_file, start_new_session=True,
        env=_env(JOURNAL_STREAM=f"{stat.st_dev}:{stat.st_ino}"),
    )
    missed = subprocess.Popen(
        [PYTHON, "-m", "esiwrap", "--deadline", "+55s", "--redundant-time", "4", "--save-duration", "1",
         "--stop-grace", "3", "--log-file", str(shared), "--",
         *_trainer(tmp / "missed", "--save-seconds", "60")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=_env(),
    )
    deadline_file = tmp / "deadline"  # none yet: written once the trainer is ready
    moving = EsiwrapRun([str(deadline_file), str(change), "--", *_trainer(tmp / "change")],
                        env=_env(), launcher=[PYTHON, str(CHANGING_DEADLINE)])
    try:
        moving.wait_event("trainer_attached", timeout=90)
        first_deadline = round(time.time() + 40, 3)
        deadline_file.write_text(f"{first_deadline:.3f}")
        moving.wait_event("save_scheduled", timeout=30)
        moved_deadline = round(time.time() + 12, 3)
        deadline_file.write_text(f"{moved_deadline:.3f}")
        moving.wait_event("deadline_changed", timeout=10)
        change_code = moving.finish(timeout=60)
        happy_code = happy.wait(timeout=120)
        missed_code = missed.wait(timeout=120)
    finally:
        moving.kill()
        for proc in (happy, missed):
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        journal_file.close()
    first = json.loads(journal.read_text().split("<6>", 1)[1].splitlines()[0])
    return Logs(journal, shared, change, happy_code, missed_code, change_code, first["run_id"],
                (first_deadline, moved_deadline))


def esiwrap_report(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "esiwrap", "report", *args], capture_output=True, text=True,
                          input=None if stdin is None else stdin.decode(), timeout=60)


def report_json(*args: str, stdin: bytes | None = None) -> dict[str, Any]:
    done = esiwrap_report(*args, "--json", stdin=stdin)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def raw_events(path: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's events straight from the log file, to check the report's figures against."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return [e for e in events if e["run_id"] == run_id]


def test_happy_and_missed_runs_in_one_log_file(logs: Logs) -> None:
    """Two runs in one file are reported apart, in start order, with figures matching their events."""
    assert (logs.happy_code, logs.missed_code) == (EXIT_CHECKPOINTED, EXIT_SAVE_MISSED)
    report = report_json(str(logs.shared))
    runs = {run["run_id"]: run for run in report["runs"]}
    assert len(runs) == 2 and report["skipped_lines"] == 0
    happy = runs.pop(logs.happy_run_id)
    missed = next(iter(runs.values()))

    events = raw_events(logs.shared, logs.happy_run_id)
    completed = [e for e in events if e["event"] == "save_completed"]
    exit_event = events[-1]
    assert happy["deadline"]["source"] == "cli" and happy["deadline_changes"] == []
    # Insurance first, final last; the 1 s guess was 30 times the real save, so the first,
    # early insurance save is taken again once measured (it costs next to nothing).
    assert [(s["kind"], s["outcome"], s["step"]) for s in happy["saves"]] == [
        (e["kind"], "completed", e["step"]) for e in completed]
    assert happy["saves"][0]["kind"] == "insurance" and happy["saves"][-1]["kind"] == "final"
    requested = [e for e in events if e["event"] == "save_requested"]
    started = [e for e in events if e["event"] == "save_started" and e.get("requested")]
    for save, event, request, start in zip(happy["saves"], completed, requested, started, strict=True):
        assert save["remaining_s"] == event["remaining_s"] > 0
        assert save["duration_s"] == event["duration_s"]
        assert save["planned_signal_at"] == request["planned_at"]
        # how late the signal came against its plan, and how long the trainer took to a step boundary
        assert save["signal_late_s"] == round(event_time(request) - iso_epoch(request["planned_at"]), 3) >= 0
        assert save["boundary_wait_s"] == round(event_time(start) - event_time(request), 3) >= 0
    first_done, last_done = happy["saves"][0], happy["saves"][-1]
    span = iso_epoch(last_done["started_at"]) - iso_epoch(first_done["completed_at"])
    per_step = round(span / (last_done["step"] - first_done["step"]), 3)
    # 0.3 s steps; the saves' own time is not counted (here they take milliseconds)
    assert 0.25 < happy["steps"]["pace_between_saves_s"] <= per_step
    assert happy["exit_code"] == EXIT_CHECKPOINTED and happy["complete"]
    risk = happy["work_at_risk"]
    assert risk["since"] == completed[-1]["timestamp"] and risk["until"] == exit_event["timestamp"]
    at_risk = iso_epoch(exit_event["timestamp"]) - iso_epoch(completed[-1]["timestamp"])
    assert risk["seconds"] == round(at_risk, 3)

    assert missed["exit_code"] == EXIT_SAVE_MISSED
    assert [(s["kind"], s["outcome"]) for s in missed["saves"]] == [("insurance", "missed")]
    assert missed["saves"][0]["started_at"] is not None  # it began, and never finished
    missed_events = raw_events(logs.shared, missed["run_id"])
    resolved = next(e for e in missed_events if e["event"] == "deadline_resolved")
    assert "start of the run" in missed["work_at_risk"]["since_what"]
    assert missed["work_at_risk"]["until_what"] == "the deadline"  # all of it, up to the deadline
    all_of_it = iso_epoch(resolved["deadline"]) - event_time(missed_events[0])
    assert missed["work_at_risk"]["seconds"] == round(all_of_it, 3)
    assert any(w["event"] == "save_missed" for w in missed["warnings"])

    order = [run["run_id"] for run in report["runs"]]
    last = report_json(str(logs.shared), "--last")["runs"]
    assert [run["run_id"] for run in last] == order[-1:]


def test_text_report_tells_the_story(logs: Logs) -> None:
    """The human report has the deadline, both saves, the stop, the exit codes and the risk."""
    done = esiwrap_report(str(logs.shared))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"run {logs.happy_run_id}" in text
    for expected in ("exit 75 (stopped after a completed checkpoint", "exit 76 (no acknowledged checkpoint",
                     "insurance (deadline) completed", "final (deadline) completed",
                     "insurance (deadline) missed", "from cli", "at risk", "SIGTERM to the command",
                     "timeline", "(2 runs; 0 other lines skipped)"):
        assert expected in text, expected


def test_journal_stream_lines_and_interleaved_trainer_output(logs: Logs) -> None:
    """On the journal: every esiwrap line is `<priority>` + one JSON object, even with
    --log-format console; the report reads it from stdin among the trainer's own lines."""
    lines = logs.journal.read_text().splitlines()
    ours = [line for line in lines if line.startswith("<")]
    trainer = [line for line in lines if line.startswith("tiny_trainer:")]
    assert len(ours) + len(trainer) == len(lines) and len(trainer) >= 3
    for line in ours:
        priority, _, body = line[1:].partition(">")
        event = json.loads(body)
        assert int(priority) == {"info": 6, "warning": 4, "error": 3}[event["level"]]

    from_journal = report_json("-", stdin=logs.journal.read_bytes())
    from_file = report_json(str(logs.shared))
    (run,) = from_journal["runs"]
    same = next(r for r in from_file["runs"] if r["run_id"] == logs.happy_run_id)
    assert from_journal["skipped_lines"] == len(trainer)
    assert run["saves"] == same["saves"] and run["work_at_risk"] == same["work_at_risk"]


def test_truncated_last_line(logs: Logs, tmp_path: Path) -> None:
    """A log cut off mid-line (the instance went away): the partial line is skipped, the run
    is reported as unfinished, and work at risk runs to the deadline."""
    data = logs.journal.read_bytes()
    cut = tmp_path / "cut.log"
    cut.write_bytes(data[: len(data.rstrip(b"\n")) - 15])
    report = report_json(str(cut))
    (run,) = report["runs"]
    assert report["skipped_lines"] == report_json(str(logs.journal))["skipped_lines"] + 1
    assert run["complete"] is False and run["exit_code"] is None
    final_save = run["saves"][-1]
    assert final_save["outcome"] == "completed"
    risk = run["work_at_risk"]
    assert risk["until"] == run["deadline"]["at"] and "deadline" in risk["until_what"]
    at_risk = iso_epoch(run["deadline"]["at"]) - iso_epoch(final_save["completed_at"])
    assert risk["seconds"] == round(at_risk, 3)
    text = esiwrap_report(str(cut)).stdout
    assert "no supervisor_exit" in text


def test_deadline_change_is_reported(logs: Logs) -> None:
    """A deadline moved earlier mid-run: the change, its source and the saves against it."""
    assert logs.change_code == EXIT_CHECKPOINTED
    (run,) = report_json(str(logs.change))["runs"]
    (change,) = run["deadline_changes"]
    assert run["deadline"]["source"] == change["source"] == "file"
    before, after = logs.deadlines
    assert iso_epoch(change["old"]) == pytest.approx(before, abs=0.002)
    assert iso_epoch(change["new"]) == pytest.approx(after, abs=0.002)
    assert change["moved_s"] == pytest.approx(after - before, abs=0.004) and change["moved_s"] < -5
    new_deadline = iso_epoch(change["new"])
    saves = [(s["kind"], s["outcome"]) for s in run["saves"]]
    assert saves[0] == ("insurance", "completed") and saves[-1] == ("final", "completed")
    assert {outcome for _, outcome in saves} == {"completed"}
    # The final save is planned ~2 s after the insurance save's moment: its save_scheduled is
    # logged all the same (a new save always is; only re-plans of one save are thinned out).
    assert all(s["first_planned_at"] for s in run["saves"])
    assert all(iso_epoch(s["completed_at"]) < new_deadline for s in run["saves"])
    assert iso_epoch(run["work_at_risk"]["until"]) <= new_deadline
    text = esiwrap_report(str(logs.change)).stdout
    assert f"changed to {change['new']} from file" in text


def test_no_esiwrap_lines_is_a_one_line_error(tmp_path: Path) -> None:
    """A file without esiwrap events (the trainer's output, the wrong file) or no file: exit 2."""
    other = tmp_path / "trainer.out"
    other.write_text("tiny_trainer: starting at step 0\n{\"not\": \"ours\"}\n")
    done = esiwrap_report(str(other))
    assert done.returncode == EXIT_USAGE
    assert done.stderr.count("\n") == 1 and "no esiwrap log lines" in done.stderr
    missing = esiwrap_report(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == EXIT_USAGE and missing.stderr.count("\n") == 1
