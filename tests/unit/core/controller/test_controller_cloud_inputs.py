"""The decision core's inputs from the cloud sources: an early warning (EC2 rebalance) asks for
a save now; a withdrawn deadline (an Azure event cancelled, a GCP notice gone) leaves none; an
exit 75 releases the capacity (Azure --azure-ack), driven by hand with a fake clock."""

from __future__ import annotations

from controller_driver import CHILD, Driver, exits, logs, signals

from esiwrap.core import controller as core
from esiwrap.core.controller import ControllerConfig, Mode
from esiwrap.core.policy import PolicyConfig
from esiwrap.core.values import Answer, Deadline
from esiwrap.errors import EXIT_CHECKPOINTED

REBALANCE = "EC2 rebalance recommendation (noticeTime 2027-01-15T08:00:00Z): elevated risk"


def warn(d: Driver, text: str, source: str = "aws-spot") -> list[core.Action]:
    return d.feed(core.DeadlineAnswers((Answer(source, reason="no spot interruption notice", expected=True,
                                               early_warning=text),)))


def trained(d: Driver) -> Driver:
    d.hello()
    d.steps(1, 5, 1.0)
    return d


def test_an_early_warning_asks_for_a_save_once() -> None:
    """A new warning: `early_warning` with its reason, then a save requested with reason
    early_warning; the same warning again (every poll) asks nothing more."""
    d = trained(Driver())
    out = warn(d, REBALANCE)
    assert logs(out, "early_warning")[0] | {"level": "warning"} == {
        "event": "early_warning", "level": "warning", "source": "aws-spot", "reason": REBALANCE,
        "action": "save now"}
    requested = logs(out, "save_requested")
    assert requested and requested[0]["reason"] == "early_warning" and requested[0]["kind"] == "early_warning"
    assert signals(out)[0].pids == (CHILD,)
    d.save(5, 1.0)
    assert not logs(warn(d, REBALANCE), "early_warning")
    assert d.controller.mode is Mode.RUNNING  # no deadline: training simply goes on


def test_a_new_warning_after_the_old_one_cleared_asks_again() -> None:
    d = trained(Driver())
    warn(d, REBALANCE)
    d.save(5, 1.0)
    warn(d, "")  # the recommendation is gone
    d.steps(6, 2, 1.0)
    again = warn(d, REBALANCE.replace("08:00", "09:30"))
    assert logs(again, "save_requested")


def test_an_early_warning_leaves_the_plan_alone() -> None:
    """With a deadline planned, the warning's save is extra: the insurance save is still planned."""
    d = Driver(ControllerConfig(policy=PolicyConfig(interruption_rate_per_day=0)))
    trained(d)
    d.deadline(3600)
    planned = d.controller.plan
    warn(d, REBALANCE)
    d.save(5, 1.0)
    assert d.controller.plan is not None and planned is not None
    assert d.controller.plan.kind == planned.kind and d.controller.deadline_saves_done == 0


def test_an_early_warning_with_nobody_to_save_stops_nothing() -> None:
    d = Driver()
    out = warn(d, REBALANCE)
    assert logs(out, "early_warning")[0]["action"] == "none: no trainer attached"
    assert not logs(out, "save_requested") and not exits(d.advance(600))


def test_an_early_warning_during_a_save_adds_none() -> None:
    d = trained(Driver())
    d.feed(core.SignalReceived("SIGUSR1"))
    out = warn(d, REBALANCE)
    assert logs(out, "early_warning")[0]["action"] == "none: a save is under way"
    assert not signals(out)


def test_the_last_deadline_withdrawn_leaves_none() -> None:
    """An Azure event cancelled: `deadline_withdrawn`, no deadline, no plan, no stop at the old
    time; a new deadline later is planned afresh."""
    d = trained(Driver())
    d.deadline(900, source="azure")
    assert d.controller.plan is not None
    out = d.feed(core.DeadlineAnswers((Answer("azure", reason="event X is gone", expected=True,
                                              withdrawn=True),)))
    assert logs(out, "deadline_withdrawn")[0]["source"] == "azure"
    assert d.controller.deadline is None and d.controller.plan is None
    assert d.controller.wake_at(d.now) is None
    assert not exits(d.advance(1200))
    d.deadline(600, source="azure")
    assert d.controller.plan is not None and d.controller.plan.kind == "insurance"


def test_a_node_that_left_keeps_the_last_deadline() -> None:
    """Unlike a cancelled event, a Ray node that left is no news about the end: with no other
    deadline known, the last one stays (docs: Several nodes)."""
    d = trained(Driver())
    d.deadline(900, source="node:1a2b3c4d/azure")
    d.feed(core.DeadlineAnswers((Answer("node:1a2b3c4d/azure", reason="the node left the cluster",
                                        withdrawn=True),)))
    assert d.controller.deadline is not None and d.controller.plan is not None


def test_a_withdrawal_falls_back_to_the_other_sources_deadline() -> None:
    d = trained(Driver())
    d.deadline(7200, source="env:MLP")
    d.deadline(300, source="gcp")
    out = d.feed(core.DeadlineAnswers((Answer("gcp", reason="gone", withdrawn=True),)))
    changed = logs(out, "deadline_changed")
    assert changed and changed[0]["source"] == "env:MLP"
    assert d.controller.deadline is not None and d.controller.deadline.source == "env:MLP"


def test_lingering_after_the_save_and_the_deadline_withdrawn_trains_on() -> None:
    """--after-save linger: saved and waiting for the stop; the event is cancelled: back to
    training with no deadline, not a stop at the old time."""
    d = Driver(ControllerConfig(after_save="linger", policy=PolicyConfig(final_save=False)))
    trained(d)
    d.deadline(200, source="azure")
    d.advance(200 - 60)
    d.save(6, 1.0)
    assert d.controller.mode is Mode.CONTINUING
    d.feed(core.DeadlineAnswers((Answer("azure", reason="gone", withdrawn=True),)))
    assert d.controller.mode is Mode.RUNNING
    assert not exits(d.advance(600))


def test_exit_75_releases_the_capacity_before_exiting() -> None:
    d = trained(Driver(ControllerConfig(policy=PolicyConfig(final_save=False))))
    deadline = Deadline(at=d.wall + 60, source="azure")
    asked = d.feed(core.DeadlineAnswers((Answer("azure", deadline=deadline),)))
    assert logs(asked, "save_requested")  # too close: at once
    stopping = d.save(6, 0.5)
    assert logs(stopping, "child_stopping")
    assert not [a for a in stopping if isinstance(a, core.ReleaseCapacity)]  # not while the child runs
    d.feed(core.ChildExited(CHILD, 0))
    out = d.feed(core.TreeChecked(0))
    kinds = [type(a) for a in out]
    assert kinds[-2:] == [core.ReleaseCapacity, core.Exit]
    assert exits(out)[0].code == EXIT_CHECKPOINTED


def test_no_release_without_a_checkpoint() -> None:
    d = Driver()
    d.feed(core.ChildExited(CHILD, 3))
    out = d.feed(core.TreeChecked(0))
    assert exits(out)[0].code == 3 and not [a for a in out if isinstance(a, core.ReleaseCapacity)]
