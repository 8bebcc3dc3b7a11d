"""The decision core's own rules, apart from any run: the one transition table, the named timers'
firing order, and what each part reports upward."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esiwrap.core.controller import TRANSITIONS, IllegalMove, Mode
from esiwrap.core.controller.modes import STAY, Cause, Modes
from esiwrap.core.controller.outbox import Outbox
from esiwrap.core.controller.protocol import Now
from esiwrap.core.controller.saves import SaveCycle
from esiwrap.core.controller.timers import FIRING_ORDER, Timer, first_due, wait_s
from esiwrap.core.controller.uploads import upload_retry_wait_s
from esiwrap.core.policy import Observations

CAUSES = sorted({cause for moves in TRANSITIONS.values() for cause in moves})


def test_every_mode_is_in_the_table_and_every_move_lands_on_a_mode() -> None:
    """The table names every mode once; `exited` is the last (nothing moves it), reached from a
    stop's modes, or before the command starts (the no-progress guard, a restore that failed);
    once stopping, never back to training; the launch (starting) leads to training or the exit."""
    assert set(TRANSITIONS) == set(Mode)
    assert all(target is STAY for target in TRANSITIONS[Mode.EXITED].values())
    stopping = {Mode.STOPPING, Mode.KILLING, Mode.VERIFYING, Mode.UPLOADING, Mode.EXITED}
    assert {mode for mode, moves in TRANSITIONS.items() if Mode.EXITED in moves.values()} == \
        stopping - {Mode.EXITED} | {Mode.STARTING}
    assert TRANSITIONS[Mode.RUNNING]["launch"] is Mode.STARTING
    assert TRANSITIONS[Mode.STARTING]["not started"] is Mode.EXITED
    assert {t for t in TRANSITIONS[Mode.STARTING].values() if t is not STAY} == {Mode.RUNNING, Mode.EXITED}
    for mode in stopping:
        assert {target for target in TRANSITIONS[mode].values() if target is not STAY} <= stopping


def test_a_move_the_table_does_not_list_is_refused_and_a_stay_moves_nothing() -> None:
    """IllegalMove, and the mode stays as it was; a listed stay is not a move (False)."""
    modes = Modes()
    with pytest.raises(IllegalMove, match="no move from running on 'kill'"):
        modes.move("kill")
    assert modes.mode is Mode.RUNNING
    assert modes.move("acknowledged") is False and modes.mode is Mode.RUNNING
    assert modes.move("stop") is True and modes.mode is Mode.STOPPING
    with pytest.raises(IllegalMove):
        modes.move("drain")


@given(st.lists(st.sampled_from(CAUSES), max_size=30))
def test_moves_follow_the_table_whatever_is_asked(causes: list[Cause]) -> None:
    """Any sequence of causes: each is the table's move, its stay, or refused; nothing else."""
    modes = Modes()
    for cause in causes:
        before = modes.mode
        expected = TRANSITIONS[before].get(cause)
        if expected is None:
            with pytest.raises(IllegalMove):
                modes.move(cause)
            assert modes.mode is before
        elif expected is STAY:
            assert modes.move(cause) is False and modes.mode is before
        else:
            assert modes.move(cause) is True and modes.mode is expected


def test_the_first_due_timer_in_the_firing_order_fires() -> None:
    """Of several due timers, the one declared first fires; one not yet due never does; the wait is
    to the earliest timer on its own clock, never negative."""
    now = Now(wall=1000.0, mono=50.0)
    timers = [Timer("save signal", "wall", 990.0), Timer("deadline", "wall", 1000.0),
              Timer("upload retry", "mono", 60.0)]
    assert first_due(timers, now) == Timer("deadline", "wall", 1000.0)
    assert wait_s(timers, now) == 0.0
    later = [Timer("stop", "mono", 55.0), Timer("deadline", "wall", 1003.0)]
    assert first_due(later, now) is None
    assert wait_s(later, now) == pytest.approx(3.0)
    assert wait_s([], now) is None and first_due([], now) is None
    assert len(set(FIRING_ORDER)) == len(FIRING_ORDER)


def test_the_save_cycle_is_acknowledged_only_by_every_saver() -> None:
    """A save asked for is acknowledged once every saving process reported its end; with no saver
    left, any end does."""
    from esiwrap.core.controller.protocol import SaveEnd

    cycle = SaveCycle(Outbox(), Observations(8))
    now = Now(100.0, 10.0)
    cycle.ask("deadline", now)
    assert not cycle.ended(SaveEnd(1, 5, duration_s=2.0), savers={1, 2})
    assert cycle.ended(SaveEnd(2, 5, duration_s=3.0), savers={1, 2})
    request, step, messages = cycle.acknowledge(Now(103.0, 13.0))
    assert (request.kind, step, len(messages)) == ("deadline", 5, 2) and cycle.request is None
    cycle.ask("manual", now)
    assert cycle.ended(SaveEnd(7, 6), savers=set())


def test_upload_retries_back_off_to_a_ceiling() -> None:
    """5 s, 30 s, then doubling up to five minutes."""
    assert [upload_retry_wait_s(n) for n in range(1, 8)] == [5.0, 30.0, 60.0, 120.0, 240.0, 300.0, 300.0]
