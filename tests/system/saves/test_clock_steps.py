"""esiwrap under a wall clock stepped while it runs (libfaketime: only the wall clock moves; the
monotonic clock, sleeps and timeouts stay real), with a real trainer.

* A step of +30 s or -30 s mid-run: `clock_jumped` names it, the plan follows it, and the run still
  ends in exit 75 before the deadline (on the clock the run reads).
* A step past the deadline while the trainer is alive: a last-chance save; exit 75 when it
  completes (the reason says it came after the deadline), a 76 that names the jump when the save
  cannot finish within --stop-grace.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from esiwrap_harness import PLAIN_TRAINER, PYTHON, EsiwrapRun, event_time
from faketime import WallClock

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED
from esiwrap.times import iso_epoch

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]
FAST = ["--stop-grace", "5", "--status-file", "none", "--redundant-time", "5", "--save-duration", "0.3",
        "--final-margin", "1", "--no-probe-storage", "--log-level", "debug"]


def start(tmp: Path, clock: WallClock, deadline: str, *trainer: str) -> EsiwrapRun:
    return EsiwrapRun(["--deadline", deadline, *FAST, "--", PYTHON, str(PLAIN_TRAINER), "--ckpt",
                       str(tmp / "ckpt.json"), "--step-seconds", "0.5", *trainer], env=clock.env())


def stepped(run: EsiwrapRun, clock: WallClock, seconds: float) -> None:
    """Step the run's wall clock once the trainer has reported a few steps."""
    run.wait_for(lambda e: e["event"] == "step_observed" and e.get("step", 0) >= 4, 90, "four steps")
    clock.step(seconds)


def stepped_run(tmp: Path, clock: WallClock, deadline: str, seconds: float, *trainer: str,
                timeout: float = 120) -> tuple[EsiwrapRun, int]:
    """A run whose wall clock steps by `seconds` after four steps; the run and its exit code."""
    run = start(tmp, clock, deadline, *trainer)
    try:
        stepped(run, clock, seconds)
        return run, run.finish(timeout=timeout)
    finally:
        run.kill()


@pytest.mark.parametrize("seconds", [30.0, -30.0])
def test_a_step_mid_run_is_named_and_the_run_still_ends_in_75_before_its_deadline(
        tmp_path: Path, wall_clock: WallClock, seconds: float) -> None:
    run, code = stepped_run(tmp_path, wall_clock, "+45s", seconds, timeout=150)
    assert code == EXIT_CHECKPOINTED, run.story()
    (jumped,) = [e for e in run.events if e["event"] == "clock_jumped"]
    assert jumped["direction"] == ("forward" if seconds > 0 else "back")
    assert abs(jumped["jump_s"] - seconds) < 2.0, jumped
    deadline = iso_epoch(run.first("deadline_resolved")["deadline"])
    assert event_time(run.first("supervisor_exit")) < deadline  # on the clock the run reads
    replanned = [e for e in run.events if e["event"] == "save_scheduled"
                 and e["why"].startswith("after the wall clock jumped")]
    assert replanned, "the plan after the jump says it follows it"


def test_a_step_past_the_deadline_gets_a_last_chance_save_and_exit_75(
        tmp_path: Path, wall_clock: WallClock) -> None:
    run, code = stepped_run(tmp_path, wall_clock, "+60s", 120.0)
    assert code == EXIT_CHECKPOINTED, run.story()
    (alive,) = [e for e in run.events if e["event"] == "deadline_passed_alive"]
    assert alive["clock_jump"]["jump_s"] > 100
    assert next(e["reason"] for e in run.events if e["event"] == "save_requested") == "last_chance"
    (exit_line,) = [e for e in run.events if e["event"] == "supervisor_exit"]
    assert "after the deadline (a last-chance save" in exit_line["reason"]
    assert (tmp_path / "ckpt.json").exists()


def test_a_last_chance_save_that_cannot_finish_is_a_76_that_names_the_jump(
        tmp_path: Path, wall_clock: WallClock) -> None:
    """Saves take 30 s, --stop-grace is 5 s: the last-chance save begins and is cut off."""
    run, code = stepped_run(tmp_path, wall_clock, "+60s", 120.0, "--save-seconds", "30")
    assert code == EXIT_SAVE_MISSED, run.story()
    (missed,) = [e for e in run.events if e["event"] == "save_missed"]
    assert missed["clock_jump"]["jump_s"] > 100 and "wall clock jumped" in missed["reason"]
    assert missed["late"]["last_step_report_s_ago"] < 40  # the monotonic clock's, not the jump's
    (exit_line,) = [e for e in run.events if e["event"] == "supervisor_exit"]
    assert "wall clock jumped" in exit_line["reason"]
