"""The demo trainer under esiwrap: a real torch loop, real signals, real checkpoints."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from esiwrap_harness import PYTHON, ROOT, TINY_TRAINER

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
    kinds = [e["kind"] for e in completed]
    # the 1 s guess is many times the real save: once measured, the early insurance is redone
    assert kinds[0] == "insurance" and kinds[-1] == "final" and set(kinds) == {"insurance", "final"}
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


def test_the_tiny_trainers_documented_command_runs_clean(esiwrap, tmp_path: Path) -> None:
    """The command in examples/tiny_trainer.py's docstring, as written: no warning of its own,
    exit 75. (On a busy node torch can take longer to start than the first save's lead: esiwrap
    then says so, `no_trainer_attached`, and signals the trainer the moment it attaches.)"""
    doc = TINY_TRAINER.read_text().split('"""')[1].replace("\\\n", " ")  # a shell line continued
    line = next(line.strip() for line in doc.splitlines() if line.strip().startswith("esiwrap "))
    words = shlex.split(line)[1:]
    split = words.index("--")
    command = [PYTHON if w == "python" else str(TINY_TRAINER) if w.endswith("tiny_trainer.py") else w
               for w in words[split + 1:]]
    run = esiwrap(*words[:split], "--", *command, cwd=tmp_path)
    assert run.finish(timeout=90) == EXIT_CHECKPOINTED
    noisy = [e for e in run.events if e["level"] in ("warning", "error")]
    names = run.names()
    if "no_trainer_attached" in names:  # the trainer came after the save was due: saved once it did
        order = [names.index(name) for name in ("no_trainer_attached", "trainer_attached", "save_started")]
        assert order == sorted(order), names
        noisy = [e for e in noisy if e["event"] != "no_trainer_attached"]
    assert noisy == [], noisy
    assert (tmp_path / "demo-checkpoints" / "latest.pt").exists()


def demo_command() -> list[str]:
    """The esiwrap command of scripts/demo.sh, as written (its continued lines joined)."""
    script = (ROOT / "scripts" / "demo.sh").read_text().replace("\\\n", " ")
    line = next(line.strip() for line in script.splitlines()
                if line.strip().startswith(".venv/bin/esiwrap --"))
    return shlex.split(line)[1:]


@pytest.mark.timeout(480)  # two runs to their deadline, each importing torch (slow on a busy node)
def test_the_demo_twice_shows_the_resume_verified(esiwrap, tmp_path: Path) -> None:
    """scripts/demo.sh's own command, run twice (a shorter deadline given the way the script
    passes extra options): the second run loads the state file the first wrote next to the
    checkpoint, logs `resumed` from the first run's last checkpoint, and `esiwrap report` of the
    demo's log says where it started."""
    assert "mkdir -p demo-checkpoints" in (ROOT / "scripts" / "demo.sh").read_text()
    (tmp_path / "demo-checkpoints").mkdir()
    words = demo_command()
    extra = words.index('"$@"') if '"$@"' in words else words.index("$@")
    split = words.index("--")
    command = [PYTHON if w == ".venv/bin/python" else str(TINY_TRAINER) if w.endswith("tiny_trainer.py")
               else w for w in words[split + 1:]]
    given = ["--log-format", "json", "--deadline", "+45s", "--redundant-time", "10"]
    args = [*words[:extra], *given, *words[extra + 1:split], "--", *command]
    first = esiwrap(*args, cwd=tmp_path)
    assert first.finish(timeout=150) == EXIT_CHECKPOINTED, first.names()
    checkpoint = first.first("supervisor_exit")["checkpoint_step"]
    assert first.first("state_loaded").get("note")  # no state file yet: the job's first run
    second = esiwrap(*args, cwd=tmp_path)
    assert second.finish(timeout=150) == EXIT_CHECKPOINTED, second.names()
    assert second.first("state_loaded")["checkpoint_step"] == checkpoint
    resumed = second.first("resumed")
    assert resumed["start_step"] == resumed["checkpoint_step"] == checkpoint and resumed["steps_redone"] == 0
    log = tmp_path / "demo-checkpoints" / "esiwrap.jsonl"
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", "--last", str(log)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (f"resume    from the checkpoint: started at step {checkpoint}, the durable checkpoint holds "
            f"step {checkpoint} (0 steps redone)") in done.stdout
