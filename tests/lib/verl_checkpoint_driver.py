"""A real verl FSDP checkpoint of a tiny model, on CPU, to check esiwrap's size estimate against.

    python tests/lib/verl_checkpoint_driver.py WORKDIR

Builds a tiny Llama from a config (no download), saves it to WORKDIR/model as a Hugging Face model
directory in bfloat16, loads it as verl's actor does (fp32, FSDP2 over a one-rank gloo group), takes
one AdamW step and writes a checkpoint with verl's own `FSDPCheckpointManager` (save_contents
model, optimizer, extra) to WORKDIR/ckpt/global_step_1/actor. Prints one JSON line: the bytes on
disk of every file, and the parameter count.
"""

from __future__ import annotations

import json
import os
import sys

import one_rank


def main(workdir: str) -> int:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    one_rank.init_process_group()
    model_dir = os.path.join(workdir, "model")
    config = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, torch_dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)  # verl: fp32 actor
    manager, _optimizer = one_rank.fsdp_checkpoint_manager(model, config.vocab_size)
    root = os.path.join(workdir, "ckpt", "global_step_1")
    manager.save_checkpoint(os.path.join(root, "actor"), global_step=1)
    files = {os.path.relpath(os.path.join(r, f), root): os.path.getsize(os.path.join(r, f))
             for r, _dirs, names in os.walk(root) for f in names}
    params = sum(p.numel() for p in model.parameters())
    total = sum(files.values())
    print(json.dumps({"files": files, "total": total, "params": params, "model_dir": model_dir}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
