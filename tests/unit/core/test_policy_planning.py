"""The planning rules beyond the formula: which save comes next and what it counts on.

`replan` (decide, then move), the final save's step, the conservative first save, the state
file's measurements, growing saves, the periodic cadence, calibration and re-insurance."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esiwrap.core.policy import (
    CALIBRATION_HORIZON_FACTOR,
    INSURANCE_WORTH_FACTOR,
    SAVE_SAFETY_FACTOR,
    SECONDS_PER_DAY,
    Observations,
    PolicyConfig,
    Prior,
    final_step_estimate_s,
    next_save,
    periodic_interval_s,
    plan_save,
    replan,
    save_estimate_s,
    step_estimate_s,
)

DEADLINE = 10_000.0
NO_CADENCE = PolicyConfig(interruption_rate_per_day=0.0)


def steps_of(seconds: float, count: int, end: float, prior: Prior | None = None) -> Observations:
    obs = Observations(100, prior)
    obs.trainer_started(end - seconds * count)
    for step in range(1, count + 1):
        obs.record_step(step, seconds, end - seconds * (count - step))
    return obs


def test_replan_decides_with_next_save_when_nothing_is_decided() -> None:
    """No plan yet: the same answer as next_save (insurance first, then final, then none)."""
    config = NO_CADENCE
    obs = steps_of(30.0, 10, end=DEADLINE - 300.0)
    now = DEADLINE - 300.0
    assert replan(DEADLINE, obs, config, 0, None, now) == next_save(DEADLINE, obs, config, 0, now)
    obs.record_requested_save(30.0, at=now)
    final = replan(DEADLINE, obs, config, 1, None, now)
    assert final is not None and final.kind == "final"
    assert replan(DEADLINE, obs, config, 1, None, DEADLINE - 20.0) is None


def test_replan_keeps_a_decided_final_and_moves_its_moment() -> None:
    """A decided final save stays final and follows the deadline, even once its moment has passed
    (the supervisor then asks at once), where deciding afresh would find no save."""
    config = NO_CADENCE
    obs = steps_of(30.0, 10, end=DEADLINE - 100.0)
    obs.record_requested_save(10.0, at=DEADLINE - 100.0)
    decided = plan_save(DEADLINE, obs, config, "final")
    earlier = DEADLINE - 60.0
    moved = replan(earlier, obs, config, 1, decided, DEADLINE - 100.0)
    assert moved is not None and moved.kind == "final"
    assert moved == plan_save(earlier, obs, config, "final")
    assert moved.signal_at < DEADLINE - 100.0 <= decided.signal_at
    assert next_save(earlier, obs, config, 1, DEADLINE - 100.0) is None


def test_the_first_save_is_planned_with_the_conservative_guess() -> None:
    """Nothing measured: the insurance save counts on --save-duration x --unmeasured-factor, and
    says so; once a save is measured it counts on that."""
    config = PolicyConfig(save_duration_s=60.0, unmeasured_factor=6.0, redundant_s=120.0,
                          interruption_rate_per_day=0.0)
    obs = steps_of(30.0, 10, end=DEADLINE - 2000.0)
    plan = next_save(DEADLINE, obs, config, 0, DEADLINE - 2000.0)
    assert plan is not None and plan.kind == "insurance"
    assert plan.save_estimate_s == 360.0
    assert plan.nominal_at == DEADLINE - (30.0 + 360.0 + 120.0)
    assert "no save measured yet" in plan.why
    obs.record_requested_save(40.0, at=DEADLINE - 1990.0)
    measured = plan_save(DEADLINE, obs, config, "insurance")
    assert measured.save_estimate_s == 40.0 * SAVE_SAFETY_FACTOR
    assert "save measured" in measured.why


def test_a_state_file_counts_as_measured() -> None:
    """Saves measured by an earlier run (the state file) replace the guess from the first plan on,
    and its step intervals fill the window."""
    prior = Prior(steps=[2.0] * 5, saves=[100.0, 110.0])
    obs = Observations(100, prior)
    assert step_estimate_s(obs, PolicyConfig()) == 2.0
    plan = plan_save(DEADLINE, obs, PolicyConfig(), "insurance")
    assert plan.save_estimate_s == 110.0 * SAVE_SAFETY_FACTOR
    assert "earlier run" in plan.why


def test_growing_saves_are_extrapolated_to_the_planned_moment() -> None:
    """Saves of 100, 150, 200 s at t = 1000, 2000, 3000: a save at t = 5000 is planned as 300 s
    (x the factor), not as the longest seen."""
    obs = Observations(100)
    for at, seconds in ((1000.0, 100.0), (2000.0, 150.0), (3000.0, 200.0)):
        obs.record_save(seconds, at)
    expected = 300.0 * SAVE_SAFETY_FACTOR
    assert save_estimate_s(obs, PolicyConfig(), "insurance", at=5000.0) == pytest.approx(expected)
    shrinking = Observations(100)
    for at, seconds in ((1000.0, 200.0), (2000.0, 150.0)):
        shrinking.record_save(seconds, at)
    assert save_estimate_s(shrinking, PolicyConfig(), "insurance", at=5000.0) == 200.0 * SAVE_SAFETY_FACTOR


def test_final_step_is_the_median_when_the_last_checkpoint_is_recent() -> None:
    """Steps of 30 s with one 300 s warm-up and one 120 s validation: the insurance plans with the
    slowest; a final save with the median while a late landing loses little."""
    config = PolicyConfig()
    obs = Observations(100)
    obs.trainer_started(0.0)
    at = 0.0
    for step, seconds in enumerate([300.0, *[30.0] * 8, 120.0], start=1):
        at += seconds
        obs.record_step(step, seconds, at)
    assert step_estimate_s(obs, config) == 300.0
    assert final_step_estimate_s(obs, config, room_s=60.0) == 30.0


def test_final_step_is_a_high_quantile_when_the_last_checkpoint_is_far_back() -> None:
    """With hours since the last checkpoint, landing in time matters more than a step's time."""
    obs = steps_of(30.0, 9, end=1000.0)
    obs.record_step(10, 100.0, at=1100.0)
    assert final_step_estimate_s(obs, PolicyConfig(), room_s=50.0) == 30.0
    assert final_step_estimate_s(obs, PolicyConfig(), room_s=5000.0) == 100.0
    assert final_step_estimate_s(obs, PolicyConfig(step_quantile=0.5), room_s=5000.0) == 30.0
    assert final_step_estimate_s(Observations(100), PolicyConfig(), room_s=5000.0) is None


def test_calibration_when_nothing_is_measured_and_the_deadline_is_hours_away() -> None:
    config = PolicyConfig(save_duration_s=60.0, unmeasured_factor=6.0)
    far = CALIBRATION_HORIZON_FACTOR * 360.0 + 100.0
    obs = steps_of(30.0, 3, end=0.0)
    plan = next_save(far, obs, config, 0, 0.0)
    assert plan is not None and plan.kind == "calibration" and plan.signal_at == 0.0
    obs.record_requested_save(50.0, at=60.0)
    after = next_save(far, obs, config, 0, 60.0)
    assert after is not None and after.kind != "calibration"


def test_periodic_saves_follow_young_daly_and_give_way_to_a_near_insurance() -> None:
    """One interruption a day and 60 s saves: a checkpoint every sqrt(2 x 60 / rate) s; none when
    the insurance save comes within half an interval anyway."""
    config = PolicyConfig(save_duration_s=60.0, interruption_rate_per_day=1.0)
    interval = periodic_interval_s(Observations(100), config)
    assert interval == pytest.approx(math.sqrt(2 * 60.0 * SECONDS_PER_DAY))
    obs = steps_of(30.0, 3, end=0.0)
    obs.record_requested_save(60.0, at=90.0)  # measured: 60 s, checkpoint at the start of it
    deadline = 5 * interval
    plan = next_save(deadline, obs, config, 0, 100.0)
    assert plan is not None and plan.kind == "periodic"
    assert plan.nominal_at + plan.step_estimate_s == pytest.approx(30.0 + interval)
    assert "Young/Daly" in plan.why
    near = next_save(30.0 + interval * 1.2, obs, config, 0, 100.0)
    assert near is not None and near.kind == "insurance"
    assert periodic_interval_s(obs, PolicyConfig(interruption_rate_per_day=0.0)) is None


def test_a_recent_checkpoint_insures_and_a_far_one_is_insured_again() -> None:
    """The trainer saved on its own a minute ago: no insurance save, the final save is next. A
    cheap (asynchronous) save long before the insurance moment: insure again, it pays for itself."""
    config = NO_CADENCE
    obs = steps_of(10.0, 30, end=DEADLINE - 300.0)
    obs.record_save(20.0, at=DEADLINE - 300.0)  # the trainer's own save
    plan = next_save(DEADLINE, obs, config, 0, DEADLINE - 300.0)
    assert plan is not None and plan.kind == "final"
    cheap = steps_of(10.0, 30, end=DEADLINE - 3000.0)
    cheap.record_blocking(2.0, at=DEADLINE - 2998.0)
    cheap.record_save(60.0, at=DEADLINE - 2940.0, began_at=DEADLINE - 3000.0)
    again = next_save(DEADLINE, cheap, config, 1, DEADLINE - 2900.0)
    assert again is not None and again.kind == "insurance"
    costly = steps_of(10.0, 30, end=DEADLINE - 500.0)
    costly.record_requested_save(60.0, at=DEADLINE - 440.0)
    assert INSURANCE_WORTH_FACTOR * 60.0 > 440.0
    then = next_save(DEADLINE, costly, config, 1, DEADLINE - 430.0)
    assert then is not None and then.kind == "final"


@given(
    saves=st.lists(st.tuples(st.floats(0, 1e5), st.floats(0.01, 1e4)), min_size=1, max_size=8),
    at=st.floats(0, 2e5),
)
def test_the_insurance_never_counts_on_less_than_any_save_seen(saves: list[tuple[float, float]],
                                                               at: float) -> None:
    """Growth-aware, never shrinking: at least the longest measured save, times the factor."""
    obs = Observations(100)
    for end, seconds in saves:
        obs.record_save(seconds, end)
    longest = max(seconds for _, seconds in saves)
    assert save_estimate_s(obs, PolicyConfig(), "insurance", at=at) >= longest * SAVE_SAFETY_FACTOR - 1e-9

