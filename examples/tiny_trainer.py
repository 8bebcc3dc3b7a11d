"""A tiny CPU PyTorch trainer that checkpoints when esiwrap asks, and resumes where it left off.

    esiwrap --deadline +40s --save-duration 2 --redundant-time 10 --local-checkpoints-survive -- \
        python examples/tiny_trainer.py

(`--save-duration 2`: this trainer's checkpoint takes milliseconds, not the minute esiwrap assumes
for a real model; `--redundant-time 10`: a 40 s deadline leaves no room for the default 2 minutes;
`--local-checkpoints-survive`: the demo resumes on this machine, whose disk outlives the run. On
capacity that is reclaimed, write checkpoints to storage that outlives it or add `--upload`.)

The five lines marked `# esiwrap` are all a plain PyTorch loop needs (`install()`'s checkpoint size
and directory are optional: with them esiwrap plans the first save from the checkpoint's size and
the storage's measured speed instead of a guess). Checkpoints hold the model, the optimizer and
the step, and are written atomically (temporary file, fsync, rename), so a checkpoint on disk is
always complete.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import esiwrap.trainer as esi

LATEST = "latest.pt"


def build_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


def synthetic_batch(step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(batch, 16, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    return x, y


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
                    loss: float, extra_seconds: float, frozen: torch.Tensor | None = None) -> None:
    """Write to a temporary file, fsync it, then rename over the old checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
             "loss": loss, "frozen": frozen}
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        if extra_seconds:
            time.sleep(extra_seconds)  # stands in for a large model's write time
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", type=Path, default=Path("demo-checkpoints"))
    parser.add_argument("--steps", type=int, default=1_000_000, help="stop after this many steps")
    parser.add_argument("--step-seconds", type=float, default=1.0,
                        help="wall time per step (real compute, padded with sleep)")
    parser.add_argument("--save-seconds", type=float, default=0.0,
                        help="extra time each checkpoint write takes")
    parser.add_argument("--frozen-mb", type=float, default=0.0,
                        help="a frozen table of this many MB in every checkpoint (a bigger model's bytes)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    model = build_model(args.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    frozen = torch.rand(int(args.frozen_mb * 1e6) // 4) if args.frozen_mb else None
    checkpoint = args.ckpt_dir / LATEST
    start = load_checkpoint(checkpoint, model, optimizer)
    print(f"tiny_trainer: starting at step {start}", flush=True)
    # esiwrap; all three are optional: esiwrap plans the first save from the size and the directory's
    # speed, and measures the checkpoint this run resumed from
    esi.install(checkpoint_bytes=esi.checkpoint_bytes(model, optimizer, frozen), checkpoint_dir=args.ckpt_dir,
                resumed_from=checkpoint if start else None)
    loss_value = float("nan")
    for step in range(start + 1, args.steps + 1):
        began = time.monotonic()
        x, y = synthetic_batch(step, args.batch)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))
        esi.step_done(step)  # esiwrap
        if esi.save_requested():  # esiwrap
            with esi.saving(step, checkpoint):  # esiwrap
                save_checkpoint(checkpoint, model, optimizer, step, loss_value, args.save_seconds, frozen)
                # inside the block: leaving it acknowledges, and esiwrap may stop us right after
                print(f"tiny_trainer: saved step {step} to {checkpoint}", flush=True)
    print(f"tiny_trainer: finished at step {args.steps}, loss {loss_value:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
