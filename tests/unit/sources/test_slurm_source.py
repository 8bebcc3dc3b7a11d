"""The `slurm` source and the requeue, against stand-in `squeue`/`scontrol` scripts on PATH for
the ways Slurm's clients fail (garbage, a hang, a missing command, a controller that is down).
The happy path, a moved TimeLimit and a real requeue run on a real Slurm: test_slurm_real.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from controller_driver import CHILD, Driver, signals
from esiwrap_harness import PYTHON, TINY_TRAINER, EsiwrapRun

from esiwrap import events as ev
from esiwrap.core import controller as core
from esiwrap.core.controller.protocol import LAUNCHER_EXIT_S
from esiwrap.envvars import TRAINER_SIGTERM_ENV
from esiwrap.sources import slurm
from esiwrap.sources.chain import ask
from esiwrap.sources.registry import DEFAULT_SOURCES, build_sources, source_values
from esiwrap.sources.slurm import SlurmSource, parse_end_time, requeue, requeue_refusal

NOW = 1_800_000_000.0
END = 1_800_000_600


def fake_command(bin_dir: Path, name: str, body: str) -> Path:
    """An executable `name` in `bin_dir` that records its argv and SLURM_TIME_FORMAT (one JSON
    line per call in `name`.calls), then runs the shell `body`."""
    bin_dir.mkdir(exist_ok=True)
    calls = bin_dir / f"{name}.calls"
    script = bin_dir / name
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        {PYTHON} -c 'import json, os, sys; print(json.dumps({{"argv": sys.argv[1:],
            "fmt": os.environ.get("SLURM_TIME_FORMAT")}}))' "$@" >> {calls}
        {body}
        """), encoding="utf-8")
    script.chmod(0o755)
    return calls


def calls(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def job_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "12", **extra}


# ---------------------------------------------------------------------------------- off Slurm
@pytest.mark.system
def test_outside_a_slurm_job_a_run_does_not_start_the_source() -> None:
    """No SLURM_JOB_ID: the default list builds no slurm source (no thread, no log line, and
    nothing that could run squeue is loaded); `esiwrap deadline` (explain) still says why."""
    code = (
        "import sys\n"
        "from esiwrap.sources.registry import DEFAULT_SOURCES, build_sources\n"
        "from esiwrap.sources.registry import source_values\n"
        "names = [s.name for s in build_sources(DEFAULT_SOURCES, source_values(), {}, 0.0)]\n"
        "print(names, 'subprocess' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['env:MLP', 'env:SAGEMAKER', 'volcengine', 'volcengine-spot'] False"
    explained = build_sources(["slurm"], source_values(), {}, NOW, explain=True)
    answer = ask(explained[0], NOW)
    assert answer.reason == "not in a Slurm job (SLURM_JOB_ID is not set)" and answer.expected
    assert explained[0].period_s is None  # nothing to ask again
    assert "slurm" in DEFAULT_SOURCES


@pytest.mark.system
def test_esiwrap_deadline_lists_the_slurm_source_outside_slurm() -> None:
    """`esiwrap deadline --json --sources slurm` off Slurm: one unavailable line with the reason."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run([sys.executable, "-m", "esiwrap", "deadline", "--json", "--sources", "slurm"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 3
    report = json.loads(out.stdout)
    assert report["sources"] == [{"source": "slurm", "ok": False,
                                  "reason": "not in a Slurm job (SLURM_JOB_ID is not set)"}]


# ---------------------------------------------------------------------------------- answers
@pytest.mark.system
def test_the_end_time_comes_from_squeue_in_epoch_seconds(tmp_path: Path) -> None:
    """squeue -h -j <job> -o %e with SLURM_TIME_FORMAT=%s; the deadline is that end, reserved
    capacity, with the job in the detail."""
    recorded = fake_command(tmp_path, "squeue", f"echo RUNNING {END}")
    source = SlurmSource(job_env(tmp_path, SLURM_RESTART_COUNT="2"))
    answer = ask(source, NOW)
    assert answer.deadline is not None and answer.deadline.at == END
    assert answer.capacity == "reserved" and answer.deadline.capacity == "reserved"
    assert answer.deadline.raw == str(END)
    assert answer.deadline.detail == {"job": "12", "via": "squeue", "restart_count": "2"}
    assert calls(recorded) == [{"argv": ["-h", "-j", "12", "-o", "%T %e"], "fmt": "%s"}]


@pytest.mark.system
def test_an_array_task_is_asked_for_as_array_job_underscore_task(tmp_path: Path) -> None:
    """In an array, SLURM_JOB_ID of one task can equal the array's own id, which names every task:
    the source asks for <array job id>_<task id>."""
    recorded = fake_command(tmp_path, "squeue", f"echo RUNNING {END}")
    env = job_env(tmp_path, SLURM_JOB_ID="40", SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID="7")
    answer = ask(SlurmSource(env), NOW)
    assert answer.deadline is not None and answer.deadline.detail["job"] == "40_7"
    assert calls(recorded)[0]["argv"] == ["-h", "-j", "40_7", "-o", "%T %e"]


@pytest.mark.system
def test_slurm_job_end_time_answers_first_without_a_subprocess_then_squeue(tmp_path: Path) -> None:
    """Slurm 23.02+ exports the end known at launch: the first answer needs no squeue; later ones
    ask squeue, which follows a TimeLimit update."""
    recorded = fake_command(tmp_path, "squeue", f"echo RUNNING {END + 60}")
    source = SlurmSource(job_env(tmp_path, SLURM_JOB_END_TIME=str(END)))
    first = ask(source, NOW)
    assert first.deadline is not None and first.deadline.at == END
    assert first.deadline.detail["via"] == "SLURM_JOB_END_TIME"
    assert calls(recorded) == []
    second = ask(source, NOW + 60)
    assert second.deadline is not None and second.deadline.at == END + 60
    assert second.deadline.detail["via"] == "squeue"


@pytest.mark.system
def test_a_garbled_slurm_job_end_time_falls_back_to_squeue(tmp_path: Path) -> None:
    fake_command(tmp_path, "squeue", f"echo RUNNING {END}")
    answer = ask(SlurmSource(job_env(tmp_path, SLURM_JOB_END_TIME="soon")), NOW)
    assert answer.deadline is not None and answer.deadline.detail["via"] == "squeue"


@pytest.mark.parametrize(("printed", "reason", "expected"), [
    ("NONE", "job 12 has no time limit (squeue: NONE): there is no end to plan for", True),
    ("N/A", "job 12 has no end time yet (squeue: N/A)", False),
    ("", "squeue does not know job 12 (it has ended, or belongs to another cluster)", False),
    ("2026-12-01T10:20:38", "squeue's end time for job 12 is '2026-12-01T10:20:38', not epoch seconds "
     "(SLURM_TIME_FORMAT=%s was ignored: a wrapper around squeue?)", False),
    ("99999999999999", "squeue's end time for job 12 '99999999999999' is implausible: epoch 1e+14 "
     "(beyond the year 9999) is more than 10 years ahead", False),
])
def test_what_squeue_prints_instead_of_an_end(printed: str, reason: str, expected: bool) -> None:
    """Each answer without a usable end is a reason a person can act on."""
    with pytest.raises(slurm.SourceUnavailable) as caught:
        parse_end_time(f"RUNNING {printed}\n" if printed else "\n", "12", NOW)
    assert str(caught.value) == reason and caught.value.expected is expected


def test_two_lines_for_one_job_are_refused() -> None:
    with pytest.raises(slurm.SourceUnavailable, match="answered 2 lines for job 12"):
        parse_end_time(f"RUNNING {END}\nRUNNING {END}\n", "12", NOW)


def test_a_job_slurm_is_ending_has_no_new_end() -> None:
    """After scancel or at the time limit squeue's end is the moment the end began, not a
    deadline (SIGKILL follows KillWait later): the deadline known before stands."""
    with pytest.raises(slurm.SourceUnavailable, match="job 12 is COMPLETING, not running"):
        parse_end_time(f"COMPLETING {int(NOW)}\n", "12", NOW)


FailingSetup = Callable[[Path], None]


@pytest.mark.system
@pytest.mark.parametrize(("setup", "reason"), [
    (lambda d: fake_command(d, "squeue", "echo 'slurm_load_jobs error: Unable to contact slurm controller "
                                         "(connect failure)' >&2; exit 1"),
     "squeue -h -j 12 -o %T %e failed: slurm_load_jobs error: Unable to contact slurm controller "
     "(connect failure)"),
    (lambda d: fake_command(d, "squeue", "echo 'slurm_load_jobs error: Invalid job id specified' >&2"),
     "squeue -h -j 12 -o %T %e failed: slurm_load_jobs error: Invalid job id specified"),
    (lambda d: d.mkdir(), "squeue is not on PATH (SLURM_JOB_ID is set, but Slurm's client commands "
                          "are missing)"),
    (lambda d: fake_command(d, "squeue", "exec /bin/sleep 300"),
     "squeue -h -j 12 -o %T %e did not answer within 0.5s; is slurmctld up? (scontrol ping)"),
], ids=["controller down", "error with exit 0", "squeue missing", "hang"])
def test_failures_are_reasons_never_exceptions(tmp_path: Path, setup: FailingSetup, reason: str) -> None:
    """A controller that is down, an error on stderr (whatever the exit status says: the
    supervisor's reaper may take it), no squeue at all, a squeue that hangs (bounded)."""
    bin_dir = tmp_path / "bin"
    setup(bin_dir)
    source = SlurmSource({"PATH": str(bin_dir), "SLURM_JOB_ID": "12"}, timeout_s=0.5)
    started = time.monotonic()
    answer = ask(source, NOW)
    assert time.monotonic() - started < 60  # the hang is cut at 0.5 s, not left for its 300 s
    assert answer.deadline is None and answer.reason == reason and not answer.expected


def test_a_job_id_that_is_not_one_is_the_reason() -> None:
    answer = ask(SlurmSource({"SLURM_JOB_ID": "12; rm -rf /"}), NOW)
    assert answer.reason == "SLURM_JOB_ID='12; rm -rf /' is not a Slurm job id (digits)"


def test_the_source_is_asked_again_at_most_a_minute_apart() -> None:
    """A TimeLimit update must reach the plan soon: --refresh, but at most SLURM_REFRESH_S."""
    assert SlurmSource({"SLURM_JOB_ID": "12"}, refresh_s=300).period_s == slurm.SLURM_REFRESH_S == 60
    assert SlurmSource({"SLURM_JOB_ID": "12"}, refresh_s=5).period_s == 5


# ---------------------------------------------------------------------------------- requeue
@pytest.mark.parametrize(("state", "reason", "procid", "refused"), [
    ("RUNNING", "None", "", False),
    ("RUNNING", "None", "0", False),
    ("COMPLETING", "TimeLimit", "", False),
    ("COMPLETING", "None", "", True),  # scancel, or an admin's requeue
    ("PREEMPTED", "None", "", True),
    ("RUNNING", "None", "1", True),  # srun esiwrap ...: task 0 requeues
])
def test_who_requeues(state: str, reason: str, procid: str, refused: bool) -> None:
    """Requeued while running or ending on the time limit; never a job someone else is ending."""
    assert (requeue_refusal(state, reason, procid) is not None) is refused


@pytest.mark.system
def test_requeue_runs_scontrol_for_the_array_task(tmp_path: Path) -> None:
    squeue_calls = fake_command(tmp_path, "squeue", "echo 'RUNNING|None'")
    scontrol_calls = fake_command(tmp_path, "scontrol", "true")
    env = job_env(tmp_path, SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID="7", SLURM_RESTART_COUNT="1")
    assert requeue(env) == ("info", ev.SLURM_REQUEUED,
                            {"job": "40_7", "state": "RUNNING", "restart_count": 2})
    assert calls(squeue_calls)[0]["argv"] == ["-h", "-j", "40_7", "-o", "%T|%r"]
    assert calls(scontrol_calls)[0]["argv"] == ["requeue", "40_7"]


@pytest.mark.system
def test_a_requeue_slurm_refuses_says_what_to_change(tmp_path: Path) -> None:
    fake_command(tmp_path, "squeue", "echo 'RUNNING|None'")
    refused = "echo 'Requested operation is presently disabled for job 12' >&2; exit 1"
    fake_command(tmp_path, "scontrol", refused)
    level, event, fields = requeue(job_env(tmp_path))
    assert (level, event) == ("warning", ev.SLURM_REQUEUE_FAILED)
    assert fields == {"job": "12", "reason": "scontrol requeue 12 failed: Requested operation is presently "
                      "disabled for job 12; the job cannot be requeued: submit it with sbatch --requeue "
                      "(or set JobRequeue=1)"}


@pytest.mark.system
def test_a_cancelled_job_is_not_requeued(tmp_path: Path) -> None:
    fake_command(tmp_path, "squeue", "echo 'COMPLETING|None'")
    scontrol_calls = fake_command(tmp_path, "scontrol", "true")
    level, event, fields = requeue(job_env(tmp_path))
    assert (level, event, fields["state"]) == ("info", ev.SLURM_REQUEUE_SKIPPED, "COMPLETING")
    assert calls(scontrol_calls) == []


def test_requeue_outside_slurm_is_a_failure_with_the_reason() -> None:
    assert requeue({}) == ("warning", ev.SLURM_REQUEUE_FAILED,
                           {"job": None, "reason": "not in a Slurm job (SLURM_JOB_ID is not set)"})


# ---------------------------------------------------------------------------------- SIGTERM
def test_inside_slurm_the_trainer_is_told_to_take_sigterm_as_a_save() -> None:
    assert slurm.child_environment({"SLURM_JOB_ID": "12"}) == {TRAINER_SIGTERM_ENV: "save"}
    assert slurm.child_environment({"SLURM_JOB_ID": "12", TRAINER_SIGTERM_ENV: ""}) == {}
    assert slurm.child_environment({}) == {}


def test_a_trainer_below_the_child_that_takes_sigterm_gets_its_own_stop_signal() -> None:
    """torchrun passes esiwrap's SIGTERM on to its ranks, which take it as a save request inside
    Slurm: each such rank is sent its stop signal directly, first; the child gets the stop once
    that rank has exited (the stop order of docs/reference/signals.md)."""
    driver = Driver()
    driver.hello(CHILD + 1, stop_signal="SIGHUP", sigterm_saves=True)
    driver.hello(CHILD + 2)  # an ordinary rank: the launcher's SIGTERM stops it
    out = driver.feed(core.SignalReceived("SIGTERM"))
    out += driver.feed(core.SaveBegin(CHILD + 1, 3))
    out += driver.feed(core.SaveBegin(CHILD + 2, 3))
    out += driver.feed(core.SaveEnd(CHILD + 1, 3))
    out += driver.feed(core.SaveEnd(CHILD + 2, 3))
    assert core.StopChild(None) in out
    assert [s for s in signals(out) if s.signal != "SIGUSR1"] == [core.SendSignal((CHILD + 1,), "SIGHUP")]
    driver.feed(core.TrainerGone(CHILD + 1))
    assert signals(driver.advance(LAUNCHER_EXIT_S)) == [core.SendSignal((CHILD,), "SIGTERM")]


def test_a_supervised_trainer_survives_a_direct_sigterm_and_a_failed_requeue_still_exits_75(
        tmp_path: Path, esiwrap: Callable[..., EsiwrapRun]) -> None:
    """In a (stand-in) Slurm job: a SIGTERM sent to the trainer itself, as Slurm sends one to every
    process of a job, becomes a save at the next step; esiwrap's own SIGTERM then checkpoints and
    stops the trainer with SIGHUP; the requeue fails and is logged, and esiwrap still exits 75."""
    end = int(time.time()) + 600  # far enough that esiwrap plans no save of its own meanwhile
    answers = f'case "$*" in *%e*) echo RUNNING {end};; *) echo "RUNNING|None";; esac'
    fake_command(tmp_path / "bin", "squeue", answers)
    down = "echo 'Unable to contact slurm controller (connect failure)' >&2; exit 1"
    fake_command(tmp_path / "bin", "scontrol", down)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "12"}
    run = esiwrap("--slurm-requeue", "--sources", "slurm", "--redundant-time", "3", "--save-duration", "1",
                  "--", PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(tmp_path / "ckpt"),
                  "--step-seconds", "0.2", env=env)
    hello = run.wait_event("trainer_attached", timeout=60)
    assert hello["sigterm"] == "save" and hello["stop_signal"] == "SIGHUP"
    assert run.wait_event("deadline_resolved", timeout=30)["source"] == "slurm"
    os.kill(int(hello["pid"]), signal.SIGTERM)
    own = run.wait_event("save_completed", timeout=30)
    assert own["requested"] is False  # the trainer's own save: esiwrap had not asked
    assert "save_requested" not in run.names()
    run.signal(signal.SIGTERM)
    failed = run.wait_event(ev.SLURM_REQUEUE_FAILED, timeout=60)
    assert failed["job"] == "12" and "connect failure" in failed["reason"]
    assert run.finish(timeout=30) == 75
    exited = run.first("child_exited")
    assert exited["signal"] == "SIGHUP"
    assert run.names().index(ev.SLURM_REQUEUE_FAILED) < run.names().index("supervisor_exit")


@pytest.mark.system
def test_the_trainer_library_takes_sigterm_as_a_save_only_when_told() -> None:
    """With ESIWRAP_TRAINER_SIGTERM=save under esiwrap a SIGTERM raises the save flag and the
    process lives on; uninstall() gives SIGTERM back. Without the variable SIGTERM is left alone."""
    code = (
        "import os, signal, esiwrap.trainer as esi\n"
        "esi.install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(esi.save_requested())\n"
        "esi.uninstall()\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)\n"
    )
    base = {**os.environ, "ESIWRAP_SOCKET": "/nonexistent/channel.sock"}
    shielded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env={**base, TRAINER_SIGTERM_ENV: "save"})
    assert shielded.stdout.split() == ["True", "True"]
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=base)
    assert plain.returncode == -signal.SIGTERM and plain.stdout == ""
