"""verl under esiwrap with no code change: the installed verl (0.9 in CI), real Ray clusters, real
signals, CPU.

Each run is `esiwrap -- python tests/lib/verl_driver.py`: a Ray driver whose TaskRunner actor runs
verl's real trainer code (see the driver's docstring). The deadline is generous and the planned
save comes early (large --redundant-time), so a slow start (importing verl takes tens of seconds
on a loaded machine) only delays the save: the request waits in Ray's KV for the first boundary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

# Never skipped: scripts/test.sh installs verl, and a broken install must fail loudly.
import verl
from esiwrap_harness import PYTHON, ROOT, EsiwrapRun, free_port, processes_with_marker, wait_until
from ray_cluster import RayNode, cluster_up, node_environment, ray_env

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.paths import bootstrap_dir

DRIVER = ROOT / "tests" / "lib" / "verl_driver.py"
RAY_TIMEOUT_S = 240.0  # importing verl in a fresh Ray worker is slow on a busy CI machine
pytestmark = [pytest.mark.system, pytest.mark.timeout(420)]

# verl's ESI decision case by case (the cases of verl's tests/utils/ckpt/test_esi_save_ckpt_on_cpu.py)
# run against the name the legacy loop calls: `ray_trainer.should_save_ckpt_esi`.
VERL_ESI_CASES = """
import json, os, sys, time
from datetime import datetime, timedelta
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import trainer_base
from verl.utils.checkpoint import checkpoint_manager

decide = ray_trainer.should_save_ckpt_esi
MLP = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
AWS = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"

def case(mlp=None, aws=None, **kwargs):
    for name, value in ((MLP, mlp), (AWS, aws)):
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value
    return decide(**kwargs)

now = time.time()
later = lambda minutes: str(int((datetime.now() + timedelta(minutes=minutes)).timestamp()))
print(json.dumps({
    "no_expiry": case(max_steps_duration=100),
    "mlp_within_reach": case(mlp=str(now + 90), max_steps_duration=30),
    "mlp_passed": case(mlp=str(now - 10), max_steps_duration=30),
    "mlp_garbage": case(mlp="invalid", max_steps_duration=30),
    "mlp_far": case(mlp=str(now + 200), max_steps_duration=30),
    "aws_far": case(aws=later(100), max_steps_duration=30 * 60),
    "redundant_time_counts": case(mlp=str(now + 120), max_steps_duration=30, redundant_time=30),
    "no_step_time_yet": case(mlp=str(now + 60), max_steps_duration=0),
    "same_function": decide is checkpoint_manager.should_save_ckpt_esi,
    "patched": [hasattr(f, "__esiwrap_patched__") for f in (
        decide, ray_trainer.RayPPOTrainer._save_checkpoint, ray_trainer.RayPPOTrainer.fit,
        trainer_base.PPOTrainer.fit, trainer_base.PPOTrainer._save_checkpoint)],
    "esiwrap_loaded": sorted(m for m in sys.modules if m.startswith("esiwrap")),
}))
"""
VERL_ANSWERS = {
    "no_expiry": False, "mlp_within_reach": True, "mlp_passed": False, "mlp_garbage": False,
    "mlp_far": False, "aws_far": False, "redundant_time_counts": True, "no_step_time_yet": False,
}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Ray's Unix socket paths must stay under 108 bytes: a short directory, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="esv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def verl_run(esiwrap: Any, tmp: Path, loop: str, env: dict[str, str], *driver_args: str,
             redundant_s: str = "570") -> EsiwrapRun:
    run: EsiwrapRun = esiwrap(
        "--deadline", "+600s", "--redundant-time", redundant_s, "--save-duration", "2",
        "--no-final-save", "--log-level", "debug", "--",
        PYTHON, str(DRIVER), "--loop", loop, "--ckpt-dir", str(tmp / "ckpt"),
        "--pid-file", str(tmp / "taskrunner.pid"), "--step-seconds", "0.5", *driver_args,
        env=env, cwd=str(tmp),
    )
    return run


def verl_esi_cases(**env: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ESIWRAP_", "RAY_RUNTIME_ENV", "MLP_"))}
    full.update(PYTHONPATH=bootstrap_dir(), **env)
    return subprocess.Popen([PYTHON, "-c", VERL_ESI_CASES], env=full, stdout=subprocess.PIPE, text=True)


def test_verl_is_untouched_outside_esiwrap_and_without_a_ray_job() -> None:
    """With the bootstrap on PYTHONPATH but no esiwrap, verl's trainer modules are not patched and
    verl's own ESI test cases pass against the name its loop calls. In a process that has the hook
    (a worker of esiwrap's job) but neither a Ray connection nor esiwrap's socket, the patched
    names fall back to verl's decision and the same cases pass."""
    inert = verl_esi_cases()
    hooked = verl_esi_cases(ESIWRAP_RELAY="no-ray-here")
    inert_out, _ = inert.communicate(timeout=300)
    hooked_out, _ = hooked.communicate(timeout=300)
    assert inert.returncode == 0 and hooked.returncode == 0
    untouched, patched = json.loads(inert_out), json.loads(hooked_out)
    assert {k: untouched[k] for k in VERL_ANSWERS} == VERL_ANSWERS
    assert untouched["same_function"] is True
    assert untouched["patched"] == [False] * 5 and untouched["esiwrap_loaded"] == []
    assert {k: patched[k] for k in VERL_ANSWERS} == VERL_ANSWERS
    assert patched["patched"] == [True] * 5


def assert_saved_at_next_boundary(
    run: EsiwrapRun, tmp: Path, loop: str, reason: str = "deadline"
) -> dict[str, Any]:
    """The whole story: SIGUSR1 to the driver, one save, acknowledged, SIGINT, 75."""
    code = run.finish(timeout=RAY_TIMEOUT_S)
    assert code == EXIT_CHECKPOINTED, (run.names(), run.other_lines[-30:])
    driver_pid = run.first("child_started")["pid"]
    requested = run.first("save_requested")
    assert requested["reason"] == reason
    assert requested["pids"] == [driver_pid]  # the driver only, never its group
    attached = [e for e in run.events if e["event"] == "trainer_attached"]
    assert attached[0]["stop_signal"] == "SIGINT" and attached[0]["saves"] is False
    loop_hello = next(e for e in attached if e.get("loop"))
    assert (loop_hello["loop"], loop_hello["verl_version"], loop_hello["saves"]) == (
        loop, verl.__version__, True)
    completed = [e for e in run.events if e["event"] == "save_completed"]
    assert len(completed) == 1 and completed[0]["requested"] is True
    step = completed[0]["step"]
    assert completed[0]["path"] == str(tmp / "ckpt" / f"global_step_{step}")
    # The save came at the end of the step running when the request was made. Step events reach
    # esiwrap through the relay, so the step seen last may be one behind the one running.
    seen = [e["step"] for e in run.events[: run.events.index(requested)] if e["event"] == "step_observed"]
    if seen:
        assert seen[-1] < step <= seen[-1] + 2, (seen, step)
    assert (tmp / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == str(step)
    assert (tmp / "ckpt" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").exists()
    assert sorted(p.name for p in (tmp / "ckpt").glob("global_step_*")) == [f"global_step_{step}"]
    stopping = run.first("child_stopping")
    assert stopping["signal"] == "SIGINT"
    return {"step": step, "driver_pid": driver_pid}


def assert_nothing_left(tmp: Path) -> None:
    """No process of the run survives: driver, TaskRunner, raylet, gcs_server (psutil scan)."""
    taskrunner = int((tmp / "taskrunner.pid").read_text())
    assert wait_until(lambda: not psutil.pid_exists(taskrunner), timeout=30), "TaskRunner left behind"
    assert wait_until(lambda: not processes_with_marker(str(tmp)), timeout=30), [
        p.info["cmdline"] for p in processes_with_marker(str(tmp))
    ]


def test_legacy_loop_on_a_local_cluster_saves_once_and_ignores_verls_own_expiry_check(
    esiwrap: Any, short_tmp: Path
) -> None:
    """Legacy `RayPPOTrainer` loop on a cluster the driver starts: the requested save goes through
    verl's real `_save_checkpoint` at the next boundary and is acknowledged after the tracker file
    is written; esiwrap stops the driver with SIGINT and exits 75 with nothing left. verl's own
    MLP_ expiry check, which would fire at every step here, is not consulted: one save, once."""
    run = verl_run(esiwrap, short_tmp, "legacy", ray_env(short_tmp), "--save-freq", "1000",
                   "--mlp-expiry-in", "50")
    assert_saved_at_next_boundary(run, short_tmp, "legacy")
    # verl's rule (expiry within 60 s + step time + redundancy) would have saved at every step
    assert (short_tmp / "verl_native_check.txt").read_text() == "True"
    assert_nothing_left(short_tmp)


def tiny_model_dir(path: Path) -> Path:
    """A Hugging Face model directory as verl reads it: config.json and bf16 safetensors."""
    import torch
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "bfloat16"}))
    weights = {"embed.weight": torch.zeros(1000, 64, dtype=torch.bfloat16),
               "layer.weight": torch.zeros(64, 64, dtype=torch.bfloat16)}
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_v1_loop_on_a_local_cluster_saves_without_save_freq(esiwrap: Any, short_tmp: Path) -> None:
    """verl's default V1 `PPOTrainer.fit` (real code; only the step itself is a sleep), with
    verl's default save_freq=-1, which never saves. While it trains, esiwrap gets SIGTERM (a spot
    notice): the save requested from the driver runs through verl's `_save_checkpoint` at the end
    of the running step, is acknowledged, and the run stops with 75. With no change to verl, the
    loop's hello says what a checkpoint of the config's model will hold (fp32 model and AdamW
    state: 12 bytes per parameter) and where checkpoints go."""
    model = tiny_model_dir(short_tmp / "model")
    run = verl_run(esiwrap, short_tmp, "v1", ray_env(short_tmp), "--save-freq", "-1",
                   "--model-dir", str(model), redundant_s="60")
    run.wait_for(lambda e: e["event"] == "step_observed" and e["step"] >= 3, RAY_TIMEOUT_S, "step 3")
    run.proc.send_signal(signal.SIGTERM)
    assert_saved_at_next_boundary(run, short_tmp, "v1", reason="sigterm")
    loop_hello = next(e for e in run.events if e["event"] == "trainer_attached" and e.get("loop"))
    assert loop_hello["checkpoint_bytes"] == 12 * (1000 * 64 + 64 * 64)
    assert loop_hello["checkpoint_dir"] == str(short_tmp / "ckpt")
    assert "actor" in loop_hello["checkpoint_estimate"]
    assert_nothing_left(short_tmp)


def test_without_the_ray_hook_the_taskrunner_attaches_directly(esiwrap: Any, short_tmp: Path) -> None:
    """When Ray skips our runtime-env hook (as under `uv run`), the TaskRunner of a local cluster,
    hooked by the bootstrap it inherited, says hello itself and asks to be signalled (it descends
    from esiwrap): a save asked for by SIGTERM still happens at the next boundary and is
    acknowledged. The driver, which never said hello, is stopped with the default SIGTERM; exit
    75, nothing left."""
    run = verl_run(esiwrap, short_tmp, "v1", ray_env(short_tmp), "--skip-ray-env-hook", redundant_s="60")
    # nothing attaches before the loop starts: ask for the save (a SIGTERM) once it has
    run.wait_event("trainer_attached", timeout=RAY_TIMEOUT_S)
    run.proc.send_signal(signal.SIGTERM)
    code = run.finish(timeout=RAY_TIMEOUT_S)
    assert code == EXIT_CHECKPOINTED, (run.names(), run.other_lines[-30:])
    taskrunner = int((short_tmp / "taskrunner.pid").read_text())
    attached = [e for e in run.events if e["event"] == "trainer_attached"]
    assert [(e["pid"], e["signal"], e["loop"]) for e in attached] == [(taskrunner, True, "v1")]
    assert run.first("save_requested")["pids"] == [taskrunner]
    step = run.first("save_completed")["step"]
    assert (short_tmp / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == str(step)
    assert run.first("child_stopping")["signal"] == "SIGTERM"
    assert_nothing_left(short_tmp)


@pytest.fixture
def ray_cluster(short_tmp: Path) -> Iterator[str]:
    """A Ray cluster started separately (`ray start --head` on 127.0.0.1): the multi-node set-up,
    where workers inherit the raylet's environment, not the driver's."""
    env = node_environment(short_tmp)
    address = f"127.0.0.1:{free_port()}"
    head = RayNode.head(short_tmp, env, int(address.rsplit(":", 1)[1]))
    try:
        ready = wait_until(lambda: cluster_up(address, env) or head.proc.poll() is not None, 120, 1.0)
        assert ready and head.proc.poll() is None, "ray start --head did not come up"
        yield address
    finally:
        head.stop()


def test_legacy_loop_on_a_separately_started_cluster(esiwrap: Any, short_tmp: Path, ray_cluster: str) -> None:
    """On a cluster started by `ray start` (RAY_ADDRESS), the hook reaches the TaskRunner through
    the job's runtime env (worker setup hook + py_modules), the request and the events travel
    through Ray's KV, and the save at the next boundary is acknowledged; with verl's default
    save_freq=-1 the hook saves itself through `_save_checkpoint`. The save is asynchronous
    (`async_save`: verl leaves the tracker file to the finalize step), so the hook finalizes it
    before acknowledging. The driver is stopped with SIGINT, exit 75, and the job's TaskRunner is
    gone while the cluster lives on."""
    env = ray_env(short_tmp, RAY_ADDRESS=ray_cluster)
    run = verl_run(esiwrap, short_tmp, "legacy", env, "--save-freq", "-1", "--async-save")
    result = assert_saved_at_next_boundary(run, short_tmp, "legacy")
    relayed = next(e for e in run.events if e["event"] == "trainer_attached" and e.get("loop"))
    assert relayed["relayed_from"]["pid"] == int((short_tmp / "taskrunner.pid").read_text())
    taskrunner = int((short_tmp / "taskrunner.pid").read_text())
    assert wait_until(lambda: not psutil.pid_exists(taskrunner), timeout=60), "TaskRunner left behind"
    assert not psutil.pid_exists(result["driver_pid"])


def test_v1_resume_is_verified_against_the_state_file(esiwrap: Any, short_tmp: Path) -> None:
    """A real verl checkpoint directory: the first run saves `global_step_N` through verl's own
    `_save_checkpoint` and the state file records it; the next run, with verl's default
    `trainer.resume_mode=auto`, loads it through verl's own `_load_checkpoint` and the hook's start
    message gives esiwrap the global step after loading: `resumed`. A third with
    `trainer.resume_mode=disable` starts from scratch: `resume_missed`, naming resume_mode and
    default_local_dir."""
    state = short_tmp / "esiwrap-state.json"

    def run_once(mode: str) -> EsiwrapRun:
        run: EsiwrapRun = esiwrap(
            "--deadline", "+600s", "--redundant-time", "570", "--save-duration", "2", "--no-final-save",
            "--state-file", str(state), "--log-level", "debug", "--",
            PYTHON, str(DRIVER), "--loop", "v1", "--ckpt-dir", str(short_tmp / "ckpt"),
            "--pid-file", str(short_tmp / "taskrunner.pid"), "--step-seconds", "0.5", "--resume-mode", mode,
            env=ray_env(short_tmp), cwd=str(short_tmp))
        code = run.finish(timeout=RAY_TIMEOUT_S)
        assert code == EXIT_CHECKPOINTED, (run.names(), run.other_lines[-30:])
        return run

    first = run_once("auto")
    saved = first.first("save_completed")["step"]
    assert json.loads(state.read_text())["checkpoint"]["step"] == saved
    assert not [e for e in first.events if e["event"] in ("resumed", "resume_missed")]

    second = run_once("auto")
    resumed = second.first("resumed")
    assert (resumed["checkpoint_step"], resumed["start_step"], resumed["steps_redone"]) == (saved, saved, 0)
    assert resumed["path"] == str(short_tmp / "ckpt" / f"global_step_{saved}")
    assert second.first("step_observed")["step"] > saved  # verl really went on from there

    again = second.first("save_completed")["step"]
    third = run_once("disable")
    missed = third.first("resume_missed")
    assert (missed["checkpoint_step"], missed["start_step"], missed["steps_redone"]) == (again, 0, again)
    assert "trainer.resume_mode=disable" in missed["causes"][0]
    assert str(short_tmp / "ckpt") in missed["causes"][1]
