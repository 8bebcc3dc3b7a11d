"""save_scheduled is logged for every new planned save (a core fix found while building the report)."""

from __future__ import annotations

from esiwrap.channel import Message
from esiwrap.deadline import Deadline
from esiwrap.log import capture_logs
from esiwrap.policy import PolicyConfig
from esiwrap.report import epoch
from esiwrap.supervisor import SaveRequest, Supervisor, SupervisorConfig


def test_final_save_is_logged_even_close_to_the_insurance_moment() -> None:
    """The final save's moment is under 5 s from the insurance save's: it is still logged, so
    `esiwrap report` can show its plan (re-plans of one save stay thinned out)."""
    policy = PolicyConfig(redundant_s=4.0, save_duration_s=1.0, final_margin_s=2.0)
    sup = Supervisor(SupervisorConfig(argv=["true"], policy=policy), [], environ={}, clock=lambda: 0.0)
    try:
        sup.deadline = Deadline(at=1000.0, source="cli")
        for step, at in enumerate((990.0, 991.0, 992.0), start=1):
            sup.obs.record_step(step, 1.0, at)
        with capture_logs() as logs:
            sup._replan(992.0)
            sup._replan(992.5)  # the same save, barely moved: not logged again
            request = SaveRequest(reason="deadline", kind="insurance", requested_at=994.0)
            request.done[1] = Message("save_end", 1, {"step": 3, "duration_s": 0.1, "ok": True})
            sup.request = request
            sup._acknowledged(request, 994.5)
        scheduled = [e for e in logs if e["event"] == "save_scheduled"]
        assert [e["kind"] for e in scheduled] == ["insurance", "final"]
        moments = [epoch(e["signal_at"]) for e in scheduled]
        assert 0 < moments[1] - moments[0] < 5.0  # closer than the re-plan logging threshold
    finally:
        sup._close()
