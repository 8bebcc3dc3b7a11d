"""Multi-node torchrun on one machine: two launchers (`--nnodes 2`, c10d rendezvous on loopback),
each under its own esiwrap, as two instances would run it.

The save is asked for on the node without rank 0 (its esiwrap gets SIGTERM: the platform stops
that instance). The ranks' all-reduce makes every rank save the same step; the end of
`saving()` waits for every rank, so neither node acknowledges before rank 0's (deliberately
slow) write is on disk; the other node's esiwrap learns from the trainer that a peer asked
(`peer: true`) and stops after the save too. Both exit 75, nothing of the job is left.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import torch
from esiwrap_harness import EXAMPLES, PYTHON, EsiwrapRun, free_port, processes_with_marker, wait_until

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.report import epoch

STARTUP_S = 180.0  # two torch imports and a rendezvous on two loaded cores


def node(esiwrap: Any, port: int, ckpt_dir: Path, save_seconds: float) -> EsiwrapRun:
    """One "instance": esiwrap in front of torchrun, which joins the two-node rendezvous."""
    run: EsiwrapRun = esiwrap(
        "--sources", "env", "--save-duration", "5", "--stop-grace", "60", "--",
        PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "esiwrap-two-nodes",
        str(EXAMPLES / "ddp_trainer.py"), "--ckpt-dir", str(ckpt_dir), "--save-ranks", "rank0",
        "--step-seconds", "0.3", "--save-seconds", str(save_seconds),
        env={"GLOO_SOCKET_IFNAME": "lo", "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": ""},
    )
    return run


def test_two_nodes_save_once_and_both_stop_after_rank0s_checkpoint(esiwrap: Any, tmp_path: Path) -> None:
    """SIGTERM to the esiwrap of the node without rank 0: all ranks save the same step, both
    esiwraps log the save complete only after rank 0's checkpoint file was written (its write
    takes 2 s), the node with rank 0 adopts the save as a peer's request, and both exit 75."""
    ckpt_dir = tmp_path / "two-nodes-marker"
    port = free_port()
    nodes = [node(esiwrap, port, ckpt_dir, save_seconds=2.0) for _ in range(2)]
    hellos = [run.wait_event("trainer_attached", timeout=STARTUP_S) for run in nodes]
    ranks = [hello["rank"] for hello in hellos]
    assert sorted(ranks) == [0, 1], hellos
    head, other = (nodes[0], nodes[1]) if ranks[0] == 0 else (nodes[1], nodes[0])
    other.signal(signal.SIGTERM)

    codes = [run.finish(timeout=120) for run in (head, other)]
    assert codes == [EXIT_CHECKPOINTED, EXIT_CHECKPOINTED], (
        head.names(), other.names(), head.other_lines[-20:], other.other_lines[-20:])
    assert other.first("save_requested")["reason"] == "sigterm"
    adopted = head.first("save_requested")
    assert (adopted["reason"], adopted["kind"]) == ("peer", "peer")

    checkpoint = ckpt_dir / "model.pt"
    written_at = checkpoint.stat().st_mtime
    step = torch.load(checkpoint, weights_only=True)["step"]
    for run in (head, other):
        completed = [e for e in run.events if e["event"] == "save_completed"]
        assert len(completed) == 1 and completed[0]["step"] == step, completed
        assert epoch(completed[0]["timestamp"]) >= written_at, (completed[0], written_at)
        assert "checkpoint complete" in run.first("child_stopping")["reason"]
    assert head.first("save_completed")["path"] == str(checkpoint)
    assert wait_until(lambda: not processes_with_marker(str(ckpt_dir)), timeout=30), [
        p.info["cmdline"] for p in processes_with_marker(str(ckpt_dir))]
