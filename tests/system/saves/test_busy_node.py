"""A real run's own lateness and the reason of an exit 76 (issue 24), with a real trainer process.

The trainer library stamps every message with its monotonic clock; esiwrap logs how late each
step report came (`step_observed.delivery_s`), how late its timers woke (`supervisor_exit`'s
`lateness`), and, when no checkpoint came, why (`save_missed.never_came`).
"""

from __future__ import annotations

import sys

from esiwrap_harness import EsiwrapRun

from esiwrap.errors import EXIT_SAVE_MISSED

STEPS_WITHOUT_SAVING = """\
import time
import esiwrap.trainer as esi
esi.install()
for step in range(1, 10_000):
    time.sleep(0.2)
    esi.step_done(step)  # never looks at esi.save_requested()
"""


def test_an_exit_76_names_what_never_came_and_the_runs_lateness(esiwrap) -> None:
    """A trainer that reports steps and never saves: exit 76, and the log says the signal went out
    and the trainer stepped on without a save_begin; the report delays are measured."""
    run: EsiwrapRun = esiwrap("--deadline", "+8s", "--redundant-time", "3", "--save-duration", "0.5",
                              "--stop-grace", "2", "--log-level", "debug", "--",
                              sys.executable, "-c", STEPS_WITHOUT_SAVING)
    assert run.finish(60) == EXIT_SAVE_MISSED
    (missed,) = [e for e in run.events if e["event"] == "save_missed"]
    assert missed["never_came"][0].startswith("no save_begin: the trainer reported")
    assert missed["signal"]["pids"] and missed["signal"]["step_reports_since"] >= 1
    assert missed["last_plan"]["kind"] == "insurance"
    exit_ = run.first("supervisor_exit")
    assert "no save_begin" in exit_["reason"]
    delays = [e["delivery_s"] for e in run.events if e["event"] == "step_observed"]
    assert delays and all(0 <= d < 60 for d in delays)
    reports = exit_["lateness"]["reports"]
    assert reports["max_s"] == max(delays) or abs(reports["max_s"] - max(delays)) < 1e-3
    assert exit_["lateness"]["timers"]["max_s"] is not None
    requested = run.first("save_requested")
    assert "late_s" in requested and requested["late_s"] >= 0


def test_a_disk_too_busy_to_write_a_small_file_never_holds_up_the_save(esiwrap, tmp_path_factory) -> None:
    """The status and state files on a disk where every write, rename and fsync waits 2 s (a
    checkpoint's writeback in front of it): the loop hands them to its writer's thread and goes
    on, so the save is asked for, acknowledged and followed by the stop in time (exit 75), and the
    state file is there afterwards. A loop that wrote them itself stood still for seconds at every
    change of its status. The filesystem itself answered every operation (its daemon's stderr
    has no traceback: one that failed left a close unanswered, and esiwrap unable to exit)."""
    import slowfs
    from esiwrap_harness import CHILDREN, event_time

    from esiwrap.errors import EXIT_CHECKPOINTED

    # a trainer that starts in milliseconds (no torch import): what is timed is esiwrap's loop
    trainer = [sys.executable, str(CHILDREN / "sleep_trainer.py"), "0.2", "0.1"]
    with slowfs.mounted(tmp_path_factory.mktemp("busy"), 50e6, latency_s=2.0) as busy:
        run: EsiwrapRun = esiwrap(
            "--deadline", "+25s", "--redundant-time", "4", "--save-duration", "0.5", "--final-margin", "1",
            "--stop-grace", "3", "--status-file", str(busy / "status.json"),
            "--state-file", str(busy / "state.json"), "--", *trainer)
        code = run.finish(90)
        story = [(e["event"], e.get("kind"), e.get("reason")) for e in run.events]
        assert code == EXIT_CHECKPOINTED, story
        deadline = event_time(run.first("deadline_resolved")) + run.first("deadline_resolved")["remaining_s"]
        saved = [e for e in run.events if e["event"] == "save_completed"]
        assert saved and event_time(saved[-1]) < deadline
        assert event_time(run.first("supervisor_exit")) < deadline
        assert '"checkpoint"' in (busy / "state.json").read_text()
    assert "Traceback" not in (busy.parent / "slowfs.err").read_text()


HELD_UP_AT_THE_SAVE = """\
import os, signal, sys, time
import esiwrap.trainer as esi

def stopped(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")

esi.install()
supervisor, held = os.getppid(), False
for step in range(1, 10_000):
    time.sleep(0.2)
    if esi.save_requested() and not held:
        # from here on the supervisor's loop is held up (a disk write, a starved or frozen CPU)
        held = True
        os.kill(supervisor, signal.SIGSTOP)
        for _ in range(500):
            if stopped(supervisor):
                break
            time.sleep(0.01)
    esi.step_done(step)
    if esi.save_requested():
        with esi.saving(step):
            time.sleep(0.3)
        print(f"saved step {step} at {time.time():.3f}", flush=True)
"""


def test_a_save_acknowledged_before_the_deadline_counts_when_the_loop_hears_it_late(esiwrap) -> None:
    """The exit 76 of a loaded full-suite run (issue 24), reproduced: the trainer reports its step
    boundary, saves and acknowledges well before the deadline, while esiwrap's loop is held up (then
    by its own status-file write on a busy disk; here SIGSTOP, until the deadline has passed). When
    the loop runs again, the step report, save_begin and save_end wait together in the channel:
    each is applied before the deadline's timer fires, so the checkpoint counts (exit 75). Before,
    the first of them fired the deadline timer, and the run ended in exit 76 with the trainer's
    save_end read a millisecond later."""
    import os
    import signal
    import time

    from esiwrap_harness import wait_until

    from esiwrap.errors import EXIT_CHECKPOINTED

    deadline = time.time() + 30.0  # the save is asked for about 7 s in: time for a slow start
    run: EsiwrapRun = esiwrap("--deadline", f"{deadline:.3f}", "--redundant-time", "20", "--save-duration",
                              "0.5", "--log-level", "debug", "--", sys.executable, "-c", HELD_UP_AT_THE_SAVE)
    saved_at = float(run.wait_stdout("saved step", timeout=60).split("saved step", 1)[1].split()[2])
    assert saved_at < deadline - 1.0, "the trainer saved too late for this test (a very slow start?)"
    # while esiwrap is stopped, the deadline passes (a condition on the clock, not a guess at a sleep)
    assert wait_until(lambda: time.time() > deadline + 1.0, timeout=deadline + 5.0 - time.time())
    os.kill(run.pid, signal.SIGCONT)
    code = run.finish(60)
    story = [(e["event"], e.get("step"), e.get("kind"), e.get("reason")) for e in run.events
             if e["event"] != "step_observed"]
    assert code == EXIT_CHECKPOINTED, story
    assert [e["kind"] for e in run.events if e["event"] == "save_completed"] == ["insurance"]
    assert "save_missed" not in run.names()
