"""esiwrap as PID 1 of a container (`ENTRYPOINT ["esiwrap", "--", ...]`): a PID namespace of its
own (`unshare --pid --fork --mount-proc`), signals sent from outside as a container runtime does
(`docker stop`: SIGTERM to PID 1), orphans reaped. As PID 1, the kernel drops every signal
esiwrap has no handler for; esiwrap handles, and forwards, them all."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from esiwrap_harness import CHILDREN, PYTHON, TINY_TRAINER, EsiwrapRun
from pid_namespace import AS_PID_1, pid_1_on_the_host

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.signals import signal_label

pytestmark = pytest.mark.system

SENT = (signal.SIGHUP, signal.SIGPWR, signal.SIGALRM, signal.SIGWINCH, signal.SIGUSR2,
        signal.SIGRTMIN + 3)


@pytest.fixture
def container() -> Iterator[list[EsiwrapRun]]:
    runs: list[EsiwrapRun] = []
    yield runs
    for run in runs:
        run.kill()


def test_pid_1_forwards_signals_from_outside(container: list[EsiwrapRun]) -> None:
    """Signals a runtime or a person sends to the container's PID 1 reach the command."""
    run = EsiwrapRun(["--", PYTHON, str(CHILDREN / "signal_recorder.py"), *(str(int(s)) for s in SENT)],
                     launcher=AS_PID_1)
    container.append(run)
    run.wait_stdout("ready", 30)
    run.wait_event("child_started", 30)
    pid_1 = pid_1_on_the_host(run)
    namespaced = next(line for line in Path(f"/proc/{pid_1}/status").read_text().splitlines()
                      if line.startswith("NSpid:"))
    assert namespaced.split()[-1] == "1"  # esiwrap is PID 1 in its namespace
    for signum in SENT:
        psutil.Process(pid_1).send_signal(signum)
        run.wait_stdout(f"got {signal_label(signum)}\n", 30)
    psutil.Process(pid_1).send_signal(signal.SIGTERM)  # nothing attached to save: a plain stop
    assert run.finish(30) == 128 + signal.SIGTERM
    assert run.first("child_exited")["signal"] == "SIGTERM"


def test_docker_stop_is_a_checkpoint(container: list[EsiwrapRun], tmp_path: Path) -> None:
    """`docker stop` (SIGTERM to PID 1) with a trainer attached: a checkpoint, then exit 75, well
    inside docker's default 10 s."""
    run = EsiwrapRun(["--log-level", "debug", "--", PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(tmp_path),
                      "--step-seconds", "0.1"],
                     launcher=AS_PID_1)
    container.append(run)
    run.wait_event("trainer_attached", 60)
    run.wait_event("step_observed", 30)
    psutil.Process(pid_1_on_the_host(run)).send_signal(signal.SIGTERM)
    assert run.finish(30) == EXIT_CHECKPOINTED
    saved = run.first("save_completed")
    assert saved["kind"] == "sigterm"
    stop_took_s = _at(run.first("supervisor_exit")) - _at(run.first("save_requested"))
    assert stop_took_s < 10
    assert (tmp_path / "latest.pt").exists()


def test_pid_1_reaps_orphans(container: list[EsiwrapRun]) -> None:
    """Orphans of the command are adopted by PID 1 (esiwrap) and reaped, not left as zombies."""
    run = EsiwrapRun(["--", PYTHON, str(CHILDREN / "orphan_maker.py")], launcher=AS_PID_1)
    container.append(run)
    assert run.finish(60) == 0, run.stdout
    assert "pid1=True" in run.stdout.decode() and "reaped=True" in run.stdout.decode()


def _at(event: dict[str, object]) -> float:
    from esiwrap.times import iso_epoch

    return iso_epoch(str(event["timestamp"]))


def test_a_declared_stop_budget_that_cannot_hold_a_checkpoint_is_warned(container: list[EsiwrapRun],
                                                                         tmp_path: Path) -> None:
    """`--stop-budget 10` (docker stop) with the default --stop-grace 30: the warning names the
    value to raise, at the start; the run itself is unaffected."""
    run = EsiwrapRun(["--stop-budget", "10", "--save-duration", "4", "--", PYTHON, str(TINY_TRAINER),
                      "--ckpt-dir", str(tmp_path), "--step-seconds", "0.1"], launcher=AS_PID_1)
    container.append(run)
    warned = run.wait_event("stop_budget_too_small", 60)
    assert warned["budget_s"] == 10.0 and warned["needed_s"] >= 4.0 + 30.0
    assert "at least" in warned["fix"] and "--stop-grace" in warned["fix"]
    psutil.Process(pid_1_on_the_host(run)).send_signal(signal.SIGTERM)
    assert run.finish(30) == EXIT_CHECKPOINTED
