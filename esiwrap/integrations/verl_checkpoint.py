"""What a verl checkpoint will hold, estimated from the run's config before the first save.

verl's FSDP checkpoint (`global_step_N/actor`, `.../critic`) is, per worker, its shard of what
`checkpoint.save_contents` names: `model` (the trained parameters in `fsdp_config.model_dtype`,
fp32 by default), `optimizer` (AdamW: two tensors per parameter, in the parameters' dtype),
`hf_model` (the whole model again, gathered) and `extra` (scheduler and RNG: small). The number
of parameters comes from the model directory: the safetensors index's `total_size`, else the
weight files' sizes, divided by the bytes per parameter of the dtype they are stored in
(`config.json`'s `torch_dtype`). A critic (verl's `need_critic`: `critic.enable`, else a GAE
estimator) adds its own. A model that is not a local directory (a hub id) gives no estimate.
"""

from __future__ import annotations

import json
import os
from typing import Any

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "half": 2, "float64": 8, "fp64": 8}
OPTIMIZER_TENSORS = {"adamw": 2, "adam": 2, "sgd": 1, "adafactor": 1}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def estimate_checkpoint_bytes(config: Any) -> tuple[int | None, str]:
    """(bytes a checkpoint of this run holds, how the figure was made), or (None, why not)."""
    parts = []
    total = 0
    roles = [("actor", "actor_rollout_ref.model.path", "actor_rollout_ref.actor")]
    if _needs_critic(config):
        roles.append(("critic", "critic.model.path", "critic"))
    for role, path_key, section in roles:
        params, how = model_parameters(_select(config, path_key))
        if params is None:
            return None, f"{role}: {how}"
        nbytes, contents = role_bytes(params, config, section)
        total += nbytes
        parts.append(f"{role} {params / 1e9:.3g}B parameters ({how}), {'+'.join(contents) or 'nothing'}")
    return total, "; ".join(parts)


def role_bytes(params: int, config: Any, section: str) -> tuple[int, list[str]]:
    """What one role's checkpoint holds for `params` parameters, and which contents."""
    contents = [str(c) for c in (_select(config, f"{section}.checkpoint.save_contents") or
                                 ["model", "optimizer", "extra"])]
    dtype = str(_select(config, f"{section}.fsdp_config.model_dtype") or "fp32").lower()
    per_param = DTYPE_BYTES.get(dtype, 4)
    optimizer = str(_select(config, f"{section}.optim.optimizer") or "AdamW").lower()
    nbytes = 0
    if "model" in contents:
        nbytes += params * per_param
    if "optimizer" in contents:
        nbytes += params * per_param * OPTIMIZER_TENSORS.get(optimizer, 2)
    if "hf_model" in contents:
        nbytes += params * per_param
    return nbytes, contents


def model_parameters(path: Any) -> tuple[int | None, str]:
    """The model directory's parameter count, and how it was read: the safetensors files' headers
    (exact), else an index's total_size or the weight files' sizes over the stored dtype's bytes."""
    if not isinstance(path, str) or not path:
        return None, "no model path in the config"
    directory = os.path.expanduser(path)
    if not os.path.isdir(directory):
        return None, f"{path} is not a local directory"
    tensors = [e.path for e in _entries(directory) if e.name.endswith(".safetensors") and e.is_file()]
    counted = [_safetensors_parameters(t) for t in tensors]
    if counted and all(c is not None for c in counted):
        return sum(c for c in counted if c is not None), f"{len(tensors)} safetensors header(s)"
    model_config = _read_json(os.path.join(directory, "config.json"))
    stored = DTYPE_BYTES.get(str(model_config.get("torch_dtype") or model_config.get("dtype")), 4)
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        size = _read_json(os.path.join(directory, index)).get("metadata", {}).get("total_size")
        if isinstance(size, (int, float)) and size > 0:
            return int(size) // stored, f"{index} total_size"
    weights = [e for e in _entries(directory) if e.name.endswith(WEIGHT_SUFFIXES) and e.is_file()]
    size = sum(e.stat().st_size for e in weights)
    if size <= 0:
        return None, f"no weight files in {path}"
    return size // stored, f"{len(weights)} weight file(s)"


MAX_HEADER_BYTES = 100 << 20


def _safetensors_parameters(path: str) -> int | None:
    """The element count of every tensor a safetensors file holds, from its header alone (an
    8-byte little-endian length, then JSON: name -> dtype, shape, offsets)."""
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if not 0 < length <= MAX_HEADER_BYTES:
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    total = 0
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        count = 1
        for dim in entry.get("shape", []):
            count *= int(dim)
        total += count
    return total


def _needs_critic(config: Any) -> bool:
    enable = _select(config, "critic.enable")
    if enable is not None:
        return bool(enable)
    return str(_select(config, "algorithm.adv_estimator") or "").lower() == "gae"


def _select(config: Any, dotted: str) -> Any:
    """`config.a.b.c`, or None where any part is missing (OmegaConf or plain mappings)."""
    node = config
    for key in dotted.split("."):
        try:
            node = node[key] if isinstance(node, dict) else getattr(node, key)
        except (AttributeError, KeyError, TypeError):
            try:
                node = node.get(key)
            except Exception:
                return None
        except Exception:  # OmegaConf's missing or interpolation errors
            return None
        if node is None:
            return None
    return node


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _entries(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except OSError:
        return []
