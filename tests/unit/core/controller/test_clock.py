"""The wall clock, checked against the monotonic one: a jump is named, the plan follows it and says
so, a deadline passed with the machine alive gets a last-chance save, an exit 76 names the jump, and
a run still going long past its deadline asks its sources again."""

from __future__ import annotations

from dataclasses import replace

from controller_driver import CHILD, Driver, exits, logs, signals

from esiwrap.core import controller as core
from esiwrap.core.controller import ControllerConfig
from esiwrap.core.policy import PolicyConfig
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED

QUICK = PolicyConfig(redundant_s=5.0, save_duration_s=1.0, final_save=False, interruption_rate_per_day=0.0)


def running(deadline_s: float = 600.0, **config: object) -> Driver:
    d = Driver(ControllerConfig(policy=QUICK, stop_grace_s=10.0, **config))  # type: ignore[arg-type]
    d.deadline(deadline_s)
    d.hello()
    d.steps(1, 5, 1.0)
    return d


def jump(d: Driver, seconds: float) -> None:
    """The wall clock moves by `seconds` while the monotonic one stands (a pause, or a step)."""
    d.wall += seconds


def test_a_forward_jump_is_named_and_the_next_plan_says_it_follows_it() -> None:
    """+30 s: `clock_jumped` (size, direction, what likely happened), then the plan made again,
    whose `why` begins with the jump."""
    d = running()
    jump(d, 30.0)
    d.feed(core.Step(CHILD, 6, 1.0))
    (event,) = logs(d.actions, "clock_jumped")
    assert event["jump_s"] == 30.0 and event["direction"] == "forward"
    assert "paused or snapshotted" in event["likely_cause"] and event["monotonic_elapsed_s"] == 0.0
    after = [e for e in logs(d.actions, "save_scheduled") if e["why"].startswith("after the wall clock")]
    assert after and after[0]["why"].startswith("after the wall clock jumped +30.0s at ")


def test_a_backward_jump_is_a_step_back_and_a_small_drift_is_nothing() -> None:
    d = running()
    jump(d, -30.0)
    d.feed(core.Step(CHILD, 6, 1.0))
    (event,) = logs(d.actions, "clock_jumped")
    assert event["direction"] == "back" and "stepped back" in event["likely_cause"]
    jump(d, 1.5)  # NTP slewing, a second of scheduling: not a jump
    d.feed(core.Step(CHILD, 7, 1.0))
    assert len(logs(d.actions, "clock_jumped")) == 1


def test_a_jump_past_the_deadline_gets_a_last_chance_save_that_ends_in_75() -> None:
    """The wall clock jumps 2 minutes past a deadline 1 minute away, the trainer still runs: the
    save signal goes out at once; its acknowledgement within --stop-grace is exit 75, whose reason
    says it came after the deadline."""
    d = running(60.0)
    jump(d, 120.0)
    out = d.advance(0.01)
    (alive,) = logs(out, "deadline_passed_alive")
    assert alive["clock_jump"]["jump_s"] == 120.0 and "last-chance" in alive["action"]
    (asked,) = logs(out, "save_requested")
    assert asked["reason"] == "last_chance" and asked["pids"] == [CHILD]
    assert [(s.pids, s.signal) for s in signals(out)] == [((CHILD,), "SIGUSR1")]
    d.feed(core.Step(CHILD, 6, 1.0))
    d.save(6, 0.5)
    d.feed(core.ChildExited(CHILD, 0))
    (done,) = exits(d.feed(core.TreeChecked(0)))
    assert done.code == EXIT_CHECKPOINTED and "after the deadline (a last-chance save" in done.reason


def test_a_verified_last_chance_save_still_says_it_came_after_the_deadline() -> None:
    """With verification on (the command line's default), the stop waits for the check of the
    last-chance save; the reason it then gives still says how long after the deadline it came."""
    d = Driver(ControllerConfig(policy=replace(QUICK, verify=True), stop_grace_s=10.0))
    d.deadline(60.0)
    d.hello()
    d.steps(1, 5, 1.0)
    jump(d, 120.0)
    d.advance(0.01)
    d.feed(core.Step(CHILD, 6, 1.0))
    d.save(6, 0.5, path="/ckpt/6")
    (check,) = [a for a in d.actions if isinstance(a, core.VerifyCheckpoint)]
    d.advance(0.2)
    d.feed(core.CheckpointVerified(check.step, check.path, True, format="torch", checked="a torch zip",
                                   bytes=1000, files=1))
    d.feed(core.ChildExited(CHILD, 0))
    (done,) = exits(d.feed(core.TreeChecked(0)))
    assert done.code == EXIT_CHECKPOINTED
    assert "s after the deadline (a last-chance save" in done.reason, done.reason


def test_a_last_chance_save_that_does_not_come_is_a_76_that_names_the_jump() -> None:
    """No boundary within --stop-grace: exit 76; the reason and `save_missed` name the jump, and
    the last step report's age is read on the monotonic clock (a second, not the jump's two
    minutes)."""
    d = running(60.0)
    jump(d, 120.0)
    d.advance(11.0)
    (missed,) = logs(d.actions, "save_missed")
    assert missed["clock_jump"]["jump_s"] == 120.0
    assert missed["late"]["last_step_report_s_ago"] < 12.0
    assert "wall clock jumped +120.0s" in missed["reason"]
    d.feed(core.ChildExited(CHILD, 0))
    (done,) = exits(d.feed(core.TreeChecked(0)))
    assert done.code == EXIT_SAVE_MISSED and "wall clock jumped +120.0s" in done.reason


def test_a_deadline_passed_with_nobody_attached_is_still_a_plain_miss() -> None:
    """No trainer to signal: nothing to try; the miss is immediate."""
    d = Driver(ControllerConfig(policy=QUICK, stop_grace_s=10.0))
    d.deadline(30.0)
    d.advance(31.0)
    assert logs(d.actions, "deadline_passed_alive") == [] and logs(d.actions, "save_missed")
    assert signals(d.actions) == [] and any(isinstance(a, core.StopChild) for a in d.actions)


def test_a_run_still_going_a_minute_past_its_deadline_asks_its_sources_again() -> None:
    """--after-save continue, a minute past the deadline: `deadline_overstayed`, the sources are
    asked again (once for this deadline), and what they say then is logged whatever it is."""
    d = running(30.0, after_save="continue")
    while not logs(d.actions, "save_requested"):
        d.advance(1.0)  # the insurance save is asked for...
    d.feed(core.Step(CHILD, 6, 1.0))
    d.save(6, 0.5)  # ...and taken: no further save; the child keeps running (continue)
    assert d.controller.mode is core.Mode.CONTINUING
    d.advance(120.0)
    (over,) = logs(d.actions, "deadline_overstayed")
    assert over["overstay_s"] >= 60.0 and over["source"] == "cli"
    assert [a for a in d.actions if isinstance(a, core.ResolveDeadline)]
    assert d.controller.deadline is not None
    d.deadline(d.controller.deadline.at - d.wall)  # the source says the same deadline again
    (rechecked,) = logs(d.actions, "deadline_rechecked")
    assert rechecked["answers"][0]["source"] == "cli" and rechecked["answers"][0]["deadline"]
    d.advance(600.0)
    assert len(logs(d.actions, "deadline_overstayed")) == 1
