"""Real verl checkpoints, on CPU, written by verl's own trainer-level `_save_checkpoint`.

    python tests/lib/verl_save_driver.py WORKDIR

As tests/lib/verl_checkpoint_driver.py: a tiny Llama from a config (no download), loaded in fp32,
FSDP2 over a one-rank gloo group, one AdamW step, verl's `FSDPCheckpointManager` (model, optimizer
and extra saved). Then `RayPPOTrainer._save_checkpoint` runs for steps 1 and 2 on a stand-in
trainer (its config, step counter, the worker group's `save_checkpoint`, a `StatefulDataLoader`)
with `trainer.max_actor_ckpt_to_keep=1`. WORKDIR/ckpt then holds what verl leaves: global_step_1
rotated out (verl removed its actor/, data.pt stays), global_step_2 whole, and
latest_checkpointed_iteration.txt naming 2. Prints one JSON line: every file and its size.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import one_rank


def main(workdir: str) -> int:
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    one_rank.init_process_group()
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    manager, _optimizer = one_rank.fsdp_checkpoint_manager(model, config.vocab_size)
    root = os.path.join(workdir, "ckpt")

    def save_checkpoint(local_path: str, hdfs_path: str | None, global_step: int,
                        max_ckpt_to_keep: int | None = None) -> None:  # the worker group's call
        manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep=max_ckpt_to_keep)

    trainer = SimpleNamespace(
        config=OmegaConf.create({
            "trainer": {"default_local_dir": root, "default_hdfs_dir": None, "max_actor_ckpt_to_keep": 1},
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
        }),
        actor_rollout_wg=SimpleNamespace(save_checkpoint=save_checkpoint),
        use_critic=False,
        train_dataloader=StatefulDataLoader(list(range(16)), batch_size=4),
    )
    for step in (1, 2):
        trainer.global_steps = step
        RayPPOTrainer._save_checkpoint(trainer)
    files = {os.path.relpath(os.path.join(r, f), root): os.path.getsize(os.path.join(r, f))
             for r, _dirs, names in os.walk(root) for f in names}
    print(json.dumps({"root": root, "files": files}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
