"""The save state machine against a real trainer process (the real esiwrap.trainer library)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from esiwrap_harness import PLAIN_TRAINER, PYTHON

from esiwrap.core.policy import FINAL_SAVE_FACTOR, SAVE_SAFETY_FACTOR
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED


def trainer(ckpt: Path, *extra: str) -> list[str]:
    return [PYTHON, str(PLAIN_TRAINER), "--ckpt", str(ckpt), *extra]


def saved_step(ckpt: Path) -> int:
    return int(json.loads(ckpt.read_text())["step"])


def test_sigterm_turns_into_a_checkpoint(esiwrap, tmp_path: Path) -> None:
    """SIGTERM to esiwrap (systemd's stop): save first, then stop; exit 75."""
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+1h", "--", *trainer(ckpt))
    run.wait_event("trainer_attached")
    run.wait_stdout("start 0")
    run.signal(signal.SIGTERM)
    requested = run.wait_event("save_requested", 10)
    assert requested["reason"] == "sigterm"
    completed = run.wait_event("save_completed", 20)
    assert run.finish(30) == EXIT_CHECKPOINTED
    assert saved_step(ckpt) == completed["step"]


def test_sigterm_without_a_trainer_stops_at_once(esiwrap, tmp_path: Path) -> None:
    """Nothing can save: SIGTERM stops the child straight away with its own exit status."""
    run = esiwrap("--", *trainer(tmp_path / "c.json", "--no-install"))
    run.wait_stdout("start 0")
    run.signal(signal.SIGTERM)
    assert run.finish(30) == 128 + signal.SIGTERM
    assert "save_requested" not in run.names()


def test_manual_save_leaves_training_running(esiwrap, tmp_path: Path) -> None:
    """SIGUSR1 to esiwrap asks for a save by hand; training goes on afterwards."""
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--", *trainer(ckpt, "--steps", "40", "--step-seconds", "0.1"))
    run.wait_event("trainer_attached")
    run.signal(signal.SIGUSR1)
    assert run.wait_event("save_requested", 10)["reason"] == "manual"
    run.wait_event("save_completed", 20, requested=True)
    assert run.finish(60) == 0  # the child finished its 40 steps by itself
    assert "plain_trainer: done" in run.stdout.decode()


def test_insurance_then_final_save_with_measured_save_time(esiwrap, tmp_path: Path) -> None:
    """The measured save time replaces --save-duration for the final save's plan. The insurance
    save lands 30 s before the deadline, so a final save still fits when a busy node stalls for
    seconds. In loaded full-suite runs, one 0.2 s step took 5.4 s and became the step estimate;
    another time esiwrap's own loop woke 11 s late and added that to its margin. Both times no
    final save fitted after an insurance save 7-15 s out, and esiwrap rightly stopped on the
    insurance checkpoint (exit 75)."""
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+45s", "--redundant-time", "30", "--save-duration", "3",
                  "--final-margin", "2", "--", *trainer(ckpt, "--save-seconds", "0.4"))
    run.wait_event("save_completed", 30, kind="insurance")
    final_plan = run.wait_event("save_scheduled", 60, kind="final")
    assert round(0.4 * FINAL_SAVE_FACTOR, 3) <= final_plan["save_estimate_s"] < 3
    final = run.wait_event("save_completed", 30, kind="final")
    assert final["remaining_s"] > 0
    assert run.finish(30) == EXIT_CHECKPOINTED
    assert saved_step(ckpt) == final["step"]


def test_no_final_save_stops_after_the_insurance_save(esiwrap, tmp_path: Path) -> None:
    """--no-final-save: one save, then stop."""
    run = esiwrap("--deadline", "+8s", "--redundant-time", "4", "--save-duration", "1",
                  "--no-final-save", "--", *trainer(tmp_path / "c.json"))
    assert run.finish(40) == EXIT_CHECKPOINTED
    assert [e["kind"] for e in run.events if e["event"] == "save_completed"] == ["insurance"]


def test_failed_save_is_retried_at_the_next_boundary(esiwrap, tmp_path: Path) -> None:
    """A save that raises is reported as save_failed; the next boundary saves again."""
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+10s", "--redundant-time", "5", "--save-duration", "1",
                  "--no-final-save", "--", *trainer(ckpt, "--fail-saves", "1"))
    failed = run.wait_event("save_failed", 30)
    assert "disk full" in failed["error"]
    completed = run.wait_event("save_completed", 30)
    assert completed["step"] > failed["step"]
    assert run.finish(30) == EXIT_CHECKPOINTED


def test_deadline_too_close_saves_at_once(esiwrap, tmp_path: Path) -> None:
    """A deadline closer than step + save + reserve: logged loudly, save requested at once."""
    run = esiwrap("--deadline", "+20s", "--", *trainer(tmp_path / "c.json"))
    too_close = run.wait_event("deadline_too_close", 10)
    assert too_close["needed_s"] > too_close["remaining_s"]
    run.wait_event("save_completed", 30)
    assert run.finish(30) == EXIT_CHECKPOINTED


def test_deadline_in_the_past_still_saves_within_grace(esiwrap, tmp_path: Path) -> None:
    """A deadline already passed: a trainer that attaches within --stop-grace still saves."""
    past = str(int(time.time()) - 5)
    run = esiwrap("--deadline", past, "--stop-grace", "20", "--", *trainer(tmp_path / "c.json"))
    assert run.wait_event("deadline_too_close", 10)["remaining_s"] < 0
    run.wait_event("save_completed", 30)
    assert run.finish(30) == EXIT_CHECKPOINTED


def test_missed_save_exits_76(esiwrap, tmp_path: Path) -> None:
    """A save that cannot finish before the deadline: save_missed, stop, exit 76."""
    run = esiwrap("--deadline", "+6s", "--redundant-time", "1", "--save-duration", "1",
                  "--stop-grace", "2", "--", *trainer(tmp_path / "c.json", "--save-seconds", "30"))
    run.wait_event("save_started", 20)
    run.wait_event("save_missed", 20)
    assert run.finish(30) == EXIT_SAVE_MISSED
    assert not (tmp_path / "c.json").exists()


def test_after_save_continue_leaves_the_child_running(esiwrap, tmp_path: Path) -> None:
    """--after-save continue: after the last planned save the child trains on and exits itself."""
    run = esiwrap("--deadline", "+6s", "--redundant-time", "3", "--save-duration", "1",
                  "--no-final-save", "--after-save", "continue", "--",
                  *trainer(tmp_path / "c.json", "--steps", "60", "--step-seconds", "0.15"))
    run.wait_event("save_completed", 20)
    run.wait_event("training_continues", 10)
    assert run.finish(40) == 0
    assert "plain_trainer: done" in run.stdout.decode()


def test_waiting_for_a_checkpoint_past_the_deadline_costs_no_cpu(esiwrap, tmp_path: Path) -> None:
    """SIGTERM, then a 6 s save that runs past the deadline: esiwrap sleeps until the save is
    acknowledged (it used to spin on a zero timeout from the deadline on: a full core)."""
    import psutil

    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+5s", "--redundant-time", "0", "--save-duration", "0.5",
                  "--stop-grace", "30", "--", *trainer(ckpt, "--save-seconds", "6"))
    run.wait_event("trainer_attached")
    run.signal(signal.SIGTERM)
    run.wait_event("save_started", 10)
    me = psutil.Process(run.pid)
    before = me.cpu_times()
    completed = run.wait_event("save_completed", 20)
    after = me.cpu_times()
    assert completed["remaining_s"] < 0  # the save ended after the deadline had passed
    spent = (after.user - before.user) + (after.system - before.system)
    assert spent < 0.3, f"esiwrap used {spent:.2f}s of CPU while waiting ~6s"
    assert run.finish(30) == EXIT_CHECKPOINTED


def test_a_save_several_times_the_guess_still_lands_before_the_deadline(esiwrap, tmp_path: Path) -> None:
    """--save-duration 1 but the save takes 4 s: nothing is measured yet, so the insurance save is
    planned as 6 x the guess and still completes before the deadline (it used to miss: exit 76)."""
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+14s", "--redundant-time", "2", "--save-duration", "1",
                  "--no-final-save", "--", *trainer(ckpt, "--save-seconds", "4"))
    scheduled = run.wait_event("save_scheduled", 30, kind="insurance")
    assert scheduled["save_estimate_s"] == 6.0 and "no save measured yet" in scheduled["why"]
    completed = run.wait_event("save_completed", 30, kind="insurance")
    assert completed["duration_s"] >= 4.0 and completed["remaining_s"] > 0
    assert run.finish(30) == EXIT_CHECKPOINTED
    assert saved_step(ckpt) == completed["step"]


def test_a_second_run_plans_with_the_first_runs_state_file(esiwrap, tmp_path: Path) -> None:
    """Run 1 measures its saves into --state-file; run 2 plans its very first save with them."""
    state = tmp_path / "esiwrap-state.json"
    first = esiwrap("--deadline", "+10s", "--redundant-time", "3", "--save-duration", "1",
                    "--state-file", str(state), "--", *trainer(tmp_path / "a.json", "--save-seconds", "1.5"))
    assert first.wait_event("state_loaded", 30)["saves"] == 0  # the job's first run
    assert first.finish(40) == EXIT_CHECKPOINTED
    written = json.loads(state.read_text())
    measured = [e["duration_s"] for e in first.events if e["event"] == "save_completed"]
    assert written["format"] == "esiwrap-state/1"
    assert written["saves"] == pytest.approx(measured, abs=1e-3)
    assert len(written["steps"]) > 5

    second = esiwrap("--deadline", "+30s", "--redundant-time", "3", "--save-duration", "1",
                     "--state-file", str(state), "--", *trainer(tmp_path / "b.json"))
    loaded = second.wait_event("state_loaded", 30)
    assert loaded["saves"] == len(measured) and loaded["longest_save_s"] == max(written["saves"])
    plan = second.wait_event("save_scheduled", 30, kind="insurance")
    assert plan["save_estimate_s"] == round(max(written["saves"]) * SAVE_SAFETY_FACTOR, 3)
    assert "earlier run" in plan["why"]
    second.wait_event("trainer_attached", 30)
    second.signal(signal.SIGTERM)
    assert second.finish(40) == EXIT_CHECKPOINTED


def test_a_corrupt_state_file_is_ignored_with_a_warning(esiwrap, tmp_path: Path) -> None:
    state = tmp_path / "esiwrap-state.json"
    state.write_text("{not json")
    run = esiwrap("--deadline", "+1h", "--state-file", str(state), "--", *trainer(tmp_path / "c.json"))
    ignored = run.wait_event("state_ignored", 30)
    assert ignored["level"] == "warning" and "corrupt" in ignored["reason"]
    run.wait_event("trainer_attached", 30)
    run.signal(signal.SIGTERM)
    assert run.finish(40) == EXIT_CHECKPOINTED
    assert json.loads(state.read_text())["format"] == "esiwrap-state/1"  # replaced by a good one


def test_a_growing_save_is_met(esiwrap, tmp_path: Path) -> None:
    """The trainer saves on its own every 5 steps and each save takes 0.25 s longer: the last save
    is planned with the trend of the measured saves, above the longest one seen, and lands in time."""
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+16s", "--redundant-time", "1", "--save-duration", "0.5",
                  "--final-margin", "0.5", "--", *trainer(ckpt, "--step-seconds", "0.2",
                                                          "--own-save-every", "5", "--save-growth", "0.25"))
    assert run.finish(60) == EXIT_CHECKPOINTED
    completed = [e for e in run.events if e["event"] == "save_completed"]
    requested = [e for e in completed if e["requested"]]
    assert requested and all(e["remaining_s"] > 0 for e in requested)
    last_plan = [e for e in run.events if e["event"] == "save_requested" and e["reason"] == "deadline"][-1]
    seen_before = [e["duration_s"] for e in completed if e["timestamp"] < last_plan["timestamp"]]
    assert len(seen_before) >= 2
    factor = FINAL_SAVE_FACTOR if last_plan["kind"] == "final" else SAVE_SAFETY_FACTOR
    assert last_plan["save_estimate_s"] > max(seen_before) * factor  # the trend, not the maximum
    assert saved_step(ckpt) == completed[-1]["step"]
