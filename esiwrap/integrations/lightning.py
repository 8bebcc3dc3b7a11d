"""Lightning: one callback turns esiwrap's save signal into `trainer.save_checkpoint(...)`.

    from esiwrap.integrations.lightning import EsiwrapCallback
    esiwrap_cb = EsiwrapCallback(dirpath="checkpoints")
    trainer = L.Trainer(callbacks=[esiwrap_cb])
    trainer.fit(model, ckpt_path=esiwrap_cb.resume_path())

It tells esiwrap what a checkpoint holds before the first save (the module's and the optimizers'
tensors, where checkpoints go, the checkpoint it resumes from), so the first save is planned from
the checkpoint's size and the storage's speed. At every `on_train_batch_end` it reports the
boundary (`trainer.global_step`); when a save was requested (on any rank: the flag is
all-reduced) every rank calls `trainer.save_checkpoint` (as distributed strategies require),
rank 0 renames the finished file over `esiwrap-last.ckpt`, and the save is acknowledged after
that: only rank 0 takes part in the acknowledgement. Works with
`lightning.pytorch` or the older `pytorch_lightning` package, whichever is installed.

Stopping needs nothing from us: Lightning already ends `fit` gracefully on SIGTERM (every rank
agreeing), and esiwrap sends SIGTERM once the checkpoint is acknowledged.

SLURM: with auto-requeue, Lightning handles SIGUSR1 itself (save an "hpc" checkpoint, requeue the
job) unless a handler is already there. This callback registers esiwrap's handler first, in
`setup`, so a shared SIGUSR1 means an esiwrap save and no requeue; it warns, and
`esiwrap --signal SIGUSR2` keeps both (esiwrap exports its choice as `ESIWRAP_SIGNAL`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # the standalone package of Lightning 1.x/2.x
    from pytorch_lightning import Callback, LightningModule, Trainer  # type: ignore[assignment]

import esiwrap.trainer as esi

__all__ = ["EsiwrapCallback"]

LAST_NAME = "esiwrap-last.ckpt"
_log = logging.getLogger(__name__)


class EsiwrapCallback(Callback):
    """Checkpoint to `dirpath/esiwrap-last.ckpt` at the batch boundary esiwrap asks for."""

    def __init__(self, dirpath: str | os.PathLike[str] = "checkpoints", filename: str = LAST_NAME) -> None:
        super().__init__()
        self.path = Path(dirpath) / filename

    def resume_path(self) -> str | None:
        """The checkpoint to pass as `fit(ckpt_path=...)`: the last esiwrap save, if any."""
        return str(self.path) if self.path.is_file() else None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        esi.install(saves=bool(trainer.is_global_zero), integration="lightning",
                    checkpoint_bytes=esi.checkpoint_bytes(pl_module) if trainer.is_global_zero else None,
                    checkpoint_dir=self.path.parent, resumed_from=self.resume_path())
        _warn_on_shared_requeue_signal(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The optimizers exist now: the checkpoint's size with their state (what rank 0 writes)."""
        if trainer.is_global_zero:
            esi.report_checkpoint_bytes(esi.checkpoint_bytes(pl_module, list(trainer.optimizers)))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        esi.step_done(step)
        if not esi.save_requested():
            return
        with esi.saving(step, self.path):
            partial = self.path.with_name(self.path.name + ".partial")
            trainer.save_checkpoint(partial)  # every rank: strategies gather state and barrier
            if trainer.is_global_zero:
                _replace_durably(partial, self.path)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            esi.uninstall()


def _replace_durably(partial: Path, final: Path) -> None:
    """Rename the finished file over the last one, so `final` is always a whole checkpoint."""
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, final)
    directory = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _warn_on_shared_requeue_signal(trainer: Trainer) -> None:
    connector = getattr(trainer, "_accelerator_connector", None)
    environment = getattr(connector, "cluster_environment", None)
    if not getattr(environment, "auto_requeue", False):
        return
    requeue = getattr(environment, "requeue_signal", None)
    if requeue is not None and int(requeue) == esi.installed_signal():
        _log.warning("esiwrap: Lightning's SLURM auto-requeue also uses %s; esiwrap's save handler "
                     "takes it (no requeue). Run esiwrap --signal SIGUSR2 to keep both.",
                     getattr(requeue, "name", requeue))
