"""A one-rank gloo process group on a free loopback port, and verl's FSDP checkpoint manager over a
model trained one step, for the child scripts that write real verl checkpoints on CPU
(verl_checkpoint_driver.py, verl_save_driver.py)."""

from __future__ import annotations

import os
import socket
from typing import Any


def init_process_group() -> None:
    with socket.socket() as probe:  # a free port for the one-rank process group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    import torch.distributed as dist

    dist.init_process_group("gloo")


def fsdp_checkpoint_manager(model: Any, vocab_size: int) -> tuple[Any, Any]:
    """`model` sharded with FSDP2 (each layer, then the whole) over the one-rank group, one AdamW
    step taken, and verl's `FSDPCheckpointManager` for it saving model, optimizer and extra: the
    manager, and the optimizer."""
    import torch
    from omegaconf import OmegaConf
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    mesh = init_device_mesh("cpu", (1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab_size, (2, 8))
    model(tokens, labels=tokens).loss.backward()
    optimizer.step()
    saved = ["model", "optimizer", "extra"]
    manager = FSDPCheckpointManager(model, optimizer, None, processing_class=None,
                                    checkpoint_config=OmegaConf.create({"save_contents": saved,
                                                                        "load_contents": saved}))
    return manager, optimizer
