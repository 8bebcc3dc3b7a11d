"""Faults of the metadata token flow and garbled OpenAPI answers, with the real volcenginesdkecs
client against the loopback fakes: a transient answer never blinds the cloud sources for the rest
of the run, and every reason names the real cause."""

from __future__ import annotations

import json
import time

import pytest
from fakes.fixtures import INSTANCE_ID, REGION, SCHEDULED_ID, rfc3339_in
from fakes.metadata import FakeMetadata
from fakes.volcengine_api import FakeVolcengineApi

from esiwrap.sources.chain import ask
from esiwrap.sources.metadata import VOLCENGINE, MetadataClient, Timeouts
from esiwrap.sources.spot import VOLCENGINE_SPOT_PATH, volcengine_spot
from esiwrap.sources.volcengine_api import VolcengineSettings, VolcengineSource
from esiwrap.times import parse_iso

pytestmark = pytest.mark.usefixtures("volcengine_credentials")
ITEMS = {"/latest/instance_id": INSTANCE_ID, "/latest/region_id": REGION}


def client(metadata: FakeMetadata) -> MetadataClient:
    return MetadataClient(metadata.url, VOLCENGINE, Timeouts(connect_s=0.5, read_s=0.5, backoff_s=0.05))


def source(metadata: FakeMetadata | MetadataClient, api: FakeVolcengineApi) -> VolcengineSource:
    imds = metadata if isinstance(metadata, MetadataClient) else client(metadata)
    return VolcengineSource(imds, VolcengineSettings(endpoint=api.url, retries=0))


@pytest.mark.parametrize("status", [429, 500, 503])
def test_one_transient_token_answer_is_retried(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi,
                                               status: int) -> None:
    """The token PUT answered 429 (or 5xx) once: retried after a pause, the token flow stays on,
    and this resolve and the next one both read the deadline with a token."""
    fake_metadata.answer_token_puts(status)
    volc = source(fake_metadata, fake_api)
    first = ask(volc, time.time())
    assert first.deadline is not None, first.reason
    fake_metadata.forget_tokens()  # the next resolve needs a new token: the flow must still be on
    second = ask(volc, time.time())
    assert second.deadline is not None, second.reason
    assert len(fake_metadata.puts()) == 3  # transient, retried, then a fresh one for the second
    gets = fake_metadata.gets("/latest/instance_id")
    assert [h.token_ok for h in gets] == [True, False, True]  # the forgotten token, then a fresh one


def test_token_throttled_past_the_retries_names_the_cause_and_recovers(
        fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """Throttled on every attempt: this resolve says the token request was throttled (not a bare
    401), and the next resolve, with the throttling over, reads the deadline with a token."""
    fake_metadata.answer_token_puts(429, 429)
    volc = source(fake_metadata, fake_api)
    failed = ask(volc, time.time())
    assert failed.deadline is None
    assert "metadata token request failed (HTTP 429 after 2 attempts)" in failed.reason
    assert "needs a token (HTTP 401)" in failed.reason
    recovered = ask(volc, time.time())
    assert recovered.deadline is not None, recovered.reason
    assert fake_metadata.gets("/latest/instance_id")[-1].token_ok


def test_token_request_timing_out_once_is_retried(fake_metadata: FakeMetadata,
                                                  fake_api: FakeVolcengineApi) -> None:
    """The first token PUT gets no answer within the read timeout: retried, the token is used."""
    fake_metadata.delay_token_puts(1.5)
    answer = ask(source(fake_metadata, fake_api), time.time())
    assert answer.deadline is not None, answer.reason
    assert len(fake_metadata.puts()) == 2
    assert all(h.token_ok for h in fake_metadata.gets("/latest/instance_id"))


def test_a_401_fetches_a_fresh_token_once(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """The service forgot our token before its TTL: the 401 brings a fresh token and one retry."""
    imds = client(fake_metadata)
    assert imds.get("/latest/instance_id") == INSTANCE_ID
    fake_metadata.forget_tokens()
    assert imds.get("/latest/instance_id") == INSTANCE_ID
    gets = fake_metadata.gets("/latest/instance_id")
    assert [h.token_ok for h in gets] == [True, False, True]
    assert len(fake_metadata.puts()) == 2


def test_refused_token_is_named(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """Tokens handed out but every GET refuses them: the reason is the refused token, with the
    item, after exactly one fresh token."""
    fake_metadata.reject_tokens = True
    answer = ask(source(fake_metadata, fake_api), time.time())
    assert answer.deadline is None
    assert "metadata token refused: HTTP 401 on http://127.0.0.1:" in answer.reason
    assert "/latest/instance_id with a fresh token" in answer.reason
    assert len(fake_metadata.puts()) == 2
    assert fake_api.calls == []


@pytest.mark.parametrize("status", [403, 404, 405])
def test_definite_refusal_falls_back_to_plain_gets(fake_api: FakeVolcengineApi, status: int) -> None:
    """403/404/405 to the token PUT: this service offers no tokens; plain GETs from then on."""
    with FakeMetadata(ITEMS, require_token=False) as metadata:
        metadata.refuse_tokens_with = status
        volc = source(metadata, fake_api)
        assert ask(volc, time.time()).deadline is not None
        assert ask(volc, time.time()).deadline is not None
        assert len(metadata.puts()) == 1  # asked once, never again
        assert len(metadata.gets("/latest/instance_id")) == 2


def test_refusal_then_a_401_says_both(fake_api: FakeVolcengineApi) -> None:
    """A service that refuses the token PUT (403) yet wants a token on GET: the reason says so."""
    with FakeMetadata(ITEMS) as metadata:
        metadata.refuse_tokens_with = 403
        answer = ask(source(metadata, fake_api), time.time())
    assert "metadata token request failed (refused: HTTP 403), and" in answer.reason
    assert "needs a token (HTTP 401)" in answer.reason


def test_spot_poll_survives_a_throttled_token(fake_metadata: FakeMetadata) -> None:
    """volcengine-spot shares the client: a 429 on the token PUT does not blind its next polls."""
    raw = rfc3339_in(200)
    fake_metadata.set(VOLCENGINE_SPOT_PATH, raw)
    fake_metadata.answer_token_puts(429)
    spot = volcengine_spot(client(fake_metadata), 300.0)
    now = time.time()
    answer = ask(spot, now)
    assert answer.deadline is not None and answer.deadline.at == parse_iso(raw), answer.reason
    fake_metadata.forget_tokens()
    assert ask(spot, now + 5).deadline is not None
    assert [h.token_ok for h in fake_metadata.gets(VOLCENGINE_SPOT_PATH)] == [True, False, True]


@pytest.mark.parametrize(("body", "expected"), [
    (b"<html>502 Bad Gateway</html>", "DescribeScheduledInstances answered unparsable JSON ('<html>502"),
    (b'{"ResponseMetadata": {"RequestId": "x", "Err', "DescribeScheduledInstances answered unparsable JSON"),
    (b"", "DescribeScheduledInstances answered unparsable JSON ('')"),
    (b'["not", "an", "object"]', "DescribeScheduledInstances answered JSON that is not an object"),
    (b'"a string"', "DescribeScheduledInstances answered JSON that is not an object"),
    (b'{"Result": {}}', "DescribeScheduledInstances answered JSON without a ResponseMetadata object"),
    (b'{"ResponseMetadata": "x", "Result": {}}', "without a ResponseMetadata object"),
])
def test_garbled_answer_is_named(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi, body: bytes,
                                 expected: str) -> None:
    """An HTTP 200 that is not the API's JSON envelope: the reason says what came back."""
    fake_api.answer_raw("DescribeScheduledInstances", body)
    answer = ask(source(fake_metadata, fake_api), time.time())
    assert answer.deadline is None
    assert expected in answer.reason, answer.reason
    assert "unexpected" not in answer.reason and "the next refresh tries again" in answer.reason


@pytest.mark.parametrize("result", [
    {"ScheduledInstanceInfo": "esi"},
    {"ScheduledInstanceInfo": [{"ScheduledInstanceId": SCHEDULED_ID, "AutoReleaseAt": 12345}]},
    {"ScheduledInstanceInfo": [{"ScheduledInstanceId": SCHEDULED_ID, "AutoReleaseAt": None}]},
    {"ScheduledInstanceInfo": [{"ScheduledInstanceId": SCHEDULED_ID, "AutoReleaseAt": {"a": 1}}]},
    {"ScheduledInstanceInfo": [17]},
    "not a result",
])
def test_wrong_shapes_are_unavailable_not_crashes(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi,
                                                  result: object) -> None:
    """Well-formed JSON with the wrong types inside: unavailable with a reason a person can read."""
    meta = {"RequestId": "r", "Action": "DescribeScheduledInstances", "Version": "2020-04-01"}
    fake_api.answer_raw("DescribeScheduledInstances",
                        json.dumps({"ResponseMetadata": meta, "Result": result}).encode())
    answer = ask(source(fake_metadata, fake_api), time.time())
    assert answer.deadline is None
    assert answer.reason.startswith(("DescribeScheduledInstances", "scheduled instance")), answer.reason
    assert "unexpected AttributeError" not in answer.reason
