"""A multi-rank PyTorch DDP loop under torchrun: every rank saves the same step when esiwrap asks.

    esiwrap --deadline +10m -- torchrun --nproc_per_node=2 examples/ddp_trainer.py --ckpt-dir ./ddp-run

Runs on CPU with the gloo backend. Every rank calls `install()`, so esiwrap signals every rank;
`save_requested()` all-reduces the flag, so all ranks agree on the step. `--save-ranks all`: each
rank writes its own shard and esiwrap acknowledges once all have; `--save-ranks rank0`: rank 0
writes the (replicated) model alone and the others declare `saves=False`.

Every rank enters `esi.saving()`, writers or not: its end waits for all ranks, so no rank (on any
node) acknowledges before the checkpoint is complete. Several nodes, one esiwrap per node:

    esiwrap -- torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint HEAD:29400 --rdzv-id job1 examples/ddp_trainer.py --save-ranks rank0
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import esiwrap.trainer as esi


def save_atomically(state: dict[str, object], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", type=Path, default=Path("ddp-run"))
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--step-seconds", type=float, default=0.3)
    parser.add_argument("--save-ranks", choices=("all", "rank0"), default="all")
    parser.add_argument("--save-seconds", type=float, default=0.0,
                        help="a slow write: writers wait this long before writing (a large model)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    options = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    writes = options.save_ranks == "all" or rank == 0
    path = options.ckpt_dir / (f"rank{rank}.pt" if options.save_ranks == "all" else "model.pt")
    esi.install(saves=writes)  # esiwrap: every rank registers; only writers acknowledge
    for step in range(1, options.steps + 1):
        began = time.monotonic()
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(step * 100 + rank))
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin())
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients: ranks stay in lockstep
        optimizer.step()
        time.sleep(max(0.0, options.step_seconds - (time.monotonic() - began)))
        esi.step_done(step)  # esiwrap
        if esi.save_requested():  # esiwrap: the same answer on every rank
            with esi.saving(step, path):  # esiwrap
                if writes:
                    time.sleep(options.save_seconds)
                    save_atomically({"model": model.module.state_dict(), "step": step}, path)
                # Said inside the block: once it ends, the acknowledgement may stop the job at once.
                print(f"ddp_trainer rank {rank}: saved step {step}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
