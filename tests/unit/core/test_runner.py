"""The runner: one order for every world that drives the decision core, and one table from each
action to its effect."""

from __future__ import annotations

import typing

import pytest
from controller_driver import CHILD, Driver, Recording, logs

from esiwrap.core import controller as core
from esiwrap.core.controller import Controller, ControllerConfig
from esiwrap.core.effects import EFFECTS, Effects, carry_out
from esiwrap.core.policy import PolicyConfig
from esiwrap.core.runner import Runner


def test_every_action_has_its_effect_and_every_effect_its_action() -> None:
    """The table names one `Effects` method for each action of the controller's `Action` union, and
    each abstract method of `Effects` is some action's: a new action without its effect fails here."""
    actions = set(typing.get_args(core.Action))
    assert set(EFFECTS) == actions
    assert set(EFFECTS.values()) == Effects.__abstractmethods__
    assert len(set(EFFECTS.values())) == len(EFFECTS)


def test_a_world_that_leaves_out_an_effect_cannot_be_made() -> None:
    """Every world implements every effect (the supervisor, the simulator, the tests' record)."""
    class Partial(Effects):
        def log(self, action: core.Log) -> None:
            pass

    with pytest.raises(TypeError, match="abstract"):
        Partial()  # type: ignore[abstract]


def test_anything_but_an_action_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match="not an action"):
        carry_out(Recording(), "SendSignal")  # type: ignore[arg-type]


class Following(Recording):
    """A world whose upload starts at once: the input that follows is fed from inside the effect."""

    def __init__(self) -> None:
        super().__init__()
        self.runner: Runner | None = None

    def start_upload(self, action: core.StartUpload) -> None:
        self.actions.append(action)
        assert self.runner is not None
        self.runner.feed(core.UploadStarted(9999))
        self.actions.append("after the feed")  # type: ignore[arg-type]


def test_an_input_that_follows_an_action_waits_for_the_actions_at_hand() -> None:
    """What an effect feeds (an upload started) is applied after every action of the batch it came
    from, in order: nothing is applied inside another input's actions."""
    world = Following()
    clock = Driver(start=False)
    runner = Runner(Controller(ControllerConfig(policy=PolicyConfig(uploads=True))), world, lambda: clock.now)
    world.runner = runner
    runner.feed(core.ChildStarted(CHILD))
    runner.feed(core.Hello(CHILD))
    runner.feed(core.SaveBegin(CHILD, 5))
    runner.feed(core.SaveEnd(CHILD, 5, duration_s=1.0, path="/ckpt/5"))  # the trainer's own save
    kinds = [type(a).__name__ if not isinstance(a, str) else a for a in world.actions]
    start = kinds.index("StartUpload")
    assert kinds[start + 1] == "after the feed"
    batch_end = kinds.index("KeepState", start)  # the same batch's last action...
    started = [i for i, a in enumerate(world.actions)
               if isinstance(a, core.Log) and a.event == "upload_started"]
    assert started and started[0] > batch_end  # ...comes before what the upload's start brought


def test_an_effect_that_raises_ends_the_drive_and_drops_what_waited() -> None:
    """The supervisor leaves its loop by raising from the `exit` effect: what was waiting is not
    applied after it, and the runner can still finish (the job's state, once more)."""
    class Leaving(Recording):
        def exit(self, action: core.Exit) -> None:
            self.actions.append(action)
            raise SystemExit(action.code)

    world = Leaving()
    clock = Driver(start=False)
    runner = Runner(Controller(ControllerConfig()), world, lambda: clock.now)
    runner.feed(core.ChildStarted(CHILD))
    with pytest.raises(SystemExit):
        runner.feed(core.ChildExited(CHILD, 0))
        runner.feed(core.TreeChecked(0))  # the tree is gone: the exit follows
        runner.wake()
    exited = [a for a in world.actions if isinstance(a, core.Exit)]
    assert [e.code for e in exited] == [0]
    runner.feed(core.SignalReceived("SIGHUP"))  # still usable after the drive ended
    runner.finish()


def test_each_feed_of_the_driver_is_one_wake_up() -> None:
    """The tests' driver feeds an input and fires the timers that fell due, as one wake-up of the
    supervisor's loop: a deadline already passed is acted on within the same feed."""
    d = Driver()
    d.hello()
    out = d.deadline(-1.0)
    assert logs(out, "deadline_too_close")
