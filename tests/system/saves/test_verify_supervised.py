"""Verification end to end: real checkpoint files, real processes. A trainer under esiwrap whose
save "completes" (its `saving()` block ends normally) but leaves a broken checkpoint the way real
saves break: a `torch.save` file cut short, a PyTorch DCP directory without its `.metadata`, a verl
step whose tracker was never written. Four runs start together (about 40 s in all):

* torch: the first save is whole, the insurance save is cut short: `checkpoint_invalid` names the
  zip's problem, the first checkpoint stays durable, a new save is asked for at once and counts;
* dcp: every save after the first lacks `.metadata`: esiwrap exits 75 on the first checkpoint,
  never on a broken one, and its reason names the broken one;
* verl: no save ever writes the tracker: no checkpoint of the run is valid, exit 76;
* verl, rotated: every save is whole but the trainer deletes the previous checkpoint first
  (verl's `max_ckpt_to_keep=1`): one `previous_checkpoint_deleted` warning with the fix; the
  user's `--verify` command runs after the built-in check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import CHILDREN, PYTHON, EsiwrapRun

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED
from esiwrap.shell.verify import verify

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
WRITER = CHILDREN / "checkpoint_writer.py"
QUICK = ["--deadline", "+35s", "--stop-grace", "3", "--redundant-time", "8", "--save-duration", "1",
         "--final-margin", "2", "--unmeasured-factor", "1", "--log-level", "debug"]


@dataclass
class Finished:
    events: list[dict[str, Any]]
    code: int
    ckpt: Path

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def index(self, name: str, **fields: Any) -> int:
        return next(i for i, e in enumerate(self.events)
                    if e["event"] == name and all(e.get(k) == v for k, v in fields.items()))

    @property
    def exit(self) -> dict[str, Any]:
        return self.named("supervisor_exit")[0]


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the trainer copies at each save, made by torch: a model's `torch.save` file and the
    same cut short, a DCP save, and a verl step directory (FSDP shards of one rank, its config,
    data.pt)."""
    import torch
    import torch.distributed.checkpoint as dcp

    made = tmp_path_factory.mktemp("templates")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    torch.save({"model": state, "step": 1}, made / "model.pt")
    data = (made / "model.pt").read_bytes()
    (made / "model-cut.pt").write_bytes(data[: len(data) * 2 // 3])  # a write cut short
    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(str(made / "dcp")), no_dist=True)
    actor = made / "verl_step" / "actor"
    actor.mkdir(parents=True)
    for kind in ("model", "optim", "extra_state"):
        torch.save({kind: state}, actor / f"{kind}_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    torch.save({"dataloader": {"epoch": 0}}, made / "verl_step" / "data.pt")
    return made


@pytest.fixture(scope="module")
def runs(templates: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Finished]:
    tmp = tmp_path_factory.mktemp("verify")

    def start(name: str, fmt: str, saves: str, *extra: str, esiwrap: tuple[str, ...] = ()) -> EsiwrapRun:
        trainer = [PYTHON, str(WRITER), "--ckpt", str(tmp / name), "--templates", str(templates),
                   "--format", fmt, "--saves", saves, "--own-save-at", "3", *extra]
        return EsiwrapRun([*QUICK, *esiwrap, "--", *trainer])

    started = {
        "torch": start("torch", "torch", "good,bad,good"),
        "dcp": start("dcp", "dcp", "good,bad"),
        "verl": start("verl", "verl", "bad"),
        "rotated": start("rotated", "verl", "good", "--delete-previous",
                         esiwrap=("--verify", "test -f {path}/data.pt && test -d {path}/actor")),
    }
    finished = {}
    try:
        for name, run in started.items():
            code = run.finish(timeout=150)
            finished[name] = Finished(list(run.events), code, tmp / name)
    finally:
        for run in started.values():
            run.kill()
    return finished


def test_a_torch_save_cut_short_never_counts_and_is_saved_again(runs: dict[str, Finished]) -> None:
    run = runs["torch"]
    first = run.named("checkpoint_verified")[0]
    assert first["step"] == 3 and first["format"] == "torch" and first["seconds"] < 1.0
    (invalid,) = run.named("checkpoint_invalid")
    assert invalid["level"] == "error" and invalid["format"] == "torch"
    assert "central directory" in invalid["problem"] or "end-of-central" in invalid["problem"], invalid
    assert invalid["fix"] and invalid["durable_step"] == 3 and invalid["action"] == "save again now"
    again = run.index("save_requested", reason="invalid")
    assert again > run.index("checkpoint_invalid")
    # the saves after it are whole: the run ends on a valid checkpoint, never the broken one
    assert run.code == EXIT_CHECKPOINTED
    assert run.exit["durable_step"] != invalid["step"]
    assert run.exit["durable_step"] == run.named("checkpoint_verified")[-1]["step"] > invalid["step"]
    state_verified = [e["step"] for e in run.named("checkpoint_verified")]
    assert invalid["step"] not in state_verified


def test_a_dcp_save_without_metadata_never_gets_exit_75(runs: dict[str, Finished]) -> None:
    run = runs["dcp"]
    invalid = run.named("checkpoint_invalid")
    assert invalid and all(".metadata is missing" in e["problem"] for e in invalid), invalid
    assert all(e["durable_step"] == 3 for e in invalid)
    assert [e["action"] for e in invalid][:2] == ["save again now"] * 2
    assert run.code == EXIT_CHECKPOINTED
    assert run.exit["durable_step"] == 3 and run.exit["checkpoint_step"] == invalid[-1]["step"]
    assert "resumes from step 3" in run.exit["reason"] and "is invalid" in run.exit["reason"]
    assert verify(run.ckpt / "step_3", 3).ok  # what the job resumes from is whole


def test_a_verl_step_whose_tracker_was_never_written_is_no_checkpoint(runs: dict[str, Finished]) -> None:
    run = runs["verl"]
    invalid = run.named("checkpoint_invalid")
    assert invalid and all("latest_checkpointed_iteration.txt" in e["problem"] for e in invalid)
    assert all(e["durable_step"] is None for e in invalid)
    assert not run.named("checkpoint_verified")
    assert run.code == EXIT_SAVE_MISSED
    assert "no checkpoint of this run is valid" in run.exit["reason"] and run.exit["durable_step"] is None


def test_a_trainer_that_deletes_its_last_good_checkpoint_first_is_warned_once(
        runs: dict[str, Finished]) -> None:
    run = runs["rotated"]
    (warning,) = run.named("previous_checkpoint_deleted")
    assert warning["level"] == "warning" and warning["step"] == 3
    assert warning["path"].endswith("global_step_3") and "max_actor_ckpt_to_keep" in warning["fix"]
    verified = run.named("checkpoint_verified")
    assert verified and all(e["by"] == "built-in, --verify" and e["format"] == "verl" for e in verified)
    assert run.code == EXIT_CHECKPOINTED and run.exit["durable_step"] == verified[-1]["step"]
