"""Planning added with the simulator: `replan` (the supervisor's decide-then-move sequencing, now
shared with benchmarks/simulate.py) and the final save's step estimate."""

from __future__ import annotations

from esiwrap.policy import (
    FINAL_STEP_QUANTILE,
    Observations,
    PolicyConfig,
    final_step_estimate_s,
    next_save,
    plan_save,
    replan,
    step_estimate_s,
)

DEADLINE = 10_000.0


def steps_of(seconds: float, count: int, end: float) -> Observations:
    obs = Observations(100)
    obs.trainer_started(end - seconds * count)
    for step in range(1, count + 1):
        obs.record_step(step, seconds, end - seconds * (count - step))
    return obs


def test_replan_decides_with_next_save_when_nothing_is_decided() -> None:
    """No plan yet: the same answer as next_save (insurance first, then final, then none)."""
    config = PolicyConfig()
    obs = steps_of(30.0, 10, end=DEADLINE - 1000.0)
    now = DEADLINE - 1000.0
    assert replan(DEADLINE, obs, config, 0, None, now) == next_save(DEADLINE, obs, config, 0, now)
    final = replan(DEADLINE, obs, config, 1, None, now)
    assert final is not None and final.kind == "final"
    assert replan(DEADLINE, obs, config, 1, None, DEADLINE - 20.0) is None


def test_replan_keeps_a_decided_kind_and_moves_its_moment() -> None:
    """A decided final save stays final and follows the deadline, even once its moment has passed
    (the supervisor then asks at once), where deciding afresh would find no save."""
    config = PolicyConfig()
    obs = steps_of(30.0, 10, end=DEADLINE - 100.0)
    decided = plan_save(DEADLINE, obs, config, "final")
    earlier = DEADLINE - 50.0
    moved = replan(earlier, obs, config, 1, decided, DEADLINE - 100.0)
    assert moved is not None and moved.kind == "final"
    assert moved == plan_save(earlier, obs, config, "final")
    assert moved.signal_at < DEADLINE - 100.0 <= decided.signal_at
    assert next_save(earlier, obs, config, 1, DEADLINE - 100.0) is None


def test_final_saves_aim_at_the_typical_step_the_insurance_at_the_slowest() -> None:
    """A 10x warm-up step and a validation step: insurance plans with them, a final save with the median."""
    config = PolicyConfig(redundant_s=120.0, save_duration_s=60.0, final_margin_s=10.0)
    obs = Observations(100)
    obs.trainer_started(0.0)
    at = 0.0
    for step, seconds in enumerate([300.0, *[30.0] * 8, 120.0], start=1):
        at += seconds
        obs.record_step(step, seconds, at)
    assert step_estimate_s(obs, config) == 300.0
    assert final_step_estimate_s(obs, config) == 30.0
    assert FINAL_STEP_QUANTILE == 0.5
    # deadlines close enough that the step running since `at` is not yet longer than the estimate
    assert plan_save(at + 500.0, obs, config, "insurance").signal_at == at + 500.0 - (300.0 + 60.0 + 120.0)
    assert plan_save(at + 120.0, obs, config, "final").signal_at == at + 120.0 - (30.0 + 60.0 + 10.0)


def test_final_step_quantile_never_exceeds_the_configured_one() -> None:
    """--step-quantile below the median lowers the final estimate too; none before any interval."""
    obs = steps_of(10.0, 5, end=100.0)
    obs.record_step(6, 50.0, at=150.0)
    assert final_step_estimate_s(obs, PolicyConfig(step_quantile=0.1)) == 10.0
    assert final_step_estimate_s(Observations(100), PolicyConfig()) is None
