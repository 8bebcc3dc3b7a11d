"""Hugging Face Trainer, Lightning and torchrun under esiwrap: real frameworks, tiny CPU models.

Each run gets a deadline far enough away that the framework has imported and attached before the
save is due (imports take 10-30 s on two loaded cores), and `--no-final-save`, so it ends right
after the one save: the test's wall time is about the time to the save signal.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from esiwrap_harness import EXAMPLES, PYTHON, EsiwrapRun, processes_with_marker, wait_until

from esiwrap.errors import EXIT_CHECKPOINTED

pytestmark = pytest.mark.system

NEAR_DEADLINE = ["--deadline", "+75s", "--redundant-time", "35", "--save-duration", "2",
                 "--no-final-save"]


def run_alone(*argv: str) -> str:
    """Run an example without esiwrap (no ESIWRAP_SOCKET: the callbacks are inert); its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESIWRAP_")}
    done = subprocess.run([PYTHON, *argv], capture_output=True, text=True, env=env, timeout=180,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def the_save(run: EsiwrapRun) -> dict[str, Any]:
    """The one requested save of a run that must have ended with exit 75 after it."""
    code = run.finish(timeout=180)
    assert code == EXIT_CHECKPOINTED, (run.names(), run.other_lines[-30:])
    completed = [e for e in run.events if e["event"] == "save_completed"]
    assert len(completed) == 1, completed
    assert completed[0]["requested"] is True and completed[0]["remaining_s"] > 0
    return completed[0]


def test_hf_trainer_checkpoints_at_the_deadline_and_resumes(esiwrap, tmp_path: Path) -> None:
    """HF Trainer + EsiwrapCallback: esiwrap's signal becomes a `checkpoint-<step>` directory,
    acknowledged once complete; SIGTERM then stops training gracefully (exit 75), and with
    transformers' own SIGTERM checkpointing on, that stop writes no second checkpoint; a run
    without esiwrap resumes from the checkpoint at the next step."""
    out = tmp_path / "hf-run"
    script = str(EXAMPLES / "hf_trainer.py")
    run = esiwrap(*NEAR_DEADLINE, "--", PYTHON, script, "--output-dir", str(out), "--step-seconds", "0.3",
                  "--jit-checkpoint")
    saved = the_save(run)
    step = int(saved["step"])
    checkpoint = out / f"checkpoint-{step}"
    assert saved["path"] == str(checkpoint)
    assert (checkpoint / "trainer_state.json").is_file()
    assert [p.name for p in out.iterdir()] == [checkpoint.name]  # one save, not one more on SIGTERM
    assert any("enable_jit_checkpoint is off while esiwrap supervises" in line for line in run.other_lines)
    attached = run.first("trainer_attached")
    assert attached["integration"] == "transformers"
    # what a checkpoint holds (the model and its optimizer), and where it goes: probed
    assert attached["checkpoint_bytes"] > 0 and attached["checkpoint_dir"] == str(out)
    assert run.first("storage_probed")["bandwidth_mb_s"] > 0
    # the stop: SIGTERM arrives during the next step (0.3 s), should_training_stop at a step end
    stopped = re.search(r"trained steps 1\.\.(\d+) by esiwrap", run.stdout.decode())
    assert stopped is not None and step < int(stopped.group(1)) <= step + 3, run.stdout.decode()

    resumed = run_alone(script, "--output-dir", str(out), "--max-steps", str(step + 2),
                        "--step-seconds", "0")
    assert f"resuming from {checkpoint}" in resumed
    assert f"trained steps {step + 1}..{step + 2}" in resumed


def test_lightning_checkpoints_at_the_deadline_and_resumes(esiwrap, tmp_path: Path) -> None:
    """Lightning + EsiwrapCallback: the save happens in `on_train_batch_end` through
    `trainer.save_checkpoint`, is acknowledged after the file is in place, Lightning's own SIGTERM
    handling ends the run (exit 75), and `fit(ckpt_path=...)` resumes at the next step."""
    ckpt_dir = tmp_path / "lightning-run"
    script = str(EXAMPLES / "lightning_trainer.py")
    run = esiwrap(*NEAR_DEADLINE, "--", PYTHON, script, "--ckpt-dir", str(ckpt_dir),
                  "--step-seconds", "0.3")
    saved = the_save(run)
    step = int(saved["step"])
    checkpoint = ckpt_dir / "esiwrap-last.ckpt"
    assert saved["path"] == str(checkpoint)
    assert torch.load(checkpoint, weights_only=False)["global_step"] == step
    assert list(ckpt_dir.iterdir()) == [checkpoint]  # no partial file left
    attached = run.first("trainer_attached")
    assert attached["checkpoint_bytes"] > 0 and attached["checkpoint_dir"] == str(ckpt_dir)

    resumed = run_alone(script, "--ckpt-dir", str(ckpt_dir), "--max-steps", str(step + 2),
                        "--step-seconds", "0")
    assert f"resuming from {checkpoint}" in resumed
    assert f"trained steps {step + 1}..{step + 2}" in resumed


def test_torchrun_ranks_save_the_same_step_and_nothing_is_left(esiwrap, tmp_path: Path) -> None:
    """torchrun with two gloo ranks: both register, both are signalled (not the agent), both save
    the step they agreed on through the all-reduce, the save is acknowledged once both have, then
    the agent and its workers are stopped: exit 75 and no process of the job is left."""
    ckpt_dir = tmp_path / "ddp-run-marker"
    run = esiwrap(
        "--deadline", "+70s", "--redundant-time", "35", "--save-duration", "2", "--no-final-save",
        "--", PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(EXAMPLES / "ddp_trainer.py"), "--ckpt-dir", str(ckpt_dir), "--step-seconds", "0.3",
        env={"GLOO_SOCKET_IFNAME": "lo"},
    )
    saved = the_save(run)
    step = int(saved["step"])
    agent = run.first("child_started")["pid"]
    ranks = {e["rank"]: e["pid"] for e in run.events if e["event"] == "trainer_attached"}
    assert set(ranks) == {0, 1} and agent not in ranks.values()
    assert sorted(run.first("save_requested")["pids"]) == sorted(ranks.values())
    shards = [torch.load(ckpt_dir / f"rank{r}.pt", weights_only=True)["step"] for r in (0, 1)]
    assert shards == [step, step]
    stdout = run.stdout.decode()
    assert f"rank 0: saved step {step}" in stdout and f"rank 1: saved step {step}" in stdout
    assert wait_until(lambda: not processes_with_marker(str(ckpt_dir)), timeout=10)


def test_rank0_only_save_is_acknowledged_by_rank0_alone(esiwrap, tmp_path: Path) -> None:
    """Ranks that declare `saves=False` are signalled but not waited for: the save is acknowledged
    when rank 0 reports it; the launcher (which never said hello) and the ranks are then stopped
    and nothing is left (torch-free ranks, so this runs in seconds)."""
    ckpt_dir = tmp_path / "rank0-only-marker"
    run = esiwrap(
        "--deadline", "+20s", "--redundant-time", "6", "--save-duration", "1", "--no-final-save",
        "--", PYTHON, str(Path(__file__).parents[2] / "lib" / "ranks_launcher.py"), "--ranks", "2",
        "--savers", "rank0", "--ckpt-dir", str(ckpt_dir),
    )
    saved = the_save(run)
    ranks = {e["rank"]: e for e in run.events if e["event"] == "trainer_attached"}
    assert ranks[0]["saves"] is True and ranks[1]["saves"] is False
    assert sorted(run.first("save_requested")["pids"]) == sorted(e["pid"] for e in ranks.values())
    assert (ckpt_dir / "rank0.txt").read_text() == str(saved["step"])
    assert not (ckpt_dir / "rank1.txt").exists()
    assert wait_until(lambda: not processes_with_marker(str(ckpt_dir)), timeout=10)


def test_frameworks_are_imported_only_by_their_integration() -> None:
    """`esiwrap --help`, the trainer library and the integrations package import no framework
    (nor torch): a framework is imported only by the integration module a script imports."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['esiwrap', '--help']\n"
        "try:\n    runpy.run_module('esiwrap', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "import esiwrap.integrations, esiwrap.trainer\n"
        "heavy = ('torch', 'transformers', 'lightning', 'pytorch_lightning')\n"
        "print('imported', sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert "imported []" in done.stdout, done.stdout
