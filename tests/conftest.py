from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from esiwrap_harness import EsiwrapRun


@pytest.fixture
def esiwrap() -> Iterator[Callable[..., EsiwrapRun]]:
    """Start `python -m esiwrap ARGS`; every run is killed (whole tree) when the test ends."""
    runs: list[EsiwrapRun] = []

    def start(*args: str, **kwargs: Any) -> EsiwrapRun:
        run = EsiwrapRun(list(args), **kwargs)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill()
