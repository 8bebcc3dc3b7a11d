"""Multi-node torchrun on one machine: two launchers (`--nnodes 2`, c10d rendezvous on loopback),
each under its own esiwrap, as two instances would run it.

The save is asked for on the node without rank 0 (its esiwrap gets SIGTERM: the platform stops
that instance). The ranks' all-reduce makes every rank save the same step; the end of
`saving()` waits for every rank, so neither node acknowledges before rank 0's checkpoint is on
disk; the other node's esiwrap learns from the trainer that a peer asked (`peer: true`) and
stops after the save too. Both exit 75, nothing of the job is left. The same for the Hugging
Face and Lightning callbacks.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from esiwrap_harness import EXAMPLES, PYTHON, EsiwrapRun, free_port, processes_with_marker, wait_until

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.times import iso_epoch

STARTUP_S = 240.0  # two framework imports and a rendezvous on two loaded cores


@dataclass(frozen=True)
class Job:
    """A training script for two nodes of one rank each, and where rank 0's checkpoint lands."""

    script: str
    args: Callable[[Path], list[str]]
    checkpoint: Callable[[Path, int], Path]  # (output dir, step) -> the file written last
    step_of: Callable[[Path], int] | None = None  # the step inside the checkpoint, when it says


JOBS = {
    # rank 0 alone writes, and slowly (2 s): without the wait at the end of saving(), the other
    # node would acknowledge (and stop the job) while rank 0 is still writing
    "ddp": Job("ddp_trainer.py",
               lambda out: ["--ckpt-dir", str(out), "--save-ranks", "rank0", "--step-seconds", "0.3",
                            "--save-seconds", "2"],
               lambda out, step: out / "model.pt",
               lambda path: int(torch.load(path, weights_only=True)["step"])),
    "hf": Job("hf_trainer.py", lambda out: ["--output-dir", str(out), "--step-seconds", "0.3"],
              lambda out, step: out / f"checkpoint-{step}" / "trainer_state.json"),
    "lightning": Job("lightning_trainer.py",
                     lambda out: ["--ckpt-dir", str(out), "--step-seconds", "0.3", "--num-nodes", "2"],
                     lambda out, step: out / "esiwrap-last.ckpt",
                     lambda path: int(torch.load(path, weights_only=False)["global_step"])),
}


def node(esiwrap: Any, port: int, job: Job, out: Path) -> EsiwrapRun:
    """One "instance": esiwrap in front of torchrun, which joins the two-node rendezvous."""
    run: EsiwrapRun = esiwrap(
        "--sources", "env", "--save-duration", "5", "--stop-grace", "60", "--",
        PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "esiwrap-two-nodes",
        str(EXAMPLES / job.script), *job.args(out),
        env={"GLOO_SOCKET_IFNAME": "lo", "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": ""},
    )
    return run


@pytest.mark.parametrize("name", list(JOBS))
def test_two_nodes_save_once_and_both_stop_after_rank0s_checkpoint(
    esiwrap: Any, tmp_path: Path, name: str
) -> None:
    """SIGTERM to the esiwrap of the node without rank 0: all ranks save the same step, both
    esiwraps log the save complete only after rank 0's checkpoint was written, the node with
    rank 0 adopts the save as a peer's request, and both exit 75 with nothing left."""
    job, out = JOBS[name], tmp_path / f"two-nodes-{name}-marker"
    port = free_port()
    nodes = [node(esiwrap, port, job, out) for _ in range(2)]
    hellos = [run.wait_event("trainer_attached", timeout=STARTUP_S) for run in nodes]
    assert sorted(hello["rank"] for hello in hellos) == [0, 1], hellos
    head, other = nodes if hellos[0]["rank"] == 0 else nodes[::-1]
    other.signal(signal.SIGTERM)

    codes = [run.finish(timeout=180) for run in (head, other)]
    assert codes == [EXIT_CHECKPOINTED, EXIT_CHECKPOINTED], (
        head.names(), other.names(), head.other_lines[-20:], other.other_lines[-20:])
    assert other.first("save_requested")["reason"] == "sigterm"
    adopted = head.first("save_requested")
    assert (adopted["reason"], adopted["kind"]) == ("peer", "peer")

    step = head.first("save_completed")["step"]
    checkpoint = job.checkpoint(out, step)
    written_at = checkpoint.stat().st_mtime
    if job.step_of is not None:
        assert job.step_of(checkpoint) == step
    for run in (head, other):
        completed = [e for e in run.events if e["event"] == "save_completed"]
        assert len(completed) == 1 and completed[0]["step"] == step, completed
        # log timestamps have milliseconds; the ddp job's slow write makes any early one 2 s early
        assert iso_epoch(completed[0]["timestamp"]) >= written_at - 0.001, (completed[0], written_at)
        assert "checkpoint complete" in run.first("child_stopping")["reason"]
    assert wait_until(lambda: not processes_with_marker(str(out)), timeout=30), [
        p.info["cmdline"] for p in processes_with_marker(str(out))]
