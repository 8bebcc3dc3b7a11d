"""Every catchable signal esiwrap does not use itself reaches the child (like tini and dumb-init),
one real esiwrap and one real child for all of them; the ones esiwrap keeps are listed in
esiwrap.signals with the reason, and none of them ends the run."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from esiwrap_harness import CHILDREN, PYTHON, EsiwrapRun

from esiwrap.shell.early import HANDLED as CAUGHT_AT_START
from esiwrap.signals import FORWARDED, HANDLED, NOT_FORWARDED, USED, signal_label

RECORDER = CHILDREN / "signal_recorder.py"


@pytest.fixture(scope="module")
def recorded() -> Iterator[EsiwrapRun]:
    """One esiwrap whose child handles (and echoes) every signal esiwrap forwards."""
    run = EsiwrapRun(["--", PYTHON, str(RECORDER), *(str(s) for s in FORWARDED)])
    try:
        run.wait_stdout("ready", 30)
        yield run
    finally:
        run.kill()


def test_the_signals_caught_at_start_are_the_one_list() -> None:
    """early.py, which catches esiwrap's signals first thing, takes HANDLED from esiwrap.signals
    (one home)."""
    assert CAUGHT_AT_START is HANDLED


def test_every_catchable_signal_is_either_forwarded_or_listed_as_kept() -> None:
    """Nothing falls between the lists: forwarded, or not forwarded for a reason in signals.py."""
    valid = {int(s) for s in signal.valid_signals()}
    assert set(FORWARDED) | (NOT_FORWARDED & valid) == valid
    assert not set(FORWARDED) & NOT_FORWARDED
    assert {signal.SIGALRM, signal.SIGPWR, signal.SIGHUP, signal.SIGWINCH, signal.SIGTSTP,
            signal.SIGRTMIN, signal.SIGRTMAX} <= set(FORWARDED)
    assert set(USED) <= set(HANDLED) and signal.SIGPIPE not in HANDLED


@pytest.mark.system
@pytest.mark.parametrize("signum", FORWARDED, ids=signal_label)
def test_signal_reaches_the_child(recorded: EsiwrapRun, signum: int) -> None:
    """`kill -<SIG> esiwrap`: the child gets it, esiwrap goes on (SIGALRM and SIGPWR used to
    end esiwrap with 142/158 and the run with it)."""
    recorded.signal(signum)
    recorded.wait_stdout(f"got {signal_label(signum)}\n", 30)
    assert recorded.proc.poll() is None, f"esiwrap ended on {signal_label(signum)}"


@pytest.mark.system
def test_own_io_error_signals_are_not_forwarded(recorded: EsiwrapRun) -> None:
    """SIGPIPE to esiwrap is ignored (its own closed pipe must not kill the child); a forwarded
    signal sent after it arrives alone."""
    before = recorded.stdout.count(b"got SIGHUP\n")
    recorded.signal(signal.SIGPIPE)
    recorded.signal(signal.SIGHUP)
    recorded.wait_stdout("got SIGHUP\n", 30, count=before + 1)
    assert "SIGPIPE" not in recorded.stdout.decode() and recorded.proc.poll() is None


@pytest.mark.system
def test_the_run_ends_normally_after_all_that(recorded: EsiwrapRun) -> None:
    """After all that, SIGTERM still stops the run the usual way: nothing attached to save, so
    the child gets the stop signal and dies of it (143); esiwrap never failed."""
    os.kill(recorded.pid, signal.SIGTERM)
    assert recorded.finish(30) == 128 + signal.SIGTERM
    assert "supervisor_failed" not in recorded.names()
