"""The `volcengine` source: the real volcenginesdkecs client against loopback fakes of the ECS
OpenAPI and the metadata service. Every failure is a reason a person can act on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fakes.fixtures import INSTANCE_ID, REGION, SCHEDULED_ID, rfc3339_in
from fakes.metadata import FakeMetadata
from fakes.network import Blackhole, Silent, closed_port_url
from fakes.volcengine_api import ACCESS_DENIED, THROTTLED, Failure, FakeVolcengineApi
from thread_clock import waited

from esiwrap.sources.chain import ask
from esiwrap.sources.metadata import VOLCENGINE, MetadataClient, Timeouts
from esiwrap.sources.volcengine_api import INSTALL_HINT, VolcengineSettings, VolcengineSource
from esiwrap.times import parse_iso

pytestmark = pytest.mark.usefixtures("volcengine_credentials")


def source(metadata_url: str, api: FakeVolcengineApi | None,
           **settings: float | str | None) -> VolcengineSource:
    client = MetadataClient(metadata_url, VOLCENGINE, Timeouts(connect_s=0.5, read_s=0.5))
    endpoint = api.url if api is not None else closed_port_url()
    return VolcengineSource(client, VolcengineSettings(endpoint=endpoint, **settings))  # type: ignore[arg-type]


def test_happy_path_reads_auto_release_at(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """Metadata (token flow) gives the instance and region; two signed API calls give the release time."""
    raw = rfc3339_in(5400)
    fake_api.set_release(SCHEDULED_ID, raw)
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is not None, answer.reason
    assert answer.deadline.at == parse_iso(raw)
    assert answer.deadline.raw == raw
    assert answer.deadline.detail["scheduled_instance_id"] == SCHEDULED_ID
    assert answer.deadline.detail["instance_id"] == INSTANCE_ID
    assert "expired_at" in answer.deadline.detail
    assert fake_api.actions() == ["DescribeInstances", "DescribeScheduledInstances"]
    first, second = fake_api.calls
    assert first.params["InstanceIds.1"] == INSTANCE_ID
    assert second.params["ScheduledInstanceIds.1"] == SCHEDULED_ID
    assert all(c.version == "2020-04-01" and c.signed and c.region == REGION and c.service == "ecs"
               for c in fake_api.calls)
    assert [h.method for h in fake_metadata.hits][:1] == ["PUT"]
    assert all(h.token_ok for h in fake_metadata.gets("/latest/instance_id"))


@pytest.mark.parametrize("raw", ["2026-12-01T08:00:00+08:00", "2026-12-01T00:00:00Z",
                                 "2026-12-01T00:00:00.123456789Z", "2026-11-30T19:00:00-05:00"])
def test_rfc3339_with_offset_or_z(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi, raw: str) -> None:
    """Every RFC 3339 form the API may write is the same instant in UTC."""
    fake_api.set_release(SCHEDULED_ID, raw)
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is not None, answer.reason
    assert abs(answer.deadline.at - 1796083200.0) < 1.0


def test_region_override_skips_the_metadata_item(fake_metadata: FakeMetadata,
                                                 fake_api: FakeVolcengineApi) -> None:
    """--volcengine-region wins over the metadata's region_id, and the request is signed for it."""
    fake_metadata.set("/latest/region_id", None)
    answer = ask(source(fake_metadata.url, fake_api, region="cn-shanghai"), time.time())
    assert answer.deadline is not None, answer.reason
    assert {c.region for c in fake_api.calls} == {"cn-shanghai"}


def test_not_a_scheduled_instance(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """An ordinary instance has no ScheduledInstanceId: the source does not apply (info level)."""
    fake_api.add_instance(INSTANCE_ID, scheduled_instance_id="")
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is None
    assert "not an elastic scheduled instance" in answer.reason
    assert answer.expected
    assert fake_api.actions() == ["DescribeInstances"]
    assert answer.capacity == "on-demand"  # SpotStrategy NoSpot


@pytest.mark.parametrize("strategy", ["SpotAsPriceGo", "SpotWithPriceLimit"])
def test_a_spot_instance_says_so_before_any_notice(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi,
                                                    strategy: str) -> None:
    """DescribeInstances' SpotStrategy marks a spot instance: its answer has no deadline (no
    notice yet) but says the capacity is spot, which sets the periodic saves' rate."""
    fake_api.add_instance(INSTANCE_ID, scheduled_instance_id="", spot_strategy=strategy)
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is None and answer.capacity == "spot"


def test_a_scheduled_instances_end_is_reserved_capacity(fake_metadata: FakeMetadata,
                                                        fake_api: FakeVolcengineApi) -> None:
    """An elastic scheduled instance's AutoReleaseAt is the end of a reservation."""
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is not None and answer.capacity == "reserved"


def test_access_denied_names_the_permissions(fake_metadata: FakeMetadata,
                                             fake_api: FakeVolcengineApi) -> None:
    """AccessDenied: the reason names the two permissions the credentials need."""
    fake_api.state.failure = ACCESS_DENIED
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is None and not answer.expected
    assert "AccessDenied" in answer.reason
    assert "lack ecs:DescribeInstances and ecs:DescribeScheduledInstances" in answer.reason
    assert len(fake_api.calls) == 1  # not retried


def test_unauthorized_operation_is_a_permission_problem(fake_metadata: FakeMetadata,
                                                        fake_api: FakeVolcengineApi) -> None:
    """UnauthorizedOperation reads the same as AccessDenied."""
    fake_api.state.failure = Failure("UnauthorizedOperation", 403, "not allowed")
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert "lack ecs:DescribeInstances" in answer.reason


def test_wrong_secret_key_is_refused_by_the_signature_check(fake_metadata: FakeMetadata,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A request signed with another secret fails the fake's signature check: credentials invalid."""
    monkeypatch.setenv("VOLCENGINE_SECRET_KEY", "not-the-right-secret")
    with FakeVolcengineApi() as api:
        answer = ask(source(fake_metadata.url, api), time.time())
        assert "SignatureDoesNotMatch" in answer.reason
        assert "credentials are invalid" in answer.reason
        assert api.calls and not api.calls[0].signed


def test_no_credentials(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi,
                        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Nothing in the SDK's default chain: the reason says how to provide credentials."""
    for name in ("VOLCENGINE_ACCESS_KEY", "VOLCENGINE_SECRET_KEY", "VOLCENGINE_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VOLCENGINE_CLI_CONFIG_FILE", str(tmp_path / "absent.json"))
    monkeypatch.setenv("HOME", str(tmp_path))
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is None
    assert answer.reason.startswith("no Volcengine credentials")
    assert fake_api.calls == []


def test_throttling_is_retried_a_bounded_number_of_times(fake_metadata: FakeMetadata,
                                                         fake_api: FakeVolcengineApi) -> None:
    """FlowLimitExceeded (429): retried with backoff, then given up until the next refresh."""
    fake_api.state.failure = THROTTLED
    answer = ask(source(fake_metadata.url, fake_api, retries=2), time.time())
    assert "throttled (FlowLimitExceeded)" in answer.reason
    assert len(fake_api.calls) == 3


def test_api_timeout(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """The API sleeps past the read timeout: bounded time, a reason naming the timeout."""
    fake_api.state.delay_s = 3.0
    with waited() as wait:
        answer = ask(source(fake_metadata.url, fake_api, timeout_s=0.3, retries=1), time.time())
    assert "did not answer within 0.3s" in answer.reason  # neither attempt waited for the answer
    assert len(fake_api.calls) == 2
    assert wait.blocked_s < 2.5  # two 0.3 s timeouts and the SDK's pause; on a busy node, too


@pytest.mark.parametrize("raw", ["tomorrow at noon", "2026-13-01T00:00:00Z", "2026-12-01 08:00:00"])
def test_malformed_time(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi, raw: str) -> None:
    """An AutoReleaseAt that is not RFC 3339 with an offset is refused, with the raw text shown."""
    fake_api.set_release(SCHEDULED_ID, raw)
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert answer.deadline is None
    assert "unparsable" in answer.reason and repr(raw) in answer.reason


def test_empty_auto_release_at(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """A scheduled instance without a release time says so."""
    fake_api.set_release(SCHEDULED_ID, "")
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert "empty AutoReleaseAt" in answer.reason


def test_metadata_404_for_instance_id(fake_metadata: FakeMetadata, fake_api: FakeVolcengineApi) -> None:
    """The metadata service answers but has no instance_id: not a Volcengine ECS instance."""
    fake_metadata.set("/latest/instance_id", None)
    answer = ask(source(fake_metadata.url, fake_api), time.time())
    assert "has no instance_id" in answer.reason and answer.expected
    assert fake_api.calls == []


def test_metadata_without_tokens_falls_back_to_plain_gets(fake_api: FakeVolcengineApi) -> None:
    """Where the token PUT is refused (tokens not supported), plain GETs are used."""
    items = {"/latest/instance_id": INSTANCE_ID, "/latest/region_id": REGION}
    with FakeMetadata(items, tokens_supported=False) as metadata:
        answer = ask(source(metadata.url, fake_api), time.time())
        assert answer.deadline is not None, answer.reason
        assert [h.method for h in metadata.hits] == ["PUT", "GET", "GET"]


def test_metadata_refused_is_quick_and_says_where() -> None:
    """Nothing listening: 'not on a Volcengine ECS instance?' at once, as an expected condition."""
    with waited() as wait:
        answer = ask(source(closed_port_url(), None), time.time())
    assert wait.blocked_s < 1.5  # one 0.2 s pause before the second attempt
    assert "not on a Volcengine ECS instance?" in answer.reason and "connection refused" in answer.reason
    assert answer.expected


def test_metadata_unroutable_is_bounded() -> None:
    """SYNs dropped (like 100.96.0.96 off a VM): two short connect timeouts, then a reason."""
    with Blackhole() as hole, waited() as wait:
        answer = ask(source(hole.url, None), time.time())
    assert "not on a Volcengine ECS instance?" in answer.reason
    assert "connect timed out after 0.5s" in answer.reason
    # two 0.5 s connect timeouts and a 0.2 s pause (the kernel alone would try for 127 s)
    assert wait.blocked_s < 3.0


def test_sdk_missing_says_which_extra_to_install(fake_metadata: FakeMetadata,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Without esiwrap[volcengine] the source answers with the install hint."""
    monkeypatch.setitem(sys.modules, "volcenginesdkecs", None)  # what an absent package looks like
    answer = ask(source(fake_metadata.url, None), time.time())
    assert answer.reason == INSTALL_HINT


@pytest.mark.system
def test_help_and_core_do_not_import_the_sdk() -> None:
    """`esiwrap --help` and building the default sources import neither SDK package."""
    code = (
        "import sys, contextlib, io\n"
        "from esiwrap.cli import main\n"
        "from esiwrap.sources.registry import DEFAULT_SOURCES, build_sources\n"
        "from esiwrap.sources.registry import source_values\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "build_sources(DEFAULT_SOURCES, source_values(metadata_url='http://127.0.0.1:9'), {}, 0.0)\n"
        "print(sorted(m for m in sys.modules if m.startswith('volcengine')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_metadata_that_never_answers_is_a_read_timeout(fake_api: FakeVolcengineApi) -> None:
    """Connected but silent: the read timeout bounds it, and the reason says so."""
    with Silent() as silent, waited() as wait:
        answer = ask(source(silent.url, fake_api), time.time())
    assert wait.blocked_s < 3.0  # two 0.5 s read timeouts and a 0.2 s pause
    assert "no answer within 0.5s" in answer.reason and answer.expected


def test_api_endpoint_refusing_connections(fake_metadata: FakeMetadata) -> None:
    """Nothing listens at the endpoint: retried a bounded number of times, then a reason naming it."""
    answer = ask(source(fake_metadata.url, None, retries=1), time.time())
    assert "cannot connect to the ECS API at http://127.0.0.1:" in answer.reason
    assert "--volcengine-endpoint" in answer.reason
