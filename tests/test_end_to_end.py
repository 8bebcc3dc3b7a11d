"""The demo trainer under esiwrap: a real torch loop, real signals, real checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch
from esiwrap_harness import PYTHON, TINY_TRAINER

from esiwrap.errors import EXIT_CHECKPOINTED


def demo_args(ckpt: Path, deadline: str = "+35s", *extra: str) -> list[str]:
    # torch takes seconds to import on a loaded machine: the first save is due well after that
    return [
        "--deadline", deadline, "--redundant-time", "8", "--save-duration", "1",
        "--final-margin", "2", *extra, "--",
        PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(ckpt), "--step-seconds", "0.3",
    ]


def test_demo_saves_before_deadline_and_resumes(esiwrap, tmp_path: Path) -> None:
    """Insurance save, then a final save, both before the deadline; exit 75; the next run resumes."""
    run = esiwrap(*demo_args(tmp_path))
    code = run.finish(timeout=90)
    assert code == EXIT_CHECKPOINTED, run.names()
    resolved = run.first("deadline_resolved")
    completed = [e for e in run.events if e["event"] == "save_completed"]
    assert [e["kind"] for e in completed] == ["insurance", "final"]
    assert all(e["remaining_s"] > 0 for e in completed)
    assert completed[-1]["step"] > completed[0]["step"]
    assert resolved["source"] == "cli"
    state = torch.load(tmp_path / "latest.pt", weights_only=True)
    assert state["step"] == completed[-1]["step"]

    again = esiwrap(*demo_args(tmp_path, "+25s"))
    assert again.finish(timeout=90) == EXIT_CHECKPOINTED
    assert f"starting at step {state['step']}" in again.stdout.decode()
    resumed = torch.load(tmp_path / "latest.pt", weights_only=True)
    assert resumed["step"] > state["step"]
