"""A one-rank gloo process group on a free loopback port, for the child scripts that run verl's
FSDP checkpoint manager on CPU (verl_checkpoint_driver.py, verl_save_driver.py)."""

from __future__ import annotations

import os
import socket


def init_process_group() -> None:
    with socket.socket() as probe:  # a free port for the one-rank process group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    import torch.distributed as dist

    dist.init_process_group("gloo")
