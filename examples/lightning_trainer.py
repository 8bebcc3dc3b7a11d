"""A Lightning run that checkpoints when esiwrap asks, and resumes where it left off.

    esiwrap --deadline +10m -- python examples/lightning_trainer.py --ckpt-dir ./lightning-run

A tiny regression model on synthetic data, on CPU. The lines marked `# esiwrap` are all the
integration needs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from esiwrap.integrations.lightning import EsiwrapCallback  # esiwrap


class SyntheticRegression(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(16, generator=torch.Generator().manual_seed(index))
        return x, x.sum().sin().unsqueeze(0)


class TinyRegressor(pl.LightningModule):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.step_seconds = step_seconds
        self.first_step: int | None = None  # the first step this run trained (after a resume)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        began = time.monotonic()
        if self.first_step is None:
            self.first_step = self.global_step + 1
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        time.sleep(max(0.0, self.step_seconds - (time.monotonic() - began)))  # a real model's step
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", default="lightning-run")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--devices", type=int, default=1, help="ranks: under torchrun, its --nproc_per_node")
    parser.add_argument("--num-nodes", type=int, default=1, help="nodes: under torchrun, its --nnodes")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    options = parse_args(argv)
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    esiwrap_callback = EsiwrapCallback(dirpath=options.ckpt_dir)  # esiwrap
    trainer = pl.Trainer(
        accelerator="cpu", devices=options.devices, num_nodes=options.num_nodes,
        max_steps=options.max_steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[esiwrap_callback],  # esiwrap
    )
    loader = torch.utils.data.DataLoader(SyntheticRegression(), batch_size=32)
    resume = esiwrap_callback.resume_path()  # esiwrap
    print(f"lightning_trainer: resuming from {resume}" if resume else "lightning_trainer: starting fresh",
          flush=True)
    model = TinyRegressor(options.step_seconds)
    trainer.fit(model, loader, ckpt_path=resume)  # esiwrap
    print(f"lightning_trainer rank {trainer.global_rank}: "
          f"trained steps {model.first_step}..{trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
