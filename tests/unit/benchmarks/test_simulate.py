"""The policy simulator (benchmarks/simulate.py) itself: its oracle, its verl rule, its arithmetic."""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import simulate
from runners import run_esiwrap, run_oracle, run_verl, verl_wants_save
from traces import FAMILIES, Params, Scenario, generate

from esiwrap.core.policy import PolicyConfig
from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.times import iso_epoch

STEP_S, DEADLINE_S = 7.0, 1000.0  # 1000 is not a multiple of 7: no boundary ties the deadline


def constant_scenario(step_s: float, save_s: float, deadline_s: float, reclaim_at: float | None = None,
                      ) -> Scenario:
    n = int(deadline_s // step_s) + 2
    return Scenario("test", [step_s] * n, [save_s] * n, deadline_s,
                    deadline_s if reclaim_at is None else reclaim_at)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_policy_beats_the_oracle(family: str) -> None:
    """On the same traces, no policy keeps more progress than the oracle, nor saves when it cannot."""
    runners = {spec: simulate.make_runner(spec) for spec in simulate.DEFAULT_POLICIES}
    for run in range(40):
        scenario = generate(family, run, seed=7, params=Params())
        best = run_oracle(scenario)
        for spec, runner in runners.items():
            outcome = runner(scenario)
            assert outcome.lost_s >= best.lost_s - 1e-9, (spec, run)
            assert not best.missed or outcome.missed, (spec, run)


def test_instant_saves_with_constant_steps_give_the_analytic_answer() -> None:
    """Saves of 0 s, steps of 7 s, deadline 1000 s: the last boundary before it is 994 s.

    The oracle and verl's rule both save there (6 s lost); esiwrap with no reserve at all does
    too; with its defaults the final save must also clear the 5 s final margin: 994 s still does.
    """
    scenario = constant_scenario(STEP_S, 0.0, DEADLINE_S)
    last = STEP_S * (DEADLINE_S // STEP_S)
    assert run_oracle(scenario).lost_s == pytest.approx(DEADLINE_S - last)
    assert run_verl(scenario).lost_s == pytest.approx(DEADLINE_S - last)
    bare = PolicyConfig(redundant_s=0.0, save_duration_s=0.0, final_margin_s=0.0)
    assert run_esiwrap(scenario, bare).lost_s == pytest.approx(DEADLINE_S - last)
    defaults = run_esiwrap(scenario, PolicyConfig())
    assert defaults.lost_s == pytest.approx(DEADLINE_S - STEP_S * ((DEADLINE_S - 5.0) // STEP_S))
    assert defaults.saves >= 2  # the insurance save, then the final one


def test_verl_documented_example_saves() -> None:
    """verl's example: 200 s left, 80 s step, 60 s save, 120 s redundant -> save (200 <= 260)."""
    assert verl_wants_save(remaining_s=200.0, max_steps_duration_s=80.0, redundant_s=120.0, save_s=60.0)
    assert not verl_wants_save(remaining_s=280.0, max_steps_duration_s=80.0, redundant_s=120.0)
    assert not verl_wants_save(remaining_s=200.0, max_steps_duration_s=0.0, redundant_s=120.0)


def test_verl_rule_in_a_run_saves_at_the_first_boundary_inside_its_window() -> None:
    """80 s steps, deadline at 440 s: 280 s left at step 2 (no), 200 s left at step 3 (save)."""
    scenario = constant_scenario(80.0, 60.0, 440.0, reclaim_at=310.0)
    outcome = run_verl(scenario, redundant_s=120.0)
    assert (outcome.saved_step, outcome.saves) == (3, 1)
    assert outcome.lost_s == pytest.approx(310.0 - 240.0)


def test_verl_rule_never_saves_before_the_first_step_ends() -> None:
    """max_steps_duration is 0 until the first step is timed: a deadline inside it is missed."""
    scenario = constant_scenario(80.0, 10.0, 70.0)
    assert run_verl(scenario, redundant_s=120.0).missed
    assert run_oracle(scenario).missed  # nothing fits at all: the oracle misses too


def test_esiwrap_insurance_then_final_save_with_constant_steps() -> None:
    """60 s steps and saves, deadline 3630 s, defaults.

    Insurance, nothing measured yet: signal at 3630 - (60 + 6 x 60 + 120) = 3090 s, seen at the
    3120 s boundary (step 52), saved by 3180 s. A second insurance save would protect less than
    ten times what it costs. Final: the save now counts 63 s, so signal at 3630 - (60 + 63 + 5) =
    3502 s: seen at 3540 s (step 58), saved by 3600 s. Then nothing fits: stop.
    """
    scenario = constant_scenario(60.0, 60.0, 3630.0)
    outcome = run_esiwrap(scenario, PolicyConfig())
    assert (outcome.saved_step, outcome.saves) == (58, 2)
    assert outcome.lost_s == pytest.approx(3630.0 - 58 * 60.0)
    assert outcome.saving_s == pytest.approx(120.0)


def test_command_line_prints_tables_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A small run: one table per family on stdout, and every figure in the JSON file."""
    out = tmp_path / "sim.json"
    code = simulate.main(["--runs", "5", "--families", "constant,moving", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "#### constant" in text and "#### moving" in text and "| `oracle` |" in text
    document = json.loads(out.read_text())
    results = {(r["family"], r["policy"]): r for r in document["results"]}
    assert len(results) == 2 * len(simulate.DEFAULT_POLICIES)
    assert results[("constant", "oracle")]["missed"] == 0
    assert results[("constant", "esiwrap")]["runs"] == 5


def test_unknown_policy_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A policy name that is not oracle/verl/esiwrap stops before any work: one line, exit 2."""
    with pytest.raises(SystemExit) as exit_info:
        simulate.main(["--policy", "random --p 0.5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown" in err and "esiwrap [RUN OPTIONS]" in err


def test_the_simulated_supervisor_saves_where_the_real_one_did(esiwrap) -> None:
    """Fed the step and save times a real run measured, the simulator's model of the supervisor
    saves the same number of times at the same last step as the real esiwrap (within one step:
    on a loaded machine the real timer can fire late, and a step report arrive late; steps of
    0.6 s keep that small next to a step)."""
    child = Path(__file__).resolve().parents[2] / "lib" / "children" / "sleep_trainer.py"
    deadline = time.time() + 16.0
    run = esiwrap("--deadline", f"{deadline:.3f}", "--redundant-time", "2", "--save-duration", "0.4",
                  "--final-margin", "0.4", "--log-level", "debug", "--", sys.executable, str(child),
                  "0.6", "0.3")
    code = run.finish(timeout=60)
    story = [(e["timestamp"][11:23], e["event"], e.get("step"), e.get("kind"), e.get("reason"))
             for e in run.events if e["event"] != "step_observed"]
    assert code == EXIT_CHECKPOINTED, story  # a failure under load says what the real run did
    attached = iso_epoch(run.first("trainer_attached")["timestamp"])
    steps = [e["duration_s"] for e in run.events if e["event"] == "step_observed"]
    completed = [e for e in run.events if e["event"] == "save_completed"]
    assert [e["kind"] for e in completed][:1] == ["insurance"]
    horizon = deadline - attached
    steps += [0.6] * 20  # the steps the real run did not live to make
    scenario = Scenario("real", steps, [max(e["duration_s"] for e in completed)] * len(steps),
                        horizon, horizon)
    outcome = run_esiwrap(scenario, PolicyConfig(redundant_s=2.0, save_duration_s=0.4, final_margin_s=0.4))
    assert outcome.saved_step is not None
    assert abs(outcome.saved_step - completed[-1]["step"]) <= 1, (outcome, completed)
    assert abs(outcome.saves - len(completed)) <= 1


def test_compare_prints_before_and_after_from_two_json_files(tmp_path: Path, capsys) -> None:
    """--compare simulates nothing: it reads two --json documents and prints esiwrap's figures
    side by side, with the oracle's loss of the second; a file that is not JSON is one line, exit 2."""
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    assert simulate.main(["--runs", "3", "--families", "constant", "--horizons", "1h", "--policy", "esiwrap",
                          "--policy", "oracle", "--early-prob", "0.5", "--json", str(before)]) == 0
    assert simulate.main(["--runs", "3", "--families", "constant", "--horizons", "1h", "--policy", "esiwrap",
                          "--policy", "oracle", "--json", str(after)]) == 0
    capsys.readouterr()
    assert simulate.main(["--compare", str(before), str(after)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| constant")]
    docs = [json.loads(p.read_text()) for p in (before, after)]
    ours = [next(r for r in d["results"] if r["policy"] == "esiwrap") for d in docs]
    lost = [r["lost_mean_with_misses_s"] for r in ours]
    assert rows == [rows[0]] and f"{lost[0]:.0f} → {lost[1]:.0f}" in rows[0]
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(SystemExit) as exited:
        simulate.main(["--compare", str(tmp_path / "bad.json"), str(after)])
    assert exited.value.code == 2


def test_jobs_the_guard_stops_short_slots_at_run_four_and_never_a_job_that_progresses() -> None:
    """`--job-runs`: a job of slots shorter than a step plus a save is stopped at run N + 1 = 4
    (then the count starts again); a calm spot job whose runs each save is never stopped, and it
    learns: its third run saves less often than its first (the default 8 a day)."""
    from jobs import play_job

    runners = {"esiwrap": simulate.make_runner("esiwrap"), "reference": simulate.make_runner("reference")}
    short = play_job("short-slots", 0, 5, 1, Params(), 3600.0, runners)
    assert [r.stopped for r in short] == [False, False, False, True, False]
    calm = [play_job("calm-spot", job, 3, 1, Params(), 8 * 3600.0, runners) for job in range(3)]
    assert not any(r.stopped for job in calm for r in job)
    first = sum(job[0].lost["esiwrap"] for job in calm)
    third = sum(job[2].lost["esiwrap"] for job in calm)
    assert third < 0.5 * first


def test_jobs_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate.main(["--job-runs", "4", "--runs", "2", "--job-families", "short-slots",
                          "--horizons", "1h"]) == 0
    out = capsys.readouterr().out
    assert "#### short-slots, 1 h, 2 jobs" in out and "| 4 | – | – | – | 0 | 2 |" in out
    with pytest.raises(SystemExit):
        simulate.main(["--job-runs", "3", "--job-families", "nope"])


def test_a_jobs_runs_share_the_state_the_core_decides() -> None:
    """The job simulator re-implements nothing: each run starts from the state the run before it
    left (`Outcome.state`, the core's `KeepState`), resumes from its durable checkpoint's step, and
    the history is what the core recorded: the runs that met their deadline end `announced`, with
    their durable steps, those a surprise ended are closed by the next run as `interrupted`."""
    from jobs import play_job

    from esiwrap.core.config import ControllerConfig

    kept: list[Any] = []

    def esiwrap(scenario: Any) -> Any:
        outcome = run_esiwrap(scenario, ControllerConfig())
        kept.append((scenario, outcome))
        return outcome

    played = play_job("stormy-spot", 0, 4, 1, Params(), 3600.0, {"esiwrap": esiwrap})
    assert len(kept) == 4 and not any(r.stopped for r in played)
    for (_, before), (after, _) in itertools.pairwise(kept):
        assert after.job is not None and after.job is before.state
        resumed = after.job.checkpoint.step if after.job.checkpoint is not None else 0
        assert after.start_step == resumed
    last = kept[-1][1].state
    assert last is not None and [r.run_id for r in last.runs] == ["0-1", "0-2", "0-3", "0-4"]
    for (scenario, outcome), record in zip(kept[:-1], last.runs[:-1], strict=True):
        assert record.ending == ("interrupted" if scenario.surprised else "announced")
        if outcome.saved_step is not None:
            assert record.end_step == outcome.saved_step


def test_nothing_of_a_job_run_happens_after_its_capacity_went() -> None:
    """A run reclaimed early (before its deadline, no surprise) is driven up to its reclamation and
    no further: its record was last refreshed by then and knows the deadline, so the next run
    closes it as the deadline's reclamation (`announced`), not as an interruption without notice."""
    import random
    from dataclasses import replace

    from traces import constant

    from esiwrap.core.config import ControllerConfig

    start = 1_800_000_000.0
    base = constant(random.Random(7), Params(horizon_s=3600.0, early_prob=1.0, early_max_s=120.0))
    assert base.reclaim_at < base.deadline
    scenario = replace(base, capacity="spot", run_id="0-1", prior_runs_at=start)
    outcome = run_esiwrap(scenario, ControllerConfig())
    assert outcome.state is not None
    (record,) = outcome.state.runs
    assert record.ending == "running"  # it vanished: no stop, no exit came
    assert record.seen_at <= start + scenario.reclaim_at
    assert record.deadline_at == pytest.approx(start + scenario.deadline)
    (closed,) = outcome.state.starting(start + scenario.reclaim_at + 300.0, host="sim").runs
    assert closed.ending == "announced"
