"""The job's decisions, in the core: the no-progress guard before the command starts, this run's
record and how it ended, and the state the next run starts from, carried whole by `KeepState`
(the shell only writes it)."""

from __future__ import annotations

from controller_driver import CHILD, T0, Driver, exits, logs

from esiwrap.core import controller as core
from esiwrap.core.controller import Controller, ControllerConfig
from esiwrap.core.controller.job import Job
from esiwrap.core.history import HEARTBEAT_S, RunRecord
from esiwrap.core.state import JobState
from esiwrap.core.values import Checkpoint
from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_NO_PROGRESS

STATE = "/ckpt/esiwrap-state.json"


def job_of(state: JobState | None, **config: object) -> Driver:
    job = Job(state, T0, run_id="this", host="node-a", argv=["python", "train.py"],
              max_no_progress_runs=int(config.pop("limit", 3)))  # type: ignore[call-overload]
    return Driver(start=False, controller=Controller(ControllerConfig(state_file=STATE, **config), job=job))


def kept(actions: list[core.Action]) -> list[JobState]:
    return [a.state for a in actions if isinstance(a, core.KeepState)]


def stalled(n: int) -> JobState:
    """A job whose last n runs ended at their deadline without advancing past step 10."""
    runs = tuple(RunRecord(T0 - 1000.0 * (n - i), T0 - 1000.0 * (n - i) + 100.0, f"r{i}", ending="announced",
                           start_step=10, end_step=10, host="node-b") for i in range(n))
    return JobState(steps=(60.0,), saves=(60.0,), updated_at=T0 - 10.0,
                    checkpoint=Checkpoint(10, T0 - 5000.0), checkpoint_durable="completed", runs=runs)


def test_the_guard_refuses_to_start_a_job_that_made_no_progress() -> None:
    """Three runs in a row that did not advance: `no_progress` (the runs, the cause, the fix), the
    state file records this run as stopped by the guard, and exit 78 before any child starts."""
    d = job_of(stalled(3))
    out = d.feed(core.Launch())
    (event,) = logs(out, "no_progress")
    assert event["path"] == STATE and event["limit"] == 3 and len(event["runs"]) == 3
    assert "slot shorter" in event["cause"] and event["fix"]
    (state,) = kept(out)
    assert state.runs[-1].run_id == "this" and state.runs[-1].ending == "no_progress"
    assert [e.code for e in exits(out)] == [EXIT_NO_PROGRESS]
    assert d.controller.mode is core.Mode.EXITED


def test_a_job_that_progressed_or_a_guard_turned_off_starts() -> None:
    """Two stalled runs of three allowed, or the guard off (0): nothing is said, nothing decided."""
    assert job_of(stalled(2)).feed(core.Launch()) == []
    assert job_of(stalled(5), limit=0).feed(core.Launch()) == []
    assert job_of(None).feed(core.Launch()) == []


def test_the_record_is_kept_from_the_start_and_refreshed_every_heartbeat() -> None:
    """With a state file, the run's record is written as the child starts and every HEARTBEAT_S
    after (its exposure so far, should it vanish), each time alive until now."""
    d = job_of(None)
    (first,) = kept(d.feed(core.ChildStarted(CHILD, ("python", "train.py"))))
    assert first.runs[-1].seen_at == T0 and first.runs[-1].ending == "running"
    beats = kept(d.advance(2.5 * HEARTBEAT_S))
    assert [s.runs[-1].seen_at - T0 for s in beats] == [HEARTBEAT_S, 2 * HEARTBEAT_S]
    assert first.command == ("python", "train.py")


def test_without_a_state_file_nothing_is_kept_but_the_measurements() -> None:
    """No heartbeat and no record at the start: the supervisor would have nowhere to write them."""
    d = Driver()
    assert kept(d.actions) == [] and kept(d.advance(3 * HEARTBEAT_S)) == []


def test_the_runs_ending_and_its_durable_step_are_decided_at_the_exit() -> None:
    """A run resumed at step 10 that saves step 12 and is stopped by a SIGTERM 5 minutes before its
    deadline: the record ends `announced` (the deadline's reclamation), from step 10 to 12, with
    its save counted; the checkpoint is the next run's."""
    state = JobState(updated_at=T0 - 10.0, checkpoint=Checkpoint(10, T0 - 100.0),
                     checkpoint_durable="completed")
    d = job_of(state)
    d.feed(core.Launch())
    d.feed(core.ChildStarted(CHILD))
    d.deadline(300.0)
    d.hello()
    d.steps(11, 2, 1.0)
    d.save(12, 0.5)  # the trainer's own checkpoint
    d.feed(core.SignalReceived("SIGTERM"))  # the latest step is saved: the stop begins
    d.feed(core.ChildExited(CHILD, 0))
    out = d.feed(core.TreeChecked(0))
    assert [e.code for e in exits(out)] == [EXIT_CHECKPOINTED]
    last = kept(out)[-1]
    run = last.runs[-1]
    assert (run.ending, run.start_step, run.end_step, run.saves) == ("announced", 10, 12, 1)
    assert last.checkpoint is not None and last.checkpoint.step == 12
