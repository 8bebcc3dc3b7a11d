"""The stop's order when a trainer sits below the child (`esiwrap -- bash run.sh`, a launcher,
`uv run`): the trainer that asked for a stop signal of its own gets it first, the child gets its
stop signal once that trainer has exited, and what is left of the tree is SIGTERMed only after it;
a request esiwrap cannot honour is one warning. Decisions only: the controller driven by hand."""

from __future__ import annotations

from controller_driver import CHILD, Driver, exits, logs, signals

from esiwrap import events as ev
from esiwrap.core import controller as core
from esiwrap.core.controller import ControllerConfig
from esiwrap.core.controller.protocol import LAUNCHER_EXIT_S
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED

DRIVER_PID = CHILD + 1  # `python3 -m verl.trainer.main_ppo`, run (not exec'd) by `bash run.sh`


def saved_and_stopping(driver: Driver) -> list[core.Action]:
    """A Ray driver below bash asked for SIGINT; a SIGTERM's save is acknowledged: the stop begins."""
    driver.hello(DRIVER_PID, stop_signal="SIGINT")
    driver.steps(1, 3, 1.0, pid=DRIVER_PID)
    out = driver.feed(core.SignalReceived("SIGTERM"))
    out += driver.save(3, 0.5, pid=DRIVER_PID)
    return out


def test_the_trainer_below_bash_gets_its_sigint_first_and_bash_nothing_while_it_shuts_down() -> None:
    """The driver gets SIGINT; bash, which would die of SIGTERM at once and leave the driver to the
    tree's SIGTERM (Ray's abort), gets nothing yet. When the driver has exited and bash is still
    there 2 s later, bash gets the stop signal (and the log says why)."""
    driver = Driver()
    out = saved_and_stopping(driver)
    assert [a for a in out if isinstance(a, core.StopChild)] == [core.StopChild(None)]  # the tree remembered
    assert signals(out)[-1] == core.SendSignal((DRIVER_PID,), "SIGINT")
    stopping = logs(out, ev.CHILD_STOPPING)[0]
    assert (stopping["signal"], stopping["first"]) == ("SIGTERM", [{"pid": DRIVER_PID, "signal": "SIGINT"}])
    assert signals(driver.advance(5.0)) == []  # the driver is shutting Ray down: nothing else
    assert signals(driver.feed(core.TrainerGone(DRIVER_PID))) == []  # bash may exit with it
    later = driver.advance(LAUNCHER_EXIT_S)
    assert signals(later) == [core.SendSignal((CHILD,), "SIGTERM")]
    assert logs(later, ev.CHILD_STOP_SIGNALLED)[0]["signal"] == "SIGTERM"
    done = driver.feed(core.ChildExited(CHILD, 143))
    done += driver.feed(core.TreeChecked(0))
    assert [e.code for e in exits(done)] == [EXIT_CHECKPOINTED]


def test_a_launcher_that_exits_with_its_command_gets_no_signal_at_all() -> None:
    """bash waits for its foreground command and exits with it: once the driver (SIGINT) is gone,
    bash's own exit follows within moments, and no signal is sent to it; exit 75."""
    driver = Driver()
    saved_and_stopping(driver)
    out = driver.feed(core.TrainerGone(DRIVER_PID))  # the driver's pidfd fires first...
    out += driver.advance(0.01)
    out += driver.feed(core.ChildExited(CHILD, 130))  # ...bash reaps it and exits with its status
    out += driver.feed(core.TreeChecked(0))
    out += driver.advance(LAUNCHER_EXIT_S)
    assert signals(out) == []
    assert [e.code for e in exits(out)] == [EXIT_CHECKPOINTED]


def test_what_is_left_of_the_tree_is_sigtermed_only_after_the_trainers_stopped_first() -> None:
    """The child is gone while the driver still shuts down: no SIGTERM to the tree (it would hit
    the driver) until the driver has exited; then SIGTERM to what is left, once."""
    driver = Driver()
    saved_and_stopping(driver)
    driver.feed(core.ChildExited(CHILD, 0))
    waiting = driver.feed(core.TreeChecked(3))
    assert not [a for a in waiting if isinstance(a, core.TermLeftovers)]
    driver.feed(core.TrainerGone(DRIVER_PID))
    after = driver.feed(core.TreeChecked(2))
    assert len([a for a in after if isinstance(a, core.TermLeftovers)]) == 1


def test_a_trainer_that_never_exits_is_killed_with_the_tree_when_the_grace_is_over() -> None:
    """One grace for the whole stop, from the first signal: SIGKILL to the tree then."""
    driver = Driver(ControllerConfig(stop_grace_s=20.0))
    saved_and_stopping(driver)
    out = driver.advance(19.0)
    assert not [a for a in out if isinstance(a, core.KillTree)]
    out = driver.advance(2.0)
    assert [a for a in out if isinstance(a, core.KillTree)]


def test_with_the_child_gone_before_the_stop_the_trainer_still_gets_its_own_signal_first() -> None:
    """The launcher left its trainer behind (it exited): the stop sends the trainer its SIGINT, and
    the tree's SIGTERM waits for it."""
    driver = Driver()
    driver.hello(DRIVER_PID, stop_signal="SIGINT")
    out = driver.feed(core.ChildExited(CHILD, 0))
    assert core.SendSignal((DRIVER_PID,), "SIGINT") in signals(out)
    out = driver.feed(core.TreeChecked(1))
    assert not [a for a in out if isinstance(a, core.TermLeftovers)]


def test_the_direct_child_that_asked_is_stopped_as_before() -> None:
    """The trainer is the child itself (`esiwrap -- python3 -m verl…`): its signal, at once."""
    driver = Driver()
    driver.hello(CHILD, stop_signal="SIGINT")
    driver.steps(1, 2, 1.0)
    out = driver.feed(core.SignalReceived("SIGTERM"))
    out += driver.save(2, 0.5)
    assert [a for a in out if isinstance(a, core.StopChild)] == [core.StopChild("SIGINT")]
    assert "first" not in logs(out, ev.CHILD_STOPPING)[0]


def test_one_process_asking_two_stop_signals_is_one_warning_and_the_latest_is_used() -> None:
    driver = Driver()
    driver.hello(DRIVER_PID, stop_signal="SIGINT")
    out = driver.hello(DRIVER_PID, stop_signal="SIGHUP")
    out += driver.hello(DRIVER_PID, stop_signal="SIGINT")
    warned = logs(out, ev.STOP_SIGNAL_NOT_HONOURED)
    assert len(warned) == 1 and warned[0]["level"] == "warning"
    assert (warned[0]["asked"], warned[0]["used"]) == (["SIGINT", "SIGHUP"], "SIGHUP")
    driver.hello(DRIVER_PID)  # a hello that names none changes nothing and says nothing
    assert driver.controller.trainers[DRIVER_PID].stop_signal == "SIGINT"


def test_a_stop_signal_asked_from_outside_the_tree_is_a_warning() -> None:
    driver = Driver()
    out = driver.feed(core.Hello(9999, stop_signal="SIGINT", descendant=False))
    assert [a for a in out if isinstance(a, core.RefuseMessage)]
    warned = logs(out, ev.STOP_SIGNAL_NOT_HONOURED)
    assert warned[0]["pid"] == 9999 and "tree" in warned[0]["reason"]


CANNOT = ("verl 0.4.1: RayPRIMETrainer.fit reports no step boundary esiwrap can use; "
          "set trainer.save_freq=N so verl saves itself")


def test_a_loop_that_cannot_save_is_one_warning_and_a_76_whose_reason_says_why() -> None:
    """The verl hook's hello for a loop it cannot save (saves: false, cannot_save): one warning at
    attach; the planned save never comes, and the miss's reason is the hook's, not a guess about a
    long step."""
    driver = Driver(ControllerConfig(stop_grace_s=10.0))
    out = driver.hello(CHILD, saves=False, stop_signal="SIGINT")  # the Ray driver's own hello
    out += driver.hello(CHILD, saves=False, cannot_save=CANNOT)  # the loop's, relayed
    out += driver.hello(CHILD, saves=False, cannot_save=CANNOT)
    warned = logs(out, ev.TRAINER_CANNOT_SAVE)
    assert [(w["level"], w["reason"]) for w in warned] == [("warning", CANNOT)]
    driver.deadline(600.0)
    driver.steps(1, 3, 1.0)
    out = driver.advance(700.0)
    missed = logs(out, ev.SAVE_MISSED)
    assert missed and missed[-1]["never_came"][0] == CANNOT
    ended = exits(out + driver.advance(60.0))
    assert [(e.code, CANNOT in e.reason) for e in ended] == [(EXIT_SAVE_MISSED, True)]


def test_a_later_hello_that_saves_takes_the_cannot_save_back() -> None:
    """The hook found a boundary after all: its hello says it saves, and a miss no longer blames it."""
    driver = Driver()
    driver.hello(CHILD, saves=False, cannot_save=CANNOT)
    driver.hello(CHILD, saves=True)
    assert driver.controller.trainers[CHILD].cannot_save is None
