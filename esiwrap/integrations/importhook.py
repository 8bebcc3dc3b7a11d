"""Run a callback right after a named module is imported, without importing it ourselves.

A meta-path finder that, for the watched names only, asks the other finders for the spec and wraps
its loader so the callbacks run once `exec_module` has finished. Everything else passes through
untouched, so the cost for unrelated imports is one dict lookup.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs milliseconds at every interpreter start: annotations only
if TYPE_CHECKING:
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

    Callback = Callable[[ModuleType], None]

_callbacks: dict[str, list[Callback]] = {}


def when_imported(name: str, callback: Callback) -> None:
    """Call `callback(module)` after `name` is imported (at once when it already is)."""
    # No lock: registration happens at start-up, and Python's import lock serializes the loads.
    module = sys.modules.get(name)
    if module is None:
        _callbacks.setdefault(name, []).append(callback)
        _ensure_finder()
    else:
        _run([callback], module)


def _ensure_finder() -> None:
    if not any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def _run(callbacks: Sequence[Callback], module: ModuleType) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # a broken hook must never break the user's import
            print(f"esiwrap: hook for {module.__name__} failed: {exc!r}", file=sys.stderr)


class _PostImportFinder:  # a MetaPathFinder (the ABC itself is not needed)
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CallbackLoader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


class _CallbackLoader:  # an importlib Loader
    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._wrapped.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._wrapped.exec_module(module)
        _run(_callbacks.pop(module.__name__, []), module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._wrapped, name)
