"""policy.replan: the supervisor's decide-then-move sequencing, shared with the simulator."""

from __future__ import annotations

from esiwrap.policy import Observations, PolicyConfig, next_save, plan_save, replan

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
    """A decided final save stays final even when its moment has passed (asked for at once)."""
    config = PolicyConfig()
    obs = steps_of(30.0, 10, end=DEADLINE - 100.0)
    decided = plan_save(DEADLINE, obs, config, "final")
    obs.record_step(11, 90.0, at=DEADLINE - 10.0)  # a slow step: the moment moves earlier
    moved = replan(DEADLINE, obs, config, 1, decided, DEADLINE - 10.0)
    assert moved is not None and moved.kind == "final"
    assert moved == plan_save(DEADLINE, obs, config, "final")
    assert moved.signal_at < decided.signal_at
    assert next_save(DEADLINE, obs, config, 1, DEADLINE - 10.0) is None  # undecided, it would not fit
