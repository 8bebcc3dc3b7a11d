"""The suite's two lanes, kept by the suite itself.

The system lane (`pytest -m system`) is every test that starts a real process: esiwrap, a
trainer, a `python -c`, Slurm, systemd, Chromium, Ray, the wheel's venv, the docs build. The fast
lane (`pytest -m "not system"`) is the rest: pure and in-process tests (loopback fakes on threads,
the decision core, parsers, hypothesis). `scripts/test.sh` runs the fast lane, then the system
lane; `scripts/test.sh --fast` the fast lane alone.

A test is in the system lane when it uses a fixture that starts processes (PROCESS_FIXTURES: it
is marked at collection, nothing to remember), or carries `pytest.mark.system` itself or in its
module's `pytestmark` (a module whose own fixtures start processes). A test of the fast lane that
starts a process anyway fails, naming the command: the fast lane stays fast and free of the
scheduler's delays because the suite checks it, not because someone remembered.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

SYSTEM = "system"
PROCESS_FIXTURES = frozenset({
    "esiwrap",  # conftest: `python -m esiwrap ...`
    "runs",  # conftest (and test_upload.py's own): runs a test launches itself
    "wall_clock",  # tests/lib/faketime.py: compiles its shim, probes each step with a process
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(SYSTEM)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item, "teardown"))


def _guarded(item: pytest.Item, phase: str) -> Generator[None, None, None]:
    """Run one phase of a fast-lane test with every way of starting a process watched; fail the
    phase when one was started (the process itself is let run: the test's own outcome is kept)."""
    if item.get_closest_marker(SYSTEM) is not None:
        return (yield)
    started: list[str] = []
    with _SpawnWatch(started):
        result = yield
    if started:
        pytest.fail(
            f"{item.nodeid} is in the fast lane but its {phase} started a process: {started[0]}"
            f"{f' (and {len(started) - 1} more)' if len(started) > 1 else ''}. Mark it "
            "`@pytest.mark.system` (or its module: `pytestmark = pytest.mark.system`), or use the "
            "`esiwrap`/`runs` fixture (tests/lib/lanes.py).", pytrace=False)
    return result


class _SpawnWatch:
    """Replace the process-starting functions of os, subprocess and _posixsubprocess (what
    multiprocessing uses) with ones that note the command, then start it as asked."""

    def __init__(self, started: list[str]) -> None:
        self.started = started
        self.saved: list[tuple[Any, str, Callable[..., Any]]] = []

    def __enter__(self) -> None:
        self._wrap(subprocess, "_fork_exec", lambda args, *_: args)
        self._wrap(_posixsubprocess, "fork_exec", lambda args, *_: args)
        for name in ("posix_spawn", "posix_spawnp"):
            self._wrap(os, name, lambda path, argv, *_: list(argv))
        for name in ("fork", "forkpty"):
            self._wrap(os, name, lambda *_: "a fork of the test process")
        self._wrap(os, "system", lambda command, *_: command)

    def __exit__(self, *exc: object) -> None:
        for module, name, original in reversed(self.saved):
            setattr(module, name, original)
        self.saved.clear()

    def _wrap(self, module: Any, name: str, describe: Callable[..., Any]) -> None:
        original = getattr(module, name, None)
        if original is None:
            return
        started = self.started

        def noting(*args: Any, **kwargs: Any) -> Any:
            try:
                what = describe(*args)
            except Exception:  # a form of the call the description does not know: still a process
                what = name
            started.append(_command(what))
            return original(*args, **kwargs)

        self.saved.append((module, name, original))
        setattr(module, name, noting)


def _command(what: Any) -> str:
    if isinstance(what, bytes):
        what = os.fsdecode(what)
    if isinstance(what, (list, tuple)):
        what = " ".join(os.fsdecode(part) if isinstance(part, bytes) else str(part) for part in what)
    return repr(str(what)[:200])
