"""Source `gcp`: preemption and host-maintenance notices, against a loopback Compute Engine
metadata server that follows Google's documented API (tests/lib/fakes/gcp.py): the header, the
ETag, the hanging GET."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from esiwrap_harness import wait_until
from fakes.gcp import PREFIX, FakeGcpMetadata, etag_of
from fakes.metadata import FakeMetadata
from fakes.network import Silent, closed_port_url

from esiwrap.core.values import Answer
from esiwrap.sources.chain import ask
from esiwrap.sources.gcp_notices import GcpSource
from esiwrap.sources.metadata import GCP, MetadataClient, Timeouts, _describe

PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"


def gcp(url: str, **kwargs: float) -> GcpSource:
    client = MetadataClient(url, GCP, Timeouts(connect_s=0.5, read_s=1.0, backoff_s=0.05,
                                               remember_unreachable_s=0.0))
    return GcpSource(client, **kwargs)  # type: ignore[arg-type]


def asked(source: GcpSource) -> tuple[Answer, float, float]:
    """The answer, and the wall-clock window in which it was given."""
    before = time.time()
    answer = ask(source, before)
    return answer, before, time.time()


def test_no_notice(fake_gcp: FakeGcpMetadata) -> None:
    """FALSE and NONE: no deadline (info); the header on every request; the Spot capacity."""
    answer = ask(gcp(fake_gcp.url), time.time())
    assert answer.deadline is None and answer.expected and not answer.withdrawn
    assert answer.reason == "no preemption or maintenance notice"
    assert answer.capacity == "spot"
    assert fake_gcp.requests and all(r.flavor_ok for r in fake_gcp.requests)


def test_preempted_is_first_seen_plus_30s(fake_gcp: FakeGcpMetadata) -> None:
    source = gcp(fake_gcp.url)
    ask(source, time.time())
    fake_gcp.set(PREEMPTED, "TRUE")
    answer, before, after = asked(source)
    assert answer.deadline is not None, answer.reason
    assert before + 30 <= answer.deadline.at <= after + 30
    assert answer.deadline.raw == "preempted=TRUE" and answer.capacity == "spot"
    again = ask(source, time.time() + 10)  # still anchored where it was first seen
    assert again.deadline is not None and again.deadline.at == answer.deadline.at


@pytest.mark.parametrize("notice_s", [60.0, 3600.0])
def test_terminate_on_host_maintenance(fake_gcp: FakeGcpMetadata, notice_s: float) -> None:
    """TERMINATE_ON_HOST_MAINTENANCE: first seen + --gcp-maintenance-notice (60 s; an hour for
    GPU VMs, by Google's word, when the user says so)."""
    fake_gcp.set(MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE")
    answer, before, after = asked(gcp(fake_gcp.url, maintenance_notice_s=notice_s))
    assert answer.deadline is not None
    assert before + notice_s <= answer.deadline.at <= after + notice_s
    assert answer.deadline.detail["notice"] == "instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE"


def test_live_migration_is_no_deadline(fake_gcp: FakeGcpMetadata) -> None:
    fake_gcp.set(MAINTENANCE, "MIGRATE_ON_HOST_MAINTENANCE")
    answer = ask(gcp(fake_gcp.url), time.time())
    assert answer.deadline is None and answer.expected and "live migration" in answer.reason


def test_the_earlier_of_two_notices_rules_and_each_withdraws(fake_gcp: FakeGcpMetadata) -> None:
    """Maintenance (60 s) then preemption (30 s): the preemption rules; when it goes back to
    FALSE the maintenance deadline is what is left; when that goes back to NONE, withdrawn."""
    source = gcp(fake_gcp.url)
    fake_gcp.set(MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE")
    maintenance = ask(source, time.time())
    fake_gcp.set(PREEMPTED, "TRUE")
    both = ask(source, time.time())
    assert maintenance.deadline is not None and both.deadline is not None
    assert both.deadline.at < maintenance.deadline.at and both.deadline.raw == "preempted=TRUE"
    fake_gcp.set(PREEMPTED, "FALSE")
    left = ask(source, time.time())
    assert left.deadline == maintenance.deadline
    fake_gcp.set(MAINTENANCE, "NONE")
    withdrawn = ask(source, time.time())
    assert withdrawn.withdrawn and "withdrawn" in withdrawn.reason
    assert not ask(source, time.time()).withdrawn


def test_the_hanging_get_answers_the_moment_the_value_changes(fake_gcp: FakeGcpMetadata) -> None:
    """After the first round, `preempted` is asked with wait_for_change, last_etag and
    timeout_sec; a preemption while it hangs comes back at once, dated when it was seen.
    (A hang of a minute, not the 2 s one: the change surely comes while it waits, and the
    answer can only have come from the change.)"""
    source = gcp(fake_gcp.url, hang_s=60)
    ask(source, time.time())
    results: list[Answer] = []
    asking = threading.Thread(target=lambda: results.append(ask(source, time.time())))
    asking.start()
    # the server holds the hanging GET: the change comes while it waits
    assert wait_until(lambda: any(r.hanging and not r.answered_at for r in fake_gcp.of(PREEMPTED)), 30)
    changed_at = time.time()
    fake_gcp.set(PREEMPTED, "TRUE")
    asking.join(30)
    answered = time.time()
    assert not asking.is_alive(), "the hanging GET did not come back when the value changed"
    hung = [r for r in fake_gcp.of(PREEMPTED) if r.hanging]
    assert hung and hung[0].query["last_etag"] == [etag_of("FALSE")]
    assert hung[0].query["timeout_sec"] == ["60"] and hung[0].woke_on_change
    assert results and results[0].deadline is not None
    assert changed_at + 30 - 0.2 <= results[0].deadline.at <= answered + 30


def test_a_hang_that_times_out_reads_maintenance_too(fake_gcp: FakeGcpMetadata) -> None:
    """No change: the hanging GET returns after timeout_sec (2 s), and maintenance-event is read
    in the same round, so its notice is never older than that; the next hang follows at once."""
    source = gcp(fake_gcp.url)
    ask(source, time.time())
    fake_gcp.set(MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE")
    before = len(fake_gcp.requests)
    answer = ask(source, time.time())
    assert answer.deadline is not None
    this_round = fake_gcp.requests[before:]
    hang, *after = this_round
    assert hang.path.endswith(PREEMPTED) and hang.hanging and hang.query["timeout_sec"] == ["2"]
    assert not hang.woke_on_change and hang.answered_at - hang.at > 1.9  # it waited its timeout
    assert [r.path.removeprefix(PREFIX) for r in after if not r.hanging][:1] == [MAINTENANCE]
    assert not any(r.hanging for r in after)  # one hang a round
    assert source.period_s == 0.05


def test_a_server_that_does_not_hang_is_asked_each_second(fake_gcp: FakeGcpMetadata) -> None:
    fake_gcp.hang_supported = False
    source = gcp(fake_gcp.url)
    for _ in range(3):
        started = time.monotonic()
        ask(source, time.time())
        took = time.monotonic() - started
    # the next round a second after this one began (on a busy node the round itself takes longer)
    assert source.period_s is not None and max(0.05, 1.0 - took) <= source.period_s <= 1.0


@pytest.mark.parametrize(("item", "value", "expected"), [
    (PREEMPTED, "maybe", "instance/preempted answered 'maybe', not TRUE or FALSE"),
    (MAINTENANCE, "<html>", "instance/maintenance-event answered '<html>', not one of"),
])
def test_garbage_values_are_warnings(fake_gcp: FakeGcpMetadata, item: str, value: str, expected: str) -> None:
    fake_gcp.set(item, value)
    answer = ask(gcp(fake_gcp.url), time.time())
    assert answer.deadline is None and not answer.expected and expected in answer.reason


def test_a_preemption_counts_even_when_maintenance_is_unreadable(fake_gcp: FakeGcpMetadata) -> None:
    fake_gcp.set(PREEMPTED, "TRUE")
    fake_gcp.set(MAINTENANCE, "???")
    answer = ask(gcp(fake_gcp.url), time.time())
    assert answer.deadline is not None and "maintenance-event" in answer.deadline.detail["also"]


def test_a_503_during_maintenance_is_retried(fake_gcp: FakeGcpMetadata) -> None:
    """Google: the server may answer 503 for under a second during maintenance; retry."""
    fake_gcp.answer_next(503, b"Service Unavailable")
    answer = ask(gcp(fake_gcp.url), time.time())
    assert answer.reason == "no preemption or maintenance notice"


def test_persistent_errors_are_named(fake_gcp: FakeGcpMetadata) -> None:
    source = gcp(fake_gcp.url)
    ask(source, time.time())
    fake_gcp.answer_next(500, b"oops", times=2)
    fake_gcp.hang_supported = False
    answer = ask(source, time.time())
    assert "instance/preempted failed:" in answer.reason and "HTTP 500" in answer.reason
    assert not answer.expected and source.period_s == 1.0


def test_another_metadata_service_is_not_gcp(fake_aws_metadata: FakeMetadata) -> None:
    source = gcp(fake_aws_metadata.url, max_backoff_s=8.0)
    periods = []
    for _ in range(4):
        answer = ask(source, time.time())
        periods.append(source.period_s)
    assert answer.expected and answer.reason.startswith("not a Compute Engine metadata server")
    assert periods == [2.0, 4.0, 8.0, 8.0]


def test_refused_and_silent_are_unreachable() -> None:
    refused = ask(gcp(closed_port_url()), time.time())
    assert refused.expected and "connection refused" in refused.reason
    assert "not on a Google Compute Engine VM?" in refused.reason
    with Silent() as silent:
        timed_out = ask(gcp(silent.url), time.time())
    assert timed_out.expected and "no answer within 1s" in timed_out.reason


def test_an_unresolvable_host_is_named() -> None:
    """metadata.google.internal off GCP does not resolve: said in words."""
    text = _describe(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert text == "cannot resolve the host (Name or service not known)"


def test_standard_capacity() -> None:
    with FakeGcpMetadata(preemptible=False) as fake:
        assert ask(gcp(fake.url), time.time()).capacity == "on-demand"
        fake.set("instance/scheduling/provisioning-model", None)  # an older server
        assert ask(gcp(fake.url), time.time()).capacity == "on-demand"

