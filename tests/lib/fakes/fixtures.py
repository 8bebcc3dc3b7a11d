"""pytest fixtures for the cloud fakes (loaded by `pytest_plugins` in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from fakes.azure import FakeAzureMetadata
from fakes.gcp import FakeGcpMetadata
from fakes.metadata import AWS_HEADERS, FakeMetadata
from fakes.volcengine_api import ACCESS_KEY, SECRET_KEY, FakeVolcengineApi

INSTANCE_ID = "i-ybo19qc2zqijuuub0001"
SCHEDULED_ID = "esi-yb0d6w0f2uq8qlc0001"
REGION = "cn-beijing"
CREDENTIALS = {"VOLCENGINE_ACCESS_KEY": ACCESS_KEY, "VOLCENGINE_SECRET_KEY": SECRET_KEY,
               "VOLCENGINE_ECS_METADATA_DISABLED": "true"}


def rfc3339_in(seconds: float, offset_hours: int = 8) -> str:
    """Now + seconds as the API writes it, e.g. 2026-11-30T20:30:00+08:00 (or ...Z for offset 0)."""
    zone = timezone(timedelta(hours=offset_hours))
    text = datetime.fromtimestamp(round(time.time() + seconds), tz=zone).isoformat()
    return text.replace("+00:00", "Z")


@pytest.fixture
def volcengine_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake's key pair in this process's environment, where the SDK's default chain looks."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def fake_metadata() -> Iterator[FakeMetadata]:
    """Volcengine's metadata service for one scheduled instance, tokens required."""
    with FakeMetadata({"/latest/instance_id": INSTANCE_ID, "/latest/region_id": REGION}) as fake:
        yield fake


@pytest.fixture
def fake_aws_metadata() -> Iterator[FakeMetadata]:
    with FakeMetadata({"/latest/meta-data/instance-id": "i-0aws"}, headers=AWS_HEADERS) as fake:
        yield fake


@pytest.fixture
def fake_azure() -> Iterator[FakeAzureMetadata]:
    """Azure's IMDS for a Spot VM with no scheduled event yet (not throttled: unit tests ask
    faster than the once a second esiwrap does)."""
    with FakeAzureMetadata(priority="Spot", rate_limit=None) as fake:
        yield fake


@pytest.fixture
def fake_gcp() -> Iterator[FakeGcpMetadata]:
    """The Compute Engine metadata server of a Spot VM, neither preempted nor in maintenance."""
    with FakeGcpMetadata() as fake:
        yield fake


@pytest.fixture
def fake_api() -> Iterator[FakeVolcengineApi]:
    """The ECS OpenAPI knowing our instance as a scheduled instance released in an hour."""
    with FakeVolcengineApi() as fake:
        fake.add_instance(INSTANCE_ID, SCHEDULED_ID, expired_at=rfc3339_in(86400))
        fake.set_release(SCHEDULED_ID, rfc3339_in(3600))
        yield fake


@pytest.fixture
def cloud_env(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> dict[str, str]:
    """Environment for an esiwrap process that talks only to the fakes."""
    return {**CREDENTIALS, "ESIWRAP_METADATA_URL": fake_metadata.url,
            "ESIWRAP_VOLCENGINE_ENDPOINT": fake_api.url}
