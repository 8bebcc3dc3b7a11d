"""The post-import hooks that patch verl's trainer modules when, and if, they are imported."""

from __future__ import annotations

from esiwrap.integrations.verl_modules import VERL_TRAINER_MODULES

TYPE_CHECKING = False  # imported at start-up: the typing module only for mypy
if TYPE_CHECKING:
    from types import ModuleType

_installed = False


def install_verl_hooks() -> None:
    """Patch verl's trainer modules if and when they are imported; the patching code itself is
    loaded only then (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    from esiwrap.integrations.importhook import when_imported

    for name in VERL_TRAINER_MODULES:
        when_imported(name, _patch_verl_module)


def _patch_verl_module(module: ModuleType) -> None:
    from esiwrap.integrations import verl

    verl.patch_module(module)
