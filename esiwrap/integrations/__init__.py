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

TYPE_CHECKING = False  # loaded at interpreter start-up: the typing machinery only for mypy
if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "HOOK_SWITCH_ENV",
    "RELAY_ENV",
    "VERL_LEGACY_MODULES",
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


# The verl modules whose names the verl hook patches (`esiwrap.integrations.verl`).
VERL_LEGACY_MODULES = (  # RayPPOTrainer.fit, and the experimental trainers built on it
    "verl.trainer.ppo.ray_trainer",
    "verl.experimental.separation.ray_trainer",
    "verl.experimental.fully_async_policy.fully_async_trainer",
)
VERL_V1_MODULE = "verl.trainer.ppo.v1.trainer_base"  # PPOTrainer, the default loop
VERL_TRAINER_MODULES = (*VERL_LEGACY_MODULES, VERL_V1_MODULE)
_verl_hooks_installed = False


def install_verl_hooks() -> None:
    """Patch verl's trainer modules if and when they are imported; the patching code itself is
    loaded only then (idempotent)."""
    global _verl_hooks_installed
    if _verl_hooks_installed:
        return
    _verl_hooks_installed = True
    from esiwrap.integrations.importhook import when_imported

    for name in VERL_TRAINER_MODULES:
        when_imported(name, _patch_verl_module)


def _patch_verl_module(module: ModuleType) -> None:
    from esiwrap.integrations import verl

    verl.patch_module(module)


def _chain_ray_runtime_env_hook() -> None:
    """Make a Ray driver call our hook in `ray.init`, keeping a user's hook to call after ours."""
    current = os.environ.get(RAY_ENV_HOOK, "")
    if current == OUR_RAY_ENV_HOOK:
        return
    if current:
        os.environ[CHAINED_RAY_ENV_HOOK] = current
    os.environ[RAY_ENV_HOOK] = OUR_RAY_ENV_HOOK
