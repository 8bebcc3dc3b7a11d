"""Test trainer that saves real checkpoint files, whole or broken, the way failed saves leave them.

The files are copied from templates the test made with torch (this process does not import it:
it starts fast): a `torch.save` file and the same file cut short; a PyTorch DCP directory, and the
same without its `.metadata`; a verl step directory (`global_step_N/` with its actor shards and
`data.pt`), with the tracker `latest_checkpointed_iteration.txt` naming N, or left naming the step
before (the tracker never written). Each save is `good` or `bad` in the order `--saves` gives
(the last one repeats); the save "completes" either way: `saving()` ends normally.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import esiwrap.trainer as esi

TRACKER = "latest_checkpointed_iteration.txt"

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", type=Path, required=True, help="the checkpoint directory")
parser.add_argument("--templates", type=Path, required=True)
parser.add_argument("--format", choices=("torch", "dcp", "verl"), required=True)
parser.add_argument("--saves", default="good", help="good/bad, one per save, the last repeats")
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument("--own-save-at", type=int, default=0, help="also save on its own at this step")
parser.add_argument("--delete-previous", action="store_true",
                    help="delete the previous checkpoint before writing the next (verl's max_ckpt_to_keep=1: "
                    "its actor/, leaving the step's directory and data.pt)")
args = parser.parse_args()
kinds = args.saves.split(",")
args.ckpt.mkdir(parents=True, exist_ok=True)


def path_of(step: int) -> Path:
    if args.format == "torch":
        return args.ckpt / f"step_{step}.pt"
    if args.format == "dcp":
        return args.ckpt / f"step_{step}"
    return args.ckpt / f"global_step_{step}"


def write(step: int, good: bool) -> Path:
    path = path_of(step)
    if args.format == "torch":
        shutil.copyfile(args.templates / ("model.pt" if good else "model-cut.pt"), path)
    elif args.format == "dcp":
        shutil.copytree(args.templates / "dcp", path)
        if not good:
            (path / ".metadata").unlink()  # the save stopped before its metadata (written last)
    else:
        shutil.copytree(args.templates / "verl_step", path)
        if good:  # verl writes the tracker last; an async save that never finalized does not
            tmp = args.ckpt / (TRACKER + ".tmp")
            tmp.write_text(str(step))
            os.replace(tmp, args.ckpt / TRACKER)
    return path


saved = 0
previous: Path | None = None
esi.install()
print("checkpoint_writer: start", flush=True)
for step in range(1, 1_000_000):
    time.sleep(args.step_seconds)
    esi.step_done(step)
    if not (esi.save_requested() or step == args.own_save_at):
        continue
    good = kinds[min(saved, len(kinds) - 1)] == "good"
    saved += 1
    with esi.saving(step, path_of(step)):
        if args.delete_previous and previous is not None:
            if args.format == "verl":
                shutil.rmtree(previous / "actor")  # verl's rotation: the shards go, the directory stays
            elif previous.is_dir():
                shutil.rmtree(previous)
            else:
                previous.unlink()
        previous = write(step, good)
    print(f"checkpoint_writer: saved step {step} ({'good' if good else 'bad'})", flush=True)
sys.exit(0)
