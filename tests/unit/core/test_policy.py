"""The planning rule: pure functions of what was observed; time is always an argument."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esiwrap.core.policy import (
    FINAL_SAVE_FACTOR,
    SAVE_SAFETY_FACTOR,
    Observations,
    PolicyConfig,
    latest_signal_at,
    moved_enough,
    needed_s,
    next_save,
    plan_save,
    quantile,
    renewal_reopens_insurance,
    save_estimate_s,
    step_estimate_s,
)

DEADLINE = 10_000.0


def observed(*intervals: float, start: float = 0.0, window: int = 100) -> Observations:
    """Observations after steps of the given lengths, the last boundary at the end."""
    obs = Observations(window)
    obs.trainer_started(start)
    at = start
    for step, interval in enumerate(intervals, 1):
        at += interval
        obs.record_step(step, interval, at)
    return obs


def test_quantile_is_nearest_rank() -> None:
    """Nearest rank never interpolates below an observed value; q=1 is the maximum."""
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 1.0) == 100.0
    assert quantile([3.0, 1.0, 2.0], 0.99) == 3.0  # few samples: the high quantile is the max
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)


def test_step_estimate_uses_the_sliding_window() -> None:
    """Only the last --step-window intervals count: an early slow step ages out."""
    config = PolicyConfig(step_window=5, step_quantile=1.0)
    obs = observed(50.0, 1.0, 1.0, 1.0, 1.0, window=5)
    assert step_estimate_s(obs, config) == 50.0
    obs.record_step(6, 2.0, 100.0)
    assert step_estimate_s(obs, config) == 2.0


def test_step_estimate_is_unknown_before_the_first_interval() -> None:
    """No interval yet: no estimate (the running step's age is used instead, see below)."""
    assert step_estimate_s(Observations(100), PolicyConfig()) is None


def test_save_estimate_starts_from_a_conservative_guess_then_follows_measured_saves() -> None:
    """Before any save is measured, the insurance save assumes --save-duration x
    --unmeasured-factor; then the longest measured save times the factor."""
    config = PolicyConfig(save_duration_s=60.0, unmeasured_factor=6.0)
    obs = Observations(100)
    assert save_estimate_s(obs, config) == 360.0
    obs.record_requested_save(200.0, at=1000.0)
    assert save_estimate_s(obs, config) == 200.0 * SAVE_SAFETY_FACTOR
    obs.record_requested_save(10.0, at=2000.0)  # a faster save does not lower the estimate
    assert save_estimate_s(obs, config) == 200.0 * SAVE_SAFETY_FACTOR
    obs.record_requested_save(400.0, at=3000.0)
    assert save_estimate_s(obs, config) == 400.0 * SAVE_SAFETY_FACTOR


def test_measured_save_never_falls_below_what_was_observed() -> None:
    """A measured 5 s save replaces the guess, but never drops below 5 s."""
    obs = Observations(100)
    obs.record_requested_save(5.0, at=10.0)
    assert 5.0 <= save_estimate_s(obs, PolicyConfig(save_duration_s=60.0)) < 60.0


def test_requested_save_is_taken_out_of_the_interval_that_holds_it() -> None:
    """The save esiwrap asked for is counted in the save estimate, not again as step time."""
    obs = observed(2.0, 2.0)
    obs.record_requested_save(30.0, at=100.0)
    assert obs.step_started_at == 100.0  # training resumes when the save ends
    interval = obs.record_step(3, 32.5, at=102.5)
    assert interval == pytest.approx(2.5)
    assert obs.record_step(4, 2.0, at=104.5) == 2.0  # only the one interval is corrected


def test_signal_at_without_a_running_step() -> None:
    """No trainer yet: signal one step estimate before the cutoff."""
    assert latest_signal_at(cutoff=1000.0, step_s=10.0, step_started_at=None) == 990.0
    assert latest_signal_at(cutoff=1000.0, step_s=None, step_started_at=None) == 1000.0


def test_signal_at_with_a_normal_running_step() -> None:
    """The running step is younger than the estimate: cutoff minus one step."""
    assert latest_signal_at(cutoff=1000.0, step_s=10.0, step_started_at=985.0) == 990.0


def test_signal_at_when_the_running_step_is_already_long() -> None:
    """A step that has run longer than the estimate is a lower bound of its own length."""
    signal_at = latest_signal_at(cutoff=1000.0, step_s=10.0, step_started_at=900.0)
    assert signal_at == 950.0  # at 950 it has run 50 s; 50 more would end at the cutoff
    assert signal_at < 990.0


def test_before_the_first_interval_the_running_step_is_a_lower_bound() -> None:
    """Never assume a step takes 0 s (verl's bug): the first step's age counts."""
    signal_at = latest_signal_at(cutoff=1000.0, step_s=None, step_started_at=400.0)
    assert signal_at == 700.0
    assert signal_at < 1000.0


@given(
    cutoff=st.floats(0, 1e6),
    step=st.one_of(st.none(), st.floats(0, 1e4)),
    started_before=st.floats(0, 1e5),
)
def test_signal_at_is_the_latest_safe_moment(cutoff: float, step: float | None,
                                             started_before: float) -> None:
    """At signal_at the estimated next boundary is exactly at the cutoff, never after it."""
    started = cutoff - started_before
    t = latest_signal_at(cutoff, step, started)
    estimate = max(step or 0.0, t - started)
    assert t + estimate == pytest.approx(cutoff, abs=1e-6)


def test_plan_save_formula() -> None:
    """signal_at = deadline - (step_estimate + save_estimate + reserve) for a young step."""
    config = PolicyConfig(redundant_s=120.0, save_duration_s=60.0, unmeasured_factor=1.0, final_margin_s=10.0)
    obs = observed(*([30.0] * 10), start=DEADLINE - 520.0)  # last boundary 220 s before
    insurance = plan_save(DEADLINE, obs, config, "insurance")
    assert insurance.signal_at == DEADLINE - (30.0 + 60.0 + 120.0)
    assert needed_s(insurance) == 210.0
    obs.record_requested_save(20.0, at=DEADLINE - 100.0)
    obs.record_step(11, 30.0, at=DEADLINE - 70.0)
    final = plan_save(DEADLINE, obs, config, "final")
    assert final.signal_at == DEADLINE - (30.0 + 20.0 * FINAL_SAVE_FACTOR + 10.0)


def test_next_save_insurance_is_always_planned() -> None:
    """Even when its moment has passed, the insurance save is planned (to be asked at once)."""
    config = PolicyConfig()
    obs = observed(30.0)
    plan = next_save(DEADLINE, obs, config, saves_done=0, now=DEADLINE - 1.0)
    assert plan is not None and plan.kind == "insurance"
    assert plan.signal_at < DEADLINE - 1.0


def test_next_save_final_while_it_fits_then_none() -> None:
    """After the insurance save: a final save while its moment is ahead; none once past."""
    config = PolicyConfig(redundant_s=120.0, save_duration_s=20.0, final_margin_s=10.0)
    obs = observed(*([5.0] * 10), start=DEADLINE - 400.0)
    obs.record_requested_save(4.0, at=DEADLINE - 140.0)
    obs.record_step(11, 9.0, at=DEADLINE - 22.0)  # training went on after the save
    final = next_save(DEADLINE, obs, config, saves_done=1, now=DEADLINE - 22.0)
    assert final is not None and final.kind == "final"
    assert final.signal_at == pytest.approx(DEADLINE - (5.0 + 4.0 * FINAL_SAVE_FACTOR + 10.0))
    assert step_estimate_s(obs, config) == 5.0  # the 4 s save was taken out of the 9 s interval
    obs.record_requested_save(4.0, at=DEADLINE - 12.0)
    assert next_save(DEADLINE, obs, config, saves_done=2, now=DEADLINE - 12.0) is None


def test_no_final_save_when_disabled() -> None:
    """--no-final-save: one insurance save and nothing after it."""
    config = PolicyConfig(final_save=False)
    obs = observed(5.0, start=DEADLINE - 100.0)
    obs.record_requested_save(2.0, at=DEADLINE - 90.0)
    assert next_save(DEADLINE, obs, config, saves_done=1, now=DEADLINE - 90.0) is None


def test_moved_enough() -> None:
    """save_scheduled is re-logged only for moves of more than a few seconds."""
    assert moved_enough(None, 5.0)
    assert not moved_enough(100.0, 103.0)
    assert moved_enough(100.0, 110.0)


def test_nominal_plan_ignores_a_long_running_step_but_the_timer_does_not() -> None:
    """The logged plan is deadline - (step + save + reserve); the timer moves forward when the
    running step is already longer than the estimate."""
    config = PolicyConfig(redundant_s=20.0, save_duration_s=2.0, unmeasured_factor=1.0)
    obs = observed(*([1.0] * 10), start=DEADLINE - 100.0)  # last boundary 90 s before
    plan = plan_save(DEADLINE, obs, config, "insurance")
    assert plan.nominal_at == DEADLINE - 23.0
    assert plan.signal_at == pytest.approx((DEADLINE - 22.0 + DEADLINE - 90.0) / 2)
    assert plan.signal_at < plan.nominal_at


def test_a_renewal_reopens_insurance_only_when_it_fits() -> None:
    """After a save, a later deadline with room for a full insurance save starts the cycle again."""
    config = PolicyConfig(redundant_s=120.0, save_duration_s=60.0)
    obs = observed(*([10.0] * 5), start=DEADLINE - 50.0)
    assert renewal_reopens_insurance(DEADLINE + 3600.0, obs, config, now=DEADLINE)
    assert not renewal_reopens_insurance(DEADLINE + 100.0, obs, config, now=DEADLINE)
