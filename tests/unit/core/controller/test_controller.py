"""The decision core, driven by inputs with a fake clock: what it asks the shell to do, and when."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from controller_driver import CHILD, T0, Driver, exits, logs, signals

from esiwrap.core import controller as core
from esiwrap.core.controller import ControllerConfig, Mode
from esiwrap.core.policy import PolicyConfig
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED
from esiwrap.times import iso_epoch

QUICK = PolicyConfig(redundant_s=4.0, save_duration_s=1.0, final_margin_s=2.0, unmeasured_factor=1.0,
                     interruption_rate_per_day=0.0)
# The planning rules of these tests without the first-save margin and the periodic cadence
# (tests/test_policy*.py cover those): insurance at deadline - (step + save + reserve).
PLAIN = ControllerConfig(policy=PolicyConfig(unmeasured_factor=1.0, interruption_rate_per_day=0.0))


def test_final_save_is_logged_even_close_to_the_insurance_moment() -> None:
    """The final save's moment is under 5 s from the insurance save's: it is still logged (a new
    save always is), while re-plans of one save stay thinned out."""
    d = Driver(ControllerConfig(policy=QUICK))
    d.hello()
    d.steps(1, 3, 1.0)
    d.deadline(30.0)
    d.steps(4, 25, 1.0)  # the insurance signal goes out 6 s before the deadline
    request = d.controller.request
    assert request is not None and request.kind == "insurance"
    d.save(28, 0.1)
    scheduled = logs(d.actions, "save_scheduled")
    assert [e["kind"] for e in scheduled] == ["insurance", "final"]
    moments = [iso_epoch(e["signal_at"]) for e in scheduled]
    assert 0 < moments[1] - moments[0] < 5.0


def test_save_scheduled_names_its_slack_reserve_s() -> None:
    """The insurance save's slack is --redundant-time, a final save's --final-margin: both are
    logged as reserve_s (one name for one value), never as redundant_s."""
    d = Driver(ControllerConfig(policy=QUICK))
    d.hello()
    d.steps(1, 3, 1.0)
    d.deadline(30.0)
    d.steps(4, 25, 1.0)
    d.save(28, 0.1)
    scheduled = logs(d.actions, "save_scheduled")
    assert [e["reserve_s"] for e in scheduled] == [4.0, 2.0]
    assert all("redundant_s" not in e for e in scheduled)


@pytest.mark.parametrize("signal", ["SIGUSR1", "SIGTERM"])
def test_save_requested_without_a_deadline_logs_remaining_as_null(signal: str) -> None:
    """No deadline known: remaining_s is None (JSON null), never NaN, which strict JSON refuses."""
    d = Driver()
    d.hello()
    d.steps(1, 2, 1.0)
    d.feed(core.SignalReceived(signal))
    [requested] = logs(d.actions, "save_requested")
    assert requested["remaining_s"] is None
    d.save(2, 0.5)
    [completed] = logs(d.actions, "save_completed")
    assert completed["remaining_s"] is None


def test_signal_child_never_signals_a_trainer_that_attaches_during_a_save() -> None:
    """With --signal-child only the direct child gets the save signal, also when another process
    says hello while a save is outstanding."""
    d = Driver(ControllerConfig(signal_child=True))
    d.feed(core.SignalReceived("SIGUSR1"))
    assert [s.pids for s in signals(d.actions)] == [(CHILD,)]
    d.hello(pid=5000)
    assert [s.pids for s in signals(d.actions)] == [(CHILD,)]


def test_a_trainer_attaching_during_a_save_is_signalled_at_once() -> None:
    """Without --signal-child, a trainer that says hello while a save is due joins it."""
    d = Driver()
    d.hello()
    d.feed(core.SignalReceived("SIGUSR1"))
    d.hello(pid=5000)
    assert [s.pids for s in signals(d.actions)] == [(CHILD,), (5000,)]


def test_no_busy_wait_for_an_acknowledgement_past_the_deadline() -> None:
    """SIGTERM shortly before the deadline; the checkpoint is still being written when the deadline
    passes. Until the wait for it ends, the next timer stays in the future (the loop sleeps)."""
    d = Driver(ControllerConfig(stop_grace_s=30.0))
    d.hello()
    d.deadline(10.0)
    d.steps(1, 3, 1.0)
    d.feed(core.SignalReceived("SIGTERM"))
    d.feed(core.SaveBegin(CHILD, 3))
    d.wall += 12.0  # past the deadline, without any timer firing on the way
    d.mono += 12.0
    d.controller.tick(d.now)
    assert d.controller.mode is Mode.DRAINING
    wait = d.controller.wake_at(d.now)
    assert wait is not None and wait == pytest.approx(30.0 - 12.0)
    d.feed(core.SaveEnd(CHILD, 3, duration_s=12.0, path="/ckpt"))
    assert d.controller.mode is Mode.STOPPING
    assert d.controller.stop is not None and d.controller.stop.exit_status == EXIT_CHECKPOINTED


def test_renewal_after_a_save_plans_a_new_insurance_save() -> None:
    """Saved once; renewed by two hours: an insurance save is planned against the new deadline."""
    d = Driver(PLAIN)
    d.hello()
    d.steps(1, 3, 10.0)
    d.deadline(300.0, source="volcengine")
    d.advance(120.0)
    assert d.controller.request is not None
    d.save(3, 5.0)
    assert d.controller.deadline_saves_done == 1
    d.deadline(7500.0, source="volcengine", raw="renewed")
    assert d.controller.deadline_saves_done == 0
    assert d.controller.plan is not None and d.controller.plan.kind == "insurance"
    assert logs(d.actions, "deadline_changed")[-1]["raw"] == "renewed"


def test_small_later_move_keeps_the_final_plan() -> None:
    """Moved later by less than an insurance save needs: the final save's plan just moves."""
    d = Driver(PLAIN)
    d.hello()
    d.steps(1, 3, 10.0)
    d.deadline(200.0, source="volcengine")
    d.advance(15.0)  # the insurance signal: 200 - (10 + 60 + 120) s from the start
    d.save(3, 40.0)  # measured: an insurance save now needs 10 + 50 + 120 s
    assert d.controller.plan is not None and d.controller.plan.kind == "final"
    before = d.controller.plan.signal_at
    old = d.controller.deadline
    assert old is not None
    d.deadline(old.at + 30.0 - d.wall, source="volcengine")  # 30 s later: 175 s left
    assert d.controller.deadline_saves_done == 1
    assert d.controller.plan is not None and d.controller.plan.kind == "final"
    assert d.controller.plan.signal_at > before


def test_a_requested_save_stays_requested_through_a_renewal() -> None:
    d = Driver(PLAIN)
    d.hello()
    d.steps(1, 3, 10.0)
    d.deadline(100.0, source="volcengine")
    request = d.controller.request
    assert request is not None
    d.deadline(7200.0, source="volcengine")
    assert d.controller.request is request
    assert d.controller.mode is Mode.SAVE_REQUESTED


def test_too_close_is_warned_again_after_a_renewal() -> None:
    """A deadline too close is warned once; after a save and a renewal that re-opens insurance, a
    spot notice that is too close again is warned again (the warning belongs to one deadline)."""
    d = Driver(PLAIN)
    d.hello()
    d.steps(1, 3, 10.0)
    d.deadline(60.0, source="volcengine")
    assert len(logs(d.actions, "deadline_too_close")) == 1
    d.save(3, 2.0)
    d.deadline(7200.0, source="volcengine")
    assert d.controller.plan is not None and d.controller.plan.kind == "insurance"
    d.steps(4, 100, 10.0)  # the last checkpoint ages: a new insurance save is worth its cost
    d.deadline(30.0, source="volcengine-spot")
    assert len(logs(d.actions, "deadline_too_close")) == 2


def test_a_deadline_learned_after_it_passed_saves_now_then_stops() -> None:
    d = Driver(ControllerConfig(stop_grace_s=20.0))
    d.hello()
    d.steps(1, 2, 5.0)
    d.deadline(-3.0)
    assert logs(d.actions, "deadline_too_close")[0]["action"] == "save now, then stop"
    assert d.controller.mode is Mode.DRAINING
    assert signals(d.actions)[-1].signal == "SIGUSR1"
    d.save(2, 1.0)
    assert d.controller.stop is not None and d.controller.stop.exit_status == EXIT_CHECKPOINTED


def test_nobody_to_save_waits_for_a_slow_trainer_then_stops_with_76() -> None:
    """A save is due and no trainer ever attached: the attach window stays open until 5 s (not
    --stop-grace) before the deadline, and `save_requested` says until when; only then
    `no_trainer_attached`, a stop whose grace ends by the deadline, and exit 76."""
    d = Driver(ControllerConfig(stop_grace_s=10.0))
    d.deadline(300.0)
    d.advance(200.0)
    (asked,) = logs(d.actions, "save_requested")
    assert asked["pids"] == [] and asked["attach_by"]
    assert logs(d.actions, "no_trainer_attached") == []  # a trainer may still attach
    assert d.controller.wake_at(d.now) == pytest.approx(300.0 - 5.0 - 200.0)
    d.advance(96.0)
    (nobody,) = logs(d.actions, "no_trainer_attached")
    assert nobody["action"] == "stop" and nobody["grace_s"] == 5.0
    assert d.controller.stop is not None
    assert d.controller.stop.exit_status == EXIT_SAVE_MISSED


def test_once_a_trainer_attached_the_window_keeps_the_full_stop_grace() -> None:
    """A trainer that attached and left may have a save under way in the tree: --stop-grace."""
    d = Driver(ControllerConfig(stop_grace_s=10.0))
    d.hello()
    d.feed(core.TrainerGone(CHILD))
    d.deadline(300.0)
    d.advance(200.0)
    assert d.controller.wake_at(d.now) == pytest.approx(300.0 - 10.0 - 200.0)


def test_a_trainer_that_attaches_after_the_window_is_named_late_not_missing() -> None:
    """The stop for nobody attached has begun when the first hello comes: the exit's reason says
    it was slow to start, not that install() was never called."""
    d = Driver(ControllerConfig(stop_grace_s=10.0))
    d.deadline(60.0)
    d.advance(56.0)
    assert d.controller.stop is not None and "install() was never called" in d.controller.stop.reason
    d.hello()
    (late,) = logs(d.actions, "trainer_late")
    assert "slow to start" in late["reason"] and "after the save was due" in late["reason"]
    d.feed(core.ChildExited(CHILD, 0))
    (done,) = exits(d.feed(core.TreeChecked(0)))
    assert done.code == EXIT_SAVE_MISSED and "slow to start" in done.reason


@pytest.mark.parametrize(("code", "signum", "expected"), [(3, 0, 3), (None, 9, 137), (0, 0, 0)])
def test_the_childs_own_end_is_esiwraps_exit_code(code: int | None, signum: int, expected: int) -> None:
    d = Driver()
    d.feed(core.ChildExited(CHILD, code, "SIGKILL" if signum else None, signum))
    d.feed(core.TreeChecked(0))
    assert [e.code for e in exits(d.actions)] == [expected]


def test_second_sigint_kills_the_tree_at_once() -> None:
    d = Driver()
    d.feed(core.SignalReceived("SIGINT"))
    assert [s.signal for s in signals(d.actions)] == ["SIGINT"]
    d.feed(core.SignalReceived("SIGINT"))
    assert any(isinstance(a, core.KillTree) for a in d.actions)
    assert d.controller.mode is Mode.KILLING


def test_a_save_being_written_is_waited_for_only_up_to_the_deadline() -> None:
    """SIGTERM 100 s before the deadline; the save begins and would run for many minutes. The wait
    for it is extended while it is written, but never past the deadline: then esiwrap stops."""
    d = Driver(ControllerConfig(policy=PolicyConfig(save_duration_s=600.0), stop_grace_s=30.0))
    d.hello()
    d.steps(1, 2, 1.0)
    d.deadline(100.0)
    d.feed(core.SignalReceived("SIGTERM"))
    d.feed(core.SaveBegin(CHILD, 2))
    d.advance(99.0)
    assert d.controller.mode is Mode.DRAINING
    assert logs(d.actions, "stop_extended")
    d.advance(2.0)
    assert d.controller.mode is Mode.STOPPING
    assert logs(d.actions, "save_missed")


def test_the_shells_wake_up_sockets_never_block() -> None:
    """The watcher threads wake the loop with a byte on a socket, signals with a byte in a pipe: a
    full buffer must drop the byte (the loop is awake anyway), never block the thread that asks a
    cloud API or the signal handler."""
    from esiwrap.shell import early
    from esiwrap.shell.supervisor import Supervisor, SupervisorConfig

    sup = Supervisor(SupervisorConfig(argv=["true"]), [], environ={})
    caught = early.catch()
    try:
        assert not sup._wake_w.getblocking() and not os.get_blocking(caught.write_fd)
    finally:
        sup._close()
        early.release()


def test_linger_trains_on_until_the_stop_must_begin_and_follows_a_renewal() -> None:
    """--after-save linger: after the last save the child trains on; a renewal then plans a new
    insurance save; without one, the stop begins --stop-grace + 5 s before the deadline (exit 75)."""
    one_save = replace(PLAIN.policy, final_save=False)
    config = ControllerConfig(policy=one_save, after_save="linger", stop_grace_s=10.0)
    for renewed in (False, True):
        d = Driver(config)
        d.hello()
        d.steps(1, 3, 10.0)
        d.deadline(200.0, source="volcengine")
        d.advance(15.0)
        d.save(3, 5.0)  # the insurance save, and with --no-final-save the last one
        lingering = logs(d.actions, "training_continues")
        assert lingering and "stop_at" in lingering[-1]
        assert d.controller.mode is Mode.CONTINUING
        if renewed:
            d.deadline(7200.0, source="volcengine")
            assert d.controller.mode is Mode.RUNNING
            assert d.controller.plan is not None and d.controller.plan.kind == "insurance"
        else:
            stop_in = d.controller.wake_at(d.now)
            deadline = d.controller.deadline
            assert stop_in is not None and deadline is not None
            assert d.wall + stop_in == pytest.approx(deadline.at - 10.0 - core.KILL_WAIT_S)
            d.advance(stop_in)
            assert d.controller.stop is not None and d.controller.stop.exit_status == EXIT_CHECKPOINTED


def test_reports_from_a_process_that_never_said_hello_are_refused() -> None:
    """A save_end from a stranger must not count as a checkpoint: a later SIGTERM would otherwise
    stop with 75 although nothing was saved. Each of its reports is refused, and says so."""
    d = Driver(PLAIN)
    d.hello()
    d.steps(1, 3, 1.0)
    end = core.SaveEnd(9999, 3, duration_s=0.1, path="/elsewhere")
    step, bye = core.Step(9999, 50, 1.0), core.TrainerLeft(9999)
    assert d.feed(end) == [core.RefuseMessage(end, core.NOT_ATTACHED)]
    assert d.feed(step) == [core.RefuseMessage(step, core.NOT_ATTACHED)]
    assert d.feed(bye) == [core.RefuseMessage(bye, core.NOT_ATTACHED)]
    assert d.controller.last_checkpoint is None and d.controller.obs.last_step == 3
    d.feed(core.SignalReceived("SIGTERM"))
    assert d.controller.mode is Mode.DRAINING  # a save is asked for, nothing was taken as saved


def test_a_save_end_for_a_step_its_trainer_never_began_is_refused() -> None:
    """An attached trainer's save_end for a save it never began (step 424242, 0.2 s) is no evidence:
    no checkpoint, no measured save, the save asked for still waits; its real save then counts."""
    d = Driver(PLAIN)
    d.hello()
    d.steps(1, 3, 1.0)
    d.feed(core.SignalReceived("SIGTERM"))  # a save is asked for; esiwrap stops once it is done
    forged = core.SaveEnd(CHILD, 424242, duration_s=0.2, path="/nowhere")
    assert d.feed(forged) == [core.RefuseMessage(forged, core.NEVER_BEGUN)]
    snapshot = core.SaveSnapshot(CHILD, 424242, 0.1)
    assert d.feed(snapshot) == [core.RefuseMessage(snapshot, core.NEVER_BEGUN)]
    assert d.controller.last_checkpoint is None and d.controller.obs.saves == []
    assert d.controller.mode is Mode.DRAINING
    d.save(3, 2.0)
    assert d.controller.last_checkpoint is not None and d.controller.last_checkpoint.step == 3
    assert d.controller.stop is not None and d.controller.stop.exit_status == EXIT_CHECKPOINTED
    again = core.SaveEnd(CHILD, 3, duration_s=2.0)  # a second end of the same save: it ended already
    assert core.RefuseMessage(again, core.NEVER_BEGUN) in d.feed(again)


def test_a_trainers_overlapping_asynchronous_saves_each_end_once() -> None:
    """Two asynchronous saves in flight (begun at 10 and 20, each snapshot at once, written in the
    background): each end counts, in any order, and only after its own begin."""
    d = Driver(PLAIN)
    d.hello()
    for step in (10, 20):
        d.feed(core.SaveBegin(CHILD, step))
        d.feed(core.SaveSnapshot(CHILD, step, 0.1))
    for step, seconds in ((20, 3.0), (10, 4.0)):
        out = d.feed(core.SaveEnd(CHILD, step, duration_s=seconds))
        assert not [a for a in out if isinstance(a, core.RefuseMessage)]
    assert d.controller.saves.completed_total == 2


@pytest.mark.parametrize("wants_signal", [True, False])
def test_a_hello_from_outside_esiwraps_tree_is_refused_whatever_it_asks(wants_signal: bool) -> None:
    """A phantom trainer (not a descendant) that says it saves but must not be signalled is not
    attached: the real trainer's save is not held up waiting for it (exit 75, not 76)."""
    d = Driver(PLAIN)
    d.hello()
    phantom = core.Hello(7777, saves=True, wants_signal=wants_signal, descendant=False)
    assert d.feed(phantom) == [core.RefuseMessage(phantom, core.NOT_IN_TREE)]
    assert 7777 not in d.controller.trainers
    d.steps(1, 3, 1.0)
    d.feed(core.SignalReceived("SIGTERM"))
    d.save(3, 1.0)
    assert d.controller.stop is not None and d.controller.stop.exit_status == EXIT_CHECKPOINTED


def test_a_bye_lets_a_trainer_go_and_a_save_no_longer_waits_for_it() -> None:
    """Two saving ranks; one says bye while the save is under way: the other's end acknowledges it."""
    d = Driver(PLAIN)
    d.hello(CHILD)
    d.hello(CHILD + 1)
    d.steps(1, 3, 1.0)
    d.feed(core.SignalReceived("SIGTERM"))
    d.feed(core.SaveBegin(CHILD, 3))
    left = d.feed(core.TrainerLeft(CHILD + 1))
    assert [a.event for a in left if isinstance(a, core.Log)] == ["trainer_left"]
    d.feed(core.SaveEnd(CHILD, 3, duration_s=1.0))
    assert d.controller.stop is not None and d.controller.stop.exit_status == EXIT_CHECKPOINTED


def test_a_stop_budget_too_small_for_a_checkpoint_is_warned_with_the_fix() -> None:
    """--stop-budget 10 (docker stop), --stop-grace 30: warned at the hello, naming what to raise;
    again only when a measured save makes the stop need a fifth more."""
    d = Driver(ControllerConfig(policy=PLAIN.policy, stop_budget_s=10.0, stop_grace_s=30.0))
    d.hello()
    [first] = logs(d.actions, "stop_budget_too_small")
    assert first["budget_s"] == 10.0 and first["needed_s"] == 60.0 + 30.0
    assert "at least 90 s" in first["fix"] and "--stop-grace" in first["fix"]
    d.steps(1, 5, 2.0)
    assert len(logs(d.actions, "stop_budget_too_small")) == 1  # 92 s: not a fifth more
    d.feed(core.SignalReceived("SIGUSR1"))
    d.save(5, 120.0)
    assert logs(d.actions, "stop_budget_too_small")[-1]["needed_s"] == 2.0 + 120.0 + 30.0
    fits = Driver(ControllerConfig(policy=PLAIN.policy, stop_budget_s=120.0, stop_grace_s=5.0))
    fits.hello()
    assert logs(fits.actions, "stop_budget_too_small") == []


def test_an_insurance_save_that_falls_due_on_time_is_not_too_close() -> None:
    """The insurance moment arrives with a step report, as planned: no deadline_too_close."""
    d = Driver(PLAIN)
    d.hello()
    d.steps(1, 3, 10.0)
    d.deadline(400.0)  # needs 10 + 60 + 120 s: due 210 s from now, at a step boundary
    d.steps(4, 20, 10.0)
    d.wall += 10.001  # the boundary's report is read a millisecond after the save fell due,
    d.mono += 10.001  # before the loop's timer fired (I/O is handled first)
    d.feed(core.Step(CHILD, 24, 10.001))
    assert logs(d.actions, "save_requested") and logs(d.actions, "deadline_too_close") == []


def test_the_state_is_kept_after_every_completed_save_and_once_at_the_end() -> None:
    """The controller says when the job's state file is written: right after each completed save
    (asked for, or the trainer's own), with what was measured so far; and when the shell leaves,
    once more if anything was measured at all."""
    d = Driver(ControllerConfig(policy=QUICK))
    assert d.controller.finish(d.now) == []  # nothing measured: the file is left as it is
    d.hello()
    d.steps(1, 3, 1.0)
    own = d.save(3, 0.5)  # the trainer's own checkpoint
    kept = [a for a in own if isinstance(a, core.KeepState)]
    assert len(kept) == 1 and kept[0].state.saves == (0.5,) and kept[0].state.steps == (1.0, 1.0, 1.0)
    assert [type(a) for a in own].index(core.KeepState) > [type(a) for a in own].index(core.Log)
    d.deadline(30.0)
    d.steps(4, 25, 1.0)
    requested = d.save(28, 0.75)
    assert [a.state.saves for a in requested if isinstance(a, core.KeepState)] == [(0.5, 0.75)]
    assert [a.state.blocking for a in requested if isinstance(a, core.KeepState)] == [(0.75,)]
    final = d.controller.finish(d.now)
    assert len(final) == 1 and isinstance(final[0], core.KeepState) and final[0].state.saves == (0.5, 0.75)
    assert final[0].state.runs[-1].ending == "other"  # left with no exit decided: a failure of its own


def test_while_stopping_every_wake_up_asks_for_the_tree_to_be_checked() -> None:
    """Running, no tree check; from the stop on, each tick asks for one; after the exit nothing."""
    d = Driver()
    assert not any(isinstance(a, core.CheckTree) for a in d.controller.tick(d.now))
    d.feed(core.SignalReceived("SIGTERM"))  # nothing attached: the stop begins at once
    assert any(isinstance(a, core.CheckTree) for a in d.controller.tick(d.now))
    d.feed(core.ChildExited(CHILD, 0))
    d.feed(core.TreeChecked(0))
    assert exits(d.actions) and d.controller.tick(d.now) == []


def test_an_unknown_input_is_refused_at_once() -> None:
    """Anything but an `Input` is the caller's bug: TypeError, nothing done."""
    d = Driver()
    with pytest.raises(TypeError, match="not an input"):
        d.controller.handle(("hello", 4242), d.now)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an input"):
        d.controller.handle(core.KillTree(), d.now)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["install-first", "ray-init-first"])
def test_a_second_hello_of_one_process_adds_to_the_first(order: str) -> None:
    """A Ray driver says hello twice: `esiwrap.trainer.install()` (saves) and the start-up hook's
    `ray.init` (stop me with SIGINT, saves nothing itself), in either order. The later hello
    undoes nothing the earlier asked for: after a SIGTERM's save it is stopped with SIGINT."""
    d = Driver()
    trainer = {"saves": True}
    ray_hook = {"saves": False, "stop_signal": "SIGINT"}
    for fields in ((trainer, ray_hook) if order == "install-first" else (ray_hook, trainer)):
        d.hello(**fields)
    attached = d.controller.trainers[CHILD]
    assert (attached.saves, attached.signal, attached.stop_signal) == (True, True, "SIGINT")
    d.steps(1, 3, 1.0)
    d.feed(core.SignalReceived("SIGTERM"))
    assert [s.pids for s in signals(d.actions)] == [(CHILD,)]
    d.save(3, 0.1)
    assert [a.signal for a in d.actions if isinstance(a, core.StopChild)] == ["SIGINT"]


# ------------------------------------------------------------------------ a trainer's bye
def test_a_trainer_that_said_bye_gets_no_save_signal_any_more() -> None:
    """After its bye (the library says it as the process ends, then ignores the signal) a trainer
    is signalled no more: a save asked for by hand finds nobody, a save that falls due names no
    pid, and the bye is logged once."""
    d = Driver(ControllerConfig(policy=QUICK, stop_grace_s=2.0))
    d.hello()
    d.steps(1, 3, 1.0)
    d.feed(core.TrainerLeft(CHILD))
    assert [e["pid"] for e in logs(d.actions, "trainer_left")] == [CHILD]
    d.feed(core.SignalReceived("SIGUSR1"))
    assert logs(d.actions, "no_trainer_attached")[-1]["action"] == "ignored"
    d.deadline(30.0)
    d.advance(28.0)
    assert [e["pids"] for e in logs(d.actions, "save_requested")] == [[]]
    assert signals(d.actions) == []


def test_a_hello_after_the_bye_of_the_same_process_does_not_attach_it_again() -> None:
    """A hello that reaches esiwrap after the same process's bye was sent before it (another
    client of the process, kept while esiwrap's queue was full): the process is ending, it is not
    signalled. Once the process has exited, its pid may be a new process's, which attaches."""
    d = Driver()
    d.hello(pid=5001)
    d.feed(core.TrainerLeft(5001))
    d.hello(pid=5001)
    (rejected,) = [a for a in d.actions if isinstance(a, core.RefuseMessage)]
    assert rejected.refused.pid == 5001 and "said bye" in rejected.reason
    d.feed(core.SignalReceived("SIGUSR1"))
    assert signals(d.actions) == []
    d.feed(core.TrainerGone(5001))  # the process exited
    d.hello(pid=5001)  # a new process with the same pid
    d.feed(core.SignalReceived("SIGUSR1"))
    assert [s.pids for s in signals(d.actions)] == [(5001,)]


def test_a_hello_sent_after_the_bye_attaches_the_process_again() -> None:
    """`uninstall()` says bye and the process lives on; `install()` again says hello. The sender's
    stamps tell that hello (sent after the bye: attached, signalled) from one sent before the bye
    and read after it (refused)."""
    d = Driver()
    d.feed(core.Hello(5001, sent_mono=10.0))
    d.feed(core.TrainerLeft(5001, sent_mono=20.0))
    d.feed(core.Hello(5001, sent_mono=15.0))  # sent before the bye, read late
    (rejected,) = [a for a in d.actions if isinstance(a, core.RefuseMessage)]
    assert rejected.refused.pid == 5001 and rejected.reason == core.SAID_BYE
    d.feed(core.SignalReceived("SIGUSR1"))
    assert signals(d.actions) == []
    d.feed(core.Hello(5001, sent_mono=30.0))  # install() again
    assert [e["pid"] for e in logs(d.actions, "trainer_attached")] == [5001, 5001]
    d.feed(core.SignalReceived("SIGUSR1"))
    assert [s.pids for s in signals(d.actions)] == [(5001,)]


def test_signal_child_sends_nothing_to_a_child_that_said_bye() -> None:
    """--signal-child signals the direct child without a hello; not once it said bye."""
    d = Driver(ControllerConfig(signal_child=True))
    d.hello()
    d.feed(core.TrainerLeft(CHILD))
    d.feed(core.SignalReceived("SIGUSR1"))
    assert signals(d.actions) == []


def test_a_bye_from_a_process_that_never_said_hello_changes_nothing() -> None:
    """Only an attached trainer leaves: a stray bye is refused (it is not attached), and a later
    hello attaches."""
    d = Driver()
    d.feed(core.TrainerLeft(5001))
    (refused,) = [a for a in d.actions if isinstance(a, core.RefuseMessage)]
    assert refused.refused == core.TrainerLeft(5001) and refused.reason == core.NOT_ATTACHED
    d.hello(pid=5001)
    assert logs(d.actions, "trainer_left") == []
    assert 5001 in d.controller.trainers


def test_a_child_killed_by_the_save_signal_esiwrap_sent_it_says_so() -> None:
    """The child dies of the save signal esiwrap sent it 28 ms earlier (it had no handler: it
    never called install(), uninstalled it, or was shutting down): the exit code stays 128+10,
    the reason and the log's hint say what happened."""
    d = Driver()
    d.hello()
    d.feed(core.SignalReceived("SIGUSR1"))
    d.mono += 0.028
    d.feed(core.ChildExited(CHILD, None, "SIGUSR1", 10))
    d.feed(core.TreeChecked(0))
    (exit_,) = exits(d.actions)
    expected = ("killed by SIGUSR1, the save signal esiwrap sent it 28 ms earlier: it had no handler for "
                "it (a trainer that never called install(), or one that had called uninstall() or was "
                "shutting down)")
    assert (exit_.code, exit_.reason) == (128 + 10, f"child exited: {expected}")
    assert logs(d.actions, "child_exited")[0]["hint"] == expected


@pytest.mark.parametrize("signalled", [False, True])
def test_a_death_by_a_signal_esiwrap_did_not_send_is_a_plain_child_exit(signalled: bool) -> None:
    """SIGUSR1 that esiwrap never sent (a `kill -USR1` by hand), or sent for a save the trainer
    already acknowledged: "child exited", nothing more."""
    d = Driver()
    d.hello()
    if signalled:
        d.steps(1, 2, 1.0)
        d.feed(core.SignalReceived("SIGUSR1"))
        d.save(2, 0.5)
    d.feed(core.ChildExited(CHILD, None, "SIGUSR1", 10))
    d.feed(core.TreeChecked(0))
    (exit_,) = exits(d.actions)
    assert (exit_.code, exit_.reason) == (128 + 10, "child exited")
    assert "hint" not in logs(d.actions, "child_exited")[0]


# ------------------------------------------------------------------------ exit 76 says why (issue 24)
def missed(d: Driver) -> dict:
    (event,) = [e for e in logs(d.actions, "save_missed") if "never_came" in e]
    assert d.controller.stop is not None and d.controller.stop.exit_status == EXIT_SAVE_MISSED
    assert event["never_came"][0].split(":")[0] in d.controller.stop.reason
    return event


def planned_signal(d: Driver, every_s: float = 1.0) -> int:
    """Steps until the insurance save's signal goes out; the step number reached."""
    step = 0
    while True:
        d.advance(every_s)
        if logs(d.actions, "save_requested"):
            return step
        step += 1
        d.feed(core.Step(CHILD, step, every_s))


def test_a_miss_with_no_hello_says_no_trainer_attached() -> None:
    d = Driver(ControllerConfig(stop_grace_s=3.0))
    d.deadline(30.0)
    d.advance(40.0)
    event = missed(d)
    assert event["never_came"][0].startswith("no trainer said hello")
    assert event["last_plan"]["kind"] == "insurance" and event["signal"]["pids"] == []


def test_a_miss_after_steps_without_a_save_says_the_trainer_never_began_it() -> None:
    """The trainer went on reporting steps after the signal but never saved."""
    d = Driver(ControllerConfig(policy=PolicyConfig(redundant_s=2.0, save_duration_s=1.0), stop_grace_s=3.0))
    d.deadline(40.0)
    d.hello()
    step = planned_signal(d)
    for n in range(step + 1, step + 31):
        d.advance(1.0)
        if exits(d.actions) or d.controller.stop is not None:
            break
        d.feed(core.Step(CHILD, n, 1.0))
    event = missed(d)
    assert event["never_came"][0].startswith("no save_begin")
    assert event["signal"]["pids"] == [CHILD] and event["signal"]["step_reports_since"] > 1
    assert event["signal"]["late_s"] is not None and event["late"]["last_step_report_s_ago"] is not None


def test_a_miss_when_no_boundary_came_after_the_signal_says_the_step_ran_long() -> None:
    d = Driver(ControllerConfig(policy=PolicyConfig(redundant_s=2.0, save_duration_s=1.0), stop_grace_s=3.0))
    d.deadline(40.0)
    d.hello()
    planned_signal(d)
    d.advance(30.0)
    event = missed(d)
    assert event["never_came"][0].startswith("no step boundary came after the save signal")
    assert event["signal"]["step_reports_since"] == 0


def test_a_miss_with_a_save_begun_and_never_ended_says_so_and_names_a_failed_save() -> None:
    d = Driver(ControllerConfig(policy=PolicyConfig(redundant_s=2.0, save_duration_s=1.0), stop_grace_s=3.0))
    d.deadline(40.0)
    d.hello()
    step = planned_signal(d)
    d.feed(core.SaveBegin(CHILD, step + 1))
    d.feed(core.SaveEnd(CHILD, step + 1, ok=False, error="OSError: No space left on device"))
    d.feed(core.SaveBegin(CHILD, step + 2))
    d.advance(30.0)
    event = missed(d)
    assert event["never_came"][0].startswith("save_begin came")
    assert any("No space left on device" in why for why in event["never_came"][1:])


def test_inputs_applied_before_the_timers_count_a_save_acknowledged_before_a_late_wake() -> None:
    """The loop was held up past the deadline while the step report, save_begin and save_end of
    the insurance save waited in the channel. The runner applies every waiting input, then fires
    the timers once: the checkpoint counts as it came, before the deadline was acted on. Had the
    timers fired after the first of them, the deadline would have found no checkpoint: only the
    last-chance save (the machine is still running) keeps that run from exit 76."""
    def held_up(one_wake: bool) -> Driver:
        d = Driver(ControllerConfig(policy=PolicyConfig(redundant_s=2.0, save_duration_s=1.0)))
        d.deadline(40.0)
        d.hello()
        step = planned_signal(d) + 1
        d.wall += 40.0  # the loop runs again 40 s later, the deadline passed
        d.mono += 40.0
        for waiting in (core.Step(CHILD, step, 1.0), core.SaveBegin(CHILD, step),
                        core.SaveEnd(CHILD, step, duration_s=0.3, path="/ckpt")):
            if one_wake:
                d.runner.feed(waiting)
            else:
                d.feed(waiting)
        d.runner.wake()
        return d

    applied_first = held_up(one_wake=True)
    assert applied_first.controller.stop is not None
    assert applied_first.controller.stop.exit_status == EXIT_CHECKPOINTED
    assert not logs(applied_first.actions, "save_missed")
    assert not logs(applied_first.actions, "deadline_passed_alive")
    assert [e["kind"] for e in logs(applied_first.actions, "save_completed")] == ["insurance"]
    one_at_a_time = held_up(one_wake=False)
    assert logs(one_at_a_time.actions, "deadline_passed_alive")
    assert one_at_a_time.controller.stop is not None
    assert "after the deadline (a last-chance save" in one_at_a_time.controller.stop.reason


def test_nobody_to_save_logs_why_before_the_graceful_stop() -> None:
    """The stop --stop-grace before the deadline with nobody attached is an exit 76 too: it says so."""
    d = Driver(ControllerConfig(stop_grace_s=10.0))
    d.deadline(300.0)
    d.advance(295.0)
    event = missed(d)
    assert event["level"] == "warning" and event["never_came"][0].startswith("no trainer said hello")


# ------------------------------------------------------------------------ its own lateness (issue 24)
def planned_moment(late_s: float | None, delay_s: float | None) -> tuple[float, float]:
    """The insurance save's planned moment (seconds from the start) and its lateness margin, after
    ten 1 s steps whose reports took `delay_s` and wake-ups `late_s` late."""
    d = Driver(ControllerConfig(policy=PolicyConfig(redundant_s=10.0, save_duration_s=1.0,
                                                    interruption_rate_per_day=0.0)))
    d.deadline(100.0)
    d.hello()
    for step in range(1, 11):
        d.wall += 1.0
        d.mono += 1.0
        d.runner.wake(late_s)
        d.feed(core.Step(CHILD, step, 1.0, delay_s))
    plan = d.controller.plan
    assert plan is not None
    return plan.nominal_at - T0, plan.lateness_s


def test_the_plan_keeps_the_worst_recent_lateness_as_margin() -> None:
    """Wake-ups 0.4 s late and reports 0.25 s late move the save 0.65 s earlier; none, not at all."""
    quiet, quiet_margin = planned_moment(None, None)
    busy, margin = planned_moment(0.4, 0.25)
    assert quiet_margin == 0.0 and margin == pytest.approx(0.65)
    assert quiet - busy == pytest.approx(0.65)


def test_lateness_is_logged_with_each_report_and_in_the_snapshot() -> None:
    d = Driver(ControllerConfig())
    d.hello()
    d.runner.wake(0.02)
    d.feed(core.Step(CHILD, 1, 1.0, 0.003))
    (observed,) = logs(d.actions, "step_observed")
    assert observed["delivery_s"] == 0.003
    snapshot = d.controller.snapshot(d.now, "run", 1)
    assert snapshot.report_delay_max_s == 0.003 and snapshot.timer_late_max_s == 0.02
    assert snapshot.lateness() == {"timers": {"p99_s": 0.02, "max_s": 0.02},
                                   "reports": {"p99_s": 0.003, "max_s": 0.003}}


def test_an_earlier_deadline_cuts_short_the_wait_for_a_save_being_written() -> None:
    """Draining with a save being written, its wait was extended up to the deadline then known; a
    deadline that moves earlier ends that wait by itself (the capacity is gone then), and the stop
    begins no later than --stop-grace after it (hypothesis found the case)."""
    d = Driver(ControllerConfig(policy=PolicyConfig(redundant_s=0.0, save_duration_s=1.0), signal_child=True,
                                stop_grace_s=5.0))
    d.deadline(0.0)  # learned too late: save at once, wait --stop-grace for it
    d.deadline(12.0)
    d.feed(core.SaveBegin(CHILD, 0))
    d.advance(5.0)  # the wait is over, the save is being written: it may go on until the deadline
    assert d.controller.mode is core.Mode.DRAINING
    d.deadline(0.0)  # the deadline moves to now
    d.advance(5.0)
    assert d.controller.mode is not core.Mode.DRAINING and d.controller.stop is not None
