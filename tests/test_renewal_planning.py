"""What a renewal (a later deadline) does to the save plan, with the supervisor's clock fixed.

A requested save stays requested; after a save, a renewal that leaves room for a full insurance
save plans one afresh (instead of a single final save hours later); a small move does not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from esiwrap.deadline import Deadline
from esiwrap.log import capture_logs
from esiwrap.policy import PolicyConfig, plan_save
from esiwrap.supervisor import SaveRequest, Supervisor, SupervisorConfig

NOW = 1_800_000_000.0


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    config = SupervisorConfig(argv=["true"], policy=PolicyConfig(redundant_s=120, save_duration_s=60))
    sup = Supervisor(config, [], {}, clock=lambda: NOW)
    sup.obs.record_step(1, 10.0, NOW - 1)
    yield sup
    sup._selector.close()
    for sock in (sup._signal_r, sup._signal_w, sup._wake_r, sup._wake_w):
        sock.close()


def after_insurance_save(sup: Supervisor, deadline: float) -> None:
    sup._set_deadline(Deadline(at=deadline, source="volcengine"))
    sup.saves_done = 1
    sup.plan = plan_save(deadline, sup.obs, sup.config.policy, "final")


def test_renewal_after_a_save_plans_a_new_insurance_save(supervisor: Supervisor) -> None:
    """Saved once, final save planned; renewed by two hours: an insurance save is planned again."""
    after_insurance_save(supervisor, NOW + 300)
    with capture_logs() as logs:
        supervisor._set_deadline(Deadline(at=NOW + 7500, source="volcengine", raw="renewed"))
    assert supervisor.saves_done == 0
    assert supervisor.plan is not None and supervisor.plan.kind == "insurance"
    changed = [e for e in logs if e["event"] == "deadline_changed"]
    assert changed and changed[0]["raw"] == "renewed"


def test_small_later_move_keeps_the_final_plan(supervisor: Supervisor) -> None:
    """Moved later by less than an insurance save needs: the final save plan just moves."""
    after_insurance_save(supervisor, NOW + 100)
    supervisor._set_deadline(Deadline(at=NOW + 150, source="volcengine"))
    assert supervisor.saves_done == 1
    assert supervisor.plan is not None and supervisor.plan.kind == "final"


def test_a_requested_save_stays_requested(supervisor: Supervisor) -> None:
    """A save was asked for and not done: a renewal leaves the request alone."""
    supervisor._set_deadline(Deadline(at=NOW + 100, source="volcengine"))
    request = SaveRequest(reason="deadline", kind="insurance", requested_at=NOW)
    supervisor.request = request
    supervisor._set_deadline(Deadline(at=NOW + 7200, source="volcengine"))
    assert supervisor.request is request
    assert supervisor.deadline is not None and supervisor.deadline.at == NOW + 7200
