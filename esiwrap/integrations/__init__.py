"""Integrations. Zero-code ones (verl) are loaded into the child's Python processes by a
`sitecustomize` bootstrap; the framework callbacks (`transformers`, `lightning`) are imported by
the user's script and import their framework only when used.

The supervisor puts `esiwrap.paths.bootstrap_dir()` first on the child's `PYTHONPATH`. In every
Python process of the child tree, the bootstrap calls `activate()`, which does nothing unless
esiwrap's socket (`ESIWRAP_SOCKET`) or a Ray relay (`ESIWRAP_RELAY`) is in the environment. Nothing heavy is
imported here: verl is patched by a post-import hook only when its trainer modules are imported.
"""

from __future__ import annotations

import os

from esiwrap.envvars import CHAINED_RAY_ENV_HOOK, HOOK_SWITCH_ENV, RELAY_ENV, SOCKET_ENV
from esiwrap.integrations.verl_hooks import install_verl_hooks
from esiwrap.integrations.verl_modules import (
    VERL_LEGACY_MODULES,
    VERL_METRICS_MODULE,
    VERL_TRAINER_MODULES,
    VERL_V1_MODULE,
)

__all__ = [
    "HOOK_SWITCH_ENV",
    "RELAY_ENV",
    "VERL_LEGACY_MODULES",
    "VERL_METRICS_MODULE",
    "VERL_TRAINER_MODULES",
    "VERL_V1_MODULE",
    "activate",
    "install_verl_hooks",
]

RAY_ENV_HOOK = "RAY_RUNTIME_ENV_HOOK"
OUR_RAY_ENV_HOOK = "esiwrap.integrations.ray_relay.runtime_env_hook"


def activate() -> None:
    """Called by the bootstrap at interpreter start-up; cheap and silent when not under esiwrap."""
    if os.environ.get(HOOK_SWITCH_ENV, "1") == "0":
        return
    if os.environ.get(SOCKET_ENV):
        _chain_ray_runtime_env_hook()
    if os.environ.get(RELAY_ENV):  # a Ray worker of esiwrap's job on a cluster the driver started
        from esiwrap.integrations import ray_relay

        ray_relay.prepare_worker()
    elif os.environ.get(SOCKET_ENV):  # no relay (yet, or ever: `uv run` skips Ray's env hook)
        install_verl_hooks()


def _chain_ray_runtime_env_hook() -> None:
    """Make a Ray driver call our hook in `ray.init`, keeping a user's hook to call after ours."""
    current = os.environ.get(RAY_ENV_HOOK, "")
    if current == OUR_RAY_ENV_HOOK:
        return
    if current:
        os.environ[CHAINED_RAY_ENV_HOOK] = current
    os.environ[RAY_ENV_HOOK] = OUR_RAY_ENV_HOOK
