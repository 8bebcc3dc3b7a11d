"""A fair start for a slow trainer, with real processes: under a 40 s deadline, a trainer that takes
12 s to start (as torch's import does) still attaches and saves (exit 75); one that never calls
`install()` gets a 76 that says exactly that."""

from __future__ import annotations

from pathlib import Path

import pytest
from esiwrap_harness import PLAIN_TRAINER, PYTHON, EsiwrapRun

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


def run(tmp: Path, *trainer: str) -> EsiwrapRun:
    """The defaults but for the deadline: --stop-grace 30 would leave a 40 s run 10 s to attach."""
    started = EsiwrapRun(["--deadline", "+40s", "--status-file", "none", "--no-probe-storage", "--",
                          PYTHON, str(PLAIN_TRAINER), "--ckpt", str(tmp / "ckpt.json"), *trainer])
    try:
        started.finish(timeout=120)
    finally:
        started.kill()
    return started


def test_a_trainer_that_takes_12s_to_start_saves_under_a_40s_deadline(tmp_path: Path) -> None:
    done = run(tmp_path, "--start-delay", "12")
    assert done.proc.returncode == EXIT_CHECKPOINTED, done.story()
    assert done.first("save_requested")["attach_by"]  # the window it had, said at once
    assert "no_trainer_attached" not in done.names()
    assert (tmp_path / "ckpt.json").exists()


def test_a_trainer_that_never_calls_install_gets_a_76_that_says_so(tmp_path: Path) -> None:
    done = run(tmp_path, "--no-install", "--step-seconds", "0.5")
    assert done.proc.returncode == EXIT_SAVE_MISSED, done.story()
    (exit_line,) = [e for e in done.events if e["event"] == "supervisor_exit"]
    assert "install() was never called" in exit_line["reason"]
    (nobody,) = [e for e in done.events if e["event"] == "no_trainer_attached"]
    assert nobody["action"] == "stop"
