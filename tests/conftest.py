from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import freezegun
import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))  # the helpers and plugins: tests/lib/

import esiwrap_harness
from esiwrap_harness import EsiwrapRun

# No test may reach a real cloud metadata address (100.96.0.96, 169.254.169.254,
# metadata.google.internal): by default every esiwrap started by a test is pointed at a closed
# loopback port; tests that need a metadata service start a loopback fake and pass its URL.
NO_METADATA_URL = "http://127.0.0.1:9"
os.environ["ESIWRAP_METADATA_URL"] = NO_METADATA_URL
os.environ["ESIWRAP_AWS_METADATA_URL"] = NO_METADATA_URL
os.environ["ESIWRAP_AZURE_METADATA_URL"] = NO_METADATA_URL
os.environ["ESIWRAP_GCP_METADATA_URL"] = NO_METADATA_URL
os.environ["VOLCENGINE_ECS_METADATA_DISABLED"] = "true"  # the SDK's IAM-role credential lookup

# freezegun patches time functions by scanning every loaded module; the frameworks some tests load
# into this process (Lightning pulls transformers' lazy modules) crash that scan. They never need
# frozen time, so it skips them.
freezegun.configure(extend_ignore_list=[
    "torch", "lightning", "pytorch_lightning", "lightning_utilities", "transformers", "accelerate",
    "ray", "verl", "numpy", "safetensors", "tokenizers", "huggingface_hub",
])

# Property tests say what holds for every input, never how fast: no per-example deadline (200 ms by
# default) and no too-slow health check, wall-clock limits that a busy machine breaks.
settings.register_profile("esiwrap", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("esiwrap")

# esiwrap keeps what its caller ignored (docs/reference/signals.md). A suite started as a background job of
# a shell without job control inherits SIGINT and SIGQUIT ignored, and every esiwrap it starts
# would too: tests that need them (a second SIGINT, a Ray driver stopped with SIGINT) start from
# the defaults a terminal gives. Tests of the ignored case set it up themselves (nohup, sh -c '&').
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
for _signum in (signal.SIGQUIT, signal.SIGHUP):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, signal.SIG_DFL)

pytest_plugins = [
    "fakes.fixtures",  # fake_metadata, fake_api, cloud_env, ... (tests/lib/fakes/)
    "lanes",  # the fast lane and the system lane (tests/lib/lanes.py)
    "faketime",  # wall_clock: steps the wall clock of real processes (tests/lib/faketime.py)
]


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


@pytest.fixture
def runs() -> Iterator[list[EsiwrapRun]]:
    """A list for runs a test starts itself (its own launcher, arguments); each is killed (whole
    tree) when the test ends."""
    started: list[EsiwrapRun] = []
    yield started
    for run in started:
        run.kill()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    esiwrap_harness.STARTED.clear()  # runs a module-scoped fixture starts are reported with its first test


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with each esiwrap run's events (a failure under load is read
    from these: what came, when, and what never did)."""
    report = yield
    if report.failed:
        for run in esiwrap_harness.STARTED:
            report.sections.append((f"esiwrap run {run.pid}: {' '.join(run.args)[:300]}", run.story()))
    return report
