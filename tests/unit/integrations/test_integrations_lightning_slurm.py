"""Lightning's SLURM auto-requeue and esiwrap's save signal, in one real Lightning `fit`."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from torch import nn

import esiwrap.trainer as esi
from esiwrap.integrations.lightning import EsiwrapCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SlurmWarnsAt(pl.Callback):
    """Plays SLURM: sends SIGUSR1 to this process after batch `batch`, noting who handles it."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.handler: Any = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.batch:
            self.handler = signal.getsignal(signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR1)


def test_shared_sigusr1_becomes_an_esiwrap_save_not_a_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With SLURM auto-requeue on and esiwrap's signal also SIGUSR1, esiwrap's handler is installed
    first (in `setup`), so Lightning does not install its requeue handler: SIGUSR1 saves through
    the callback at the next batch end, nothing is requeued, a warning names `--signal SIGUSR2`,
    and the previous handler is back after `fit`."""
    for name, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7",
                        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ESIWRAP_SOCKET", raising=False)
    monkeypatch.delenv("ESIWRAP_SIGNAL", raising=False)
    before = signal.getsignal(signal.SIGUSR1)
    slurm, esiwrap_cb = SlurmWarnsAt(batch=2), EsiwrapCallback(dirpath=tmp_path)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        plugins=[SLURMEnvironment(auto_requeue=True)], callbacks=[slurm, esiwrap_cb],
    )
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    with caplog.at_level(logging.INFO):
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))

    assert slurm.handler is not None and getattr(slurm.handler, "__module__", "") == esi.__name__
    saved = torch.load(tmp_path / "esiwrap-last.ckpt", weights_only=False)
    assert saved["global_step"] == 2
    assert "Handling auto-requeue signal" not in caplog.text
    assert "--signal SIGUSR2" in caplog.text
    assert signal.getsignal(signal.SIGUSR1) == before
