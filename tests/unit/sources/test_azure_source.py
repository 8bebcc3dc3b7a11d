"""Source `azure`: Azure Scheduled Events for this VM, against a loopback IMDS that follows
Microsoft's documented API (tests/lib/fakes/azure.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
from email.utils import parsedate_to_datetime

import pytest
from fakes.azure import EVENTS_PATH, FakeAzureMetadata
from fakes.metadata import FakeMetadata
from fakes.network import Silent, closed_port_url

from esiwrap.sources.azure_events import AzureSource
from esiwrap.sources.chain import ask
from esiwrap.sources.metadata import AZURE, VOLCENGINE, MetadataClient, Timeouts
from esiwrap.sources.spot import VOLCENGINE_SPOT_PATH, volcengine_spot
from esiwrap.sources.watcher import DeadlineWatcher


def azure(fake: FakeAzureMetadata | str, ack: bool = False, **kwargs: float) -> AzureSource:
    url = fake if isinstance(fake, str) else fake.url
    client = MetadataClient(url, AZURE, Timeouts(connect_s=0.5, read_s=1.0, backoff_s=0.05,
                                                 remember_unreachable_s=0.0))
    return AzureSource(client, ack=ack, **kwargs)


def not_before(fake: FakeAzureMetadata, event_id: str) -> float:
    return parsedate_to_datetime(fake.events[event_id].not_before).timestamp()


def test_no_event_for_this_vm(fake_azure: FakeAzureMetadata) -> None:
    """An empty document: no deadline, at info level, asked again in a second; every request
    carried `Metadata: true`, and the Spot priority is the capacity."""
    source = azure(fake_azure)
    answer = ask(source, time.time())
    assert answer.deadline is None and answer.expected and not answer.withdrawn
    assert answer.reason == "no scheduled event for this VM (trainer-vm-0)"
    assert answer.capacity == "spot"
    assert source.period_s == 1.0
    assert fake_azure.requests and all(r.headers.get("Metadata") == "true" for r in fake_azure.requests)
    assert [r.path for r in fake_azure.requests] == [
        "/metadata/instance/compute/name", "/metadata/instance/compute/priority", EVENTS_PATH]
    ask(source, time.time())  # name and priority are not asked again
    assert [r.path for r in fake_azure.requests[3:]] == [EVENTS_PATH]


def test_preempt_for_this_vm_is_the_deadline(fake_azure: FakeAzureMetadata) -> None:
    """A Spot eviction: NotBefore is the deadline, with the event's facts in the detail."""
    event_id = fake_azure.schedule("Preempt", 30, description="Spot eviction")
    answer = ask(azure(fake_azure), time.time())
    assert answer.deadline is not None, answer.reason
    assert answer.deadline.at == not_before(fake_azure, event_id)
    assert answer.deadline.raw == fake_azure.events[event_id].not_before
    assert answer.deadline.detail["event_id"] == event_id
    assert answer.deadline.detail["event_type"] == "Preempt"
    assert answer.deadline.detail["vm"] == "trainer-vm-0"
    assert answer.capacity == "spot"


@pytest.mark.parametrize("event_type", ["Terminate", "Reboot", "Redeploy", "Freeze"])
def test_every_interrupting_event_type_counts(fake_azure: FakeAzureMetadata, event_type: str) -> None:
    event_id = fake_azure.schedule(event_type, 600)
    answer = ask(azure(fake_azure), time.time())
    assert answer.deadline is not None and answer.deadline.at == not_before(fake_azure, event_id)


def test_other_vms_events_do_not_count(fake_azure: FakeAzureMetadata) -> None:
    """The document carries the whole availability set's events: only ours (Resources, case
    aside) count; of several, the earliest rules."""
    fake_azure.schedule("Reboot", 60, resources=["other-vm"])
    source = azure(fake_azure)
    assert ask(source, time.time()).deadline is None
    later = fake_azure.schedule("Redeploy", 900, resources=["other-vm", "TRAINER-VM-0"])
    sooner = fake_azure.schedule("Reboot", 300)
    answer = ask(source, time.time())
    assert answer.deadline is not None
    assert answer.deadline.at == not_before(fake_azure, sooner) < not_before(fake_azure, later)


def test_moved_then_withdrawn(fake_azure: FakeAzureMetadata) -> None:
    """NotBefore moves: so does the deadline. The event leaves the document (cancelled, or
    over): the deadline is withdrawn, once; then it is the ordinary no-event answer."""
    event_id = fake_azure.schedule("Reboot", 900)
    source = azure(fake_azure)
    first = ask(source, time.time())
    fake_azure.move(event_id, 1200)
    moved = ask(source, time.time())
    assert first.deadline is not None and moved.deadline is not None
    assert moved.deadline.at == not_before(fake_azure, event_id) > first.deadline.at
    fake_azure.remove(event_id)
    withdrawn = ask(source, time.time())
    assert withdrawn.withdrawn and withdrawn.deadline is None
    assert event_id in withdrawn.reason and "cancelled, or over" in withdrawn.reason
    after = ask(source, time.time())
    assert not after.withdrawn and after.reason.startswith("no scheduled event")


def test_a_started_event_is_a_deadline_now(fake_azure: FakeAzureMetadata) -> None:
    """Empty NotBefore: the event has started; the deadline is when it was first seen so, and
    stays there (it does not creep later with every poll)."""
    fake_azure.schedule("Reboot", None)
    source = azure(fake_azure)
    now = time.time()
    answer = ask(source, now)
    again = ask(source, now + 1)
    assert answer.deadline is not None and again.deadline is not None
    assert answer.deadline.at == now == again.deadline.at


def test_an_unreadable_not_before_assumes_the_minimum_notice(fake_azure: FakeAzureMetadata) -> None:
    """A Preempt whose NotBefore is not RFC 1123: first seen + 30 s, Preempt's minimum notice."""
    event_id = fake_azure.schedule("Preempt", 30)
    fake_azure.set_not_before(event_id, "tomorrow-ish")
    source = azure(fake_azure)
    now = time.time()
    answer = ask(source, now)
    assert answer.deadline is not None and answer.deadline.at == now + 30
    assert "minimum notice" in answer.deadline.detail["assumed"]
    assert ask(source, now + 5).deadline == answer.deadline


def test_the_first_call_may_take_long() -> None:
    """The first document request enables the service and may take minutes: it is not cut
    off at the usual 1 s read timeout."""
    with FakeAzureMetadata(enable_delay_s=2.0) as fake:
        fake.schedule("Preempt", 60)
        answer = ask(azure(fake), time.time())
    assert answer.deadline is not None, answer.reason


def test_the_first_call_holds_up_no_other_source(fake_metadata: FakeMetadata) -> None:
    """Asked by the watcher, a slow first Azure call does not delay another source's first
    answer: that one is handed over while Azure's first call is still held (the fake answers it
    only once the test has the other answer), Azure's when it comes (the spot source's next
    poll, 5 s on, may come before or after it)."""
    fake_metadata.set(VOLCENGINE_SPOT_PATH, "2030-01-01T00:00:00Z")
    wake_r, wake_w = socket.socketpair()
    enabled = threading.Event()
    with FakeAzureMetadata(enable_gate=enabled) as fake:
        fake.schedule("Preempt", 60)
        spot = volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0)
        watcher = DeadlineWatcher([azure(fake), spot], wake_w)
        watcher.start()
        try:
            first = _next_batch(watcher, wake_r, 30.0)
            enabled.set()
            later = _answers_until(watcher, wake_r, "azure", 30.0)
        finally:
            enabled.set()
            watcher.stop()
            wake_r.close()
            wake_w.close()
    assert [a.source for a in first] == ["volcengine-spot"]
    assert {a.source for a in later[:-1]} <= {"volcengine-spot"}
    assert later[-1].source == "azure" and later[-1].deadline is not None, later[-1].reason


def _answers_until(watcher: DeadlineWatcher, wake: socket.socket, source: str, timeout: float) -> list:
    """The answers handed over up to and including the first from `source`."""
    deadline = time.monotonic() + timeout
    answers: list = []
    while not any(a.source == source for a in answers):
        answers.extend(_next_batch(watcher, wake, max(0.01, deadline - time.monotonic())))
    return answers[:next(i for i, a in enumerate(answers) if a.source == source) + 1]


def _next_batch(watcher: DeadlineWatcher, wake: socket.socket, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wake.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            wake.recv(64)
        except TimeoutError:
            break
        answers = watcher.drain()
        if answers:
            return answers
    raise AssertionError("no answers from the watcher")


@pytest.mark.parametrize(("body", "expected"), [
    (b"<html>proxy error</html>", "Scheduled Events answered unparsable JSON ('<html>proxy error</html>')"),
    (b'{"DocumentIncarnation": 3}', "a document without an Events list"),
    (b'{"DocumentIncarnation": 3, "Events": [{"EventType": "Reboot"}]}', "an event without EventId"),
    (b'["not", "a", "document"]', "a document without an Events list"),
])
def test_garbage_is_a_warning_not_a_crash(fake_azure: FakeAzureMetadata, body: bytes, expected: str) -> None:
    fake_azure.answer_next(200, body)
    answer = ask(azure(fake_azure), time.time())
    assert answer.deadline is None and not answer.expected and not answer.withdrawn
    assert expected in answer.reason, answer.reason


def test_a_garbled_document_keeps_what_was_known(fake_azure: FakeAzureMetadata) -> None:
    """Between two good documents, a garbled one is no withdrawal."""
    fake_azure.schedule("Reboot", 900)
    source = azure(fake_azure)
    assert ask(source, time.time()).deadline is not None
    fake_azure.answer_next(200, b"{")
    assert not ask(source, time.time()).withdrawn
    assert ask(source, time.time()).deadline is not None


def test_http_errors_are_named(fake_azure: FakeAzureMetadata) -> None:
    """A 500 (after the first call, retried once): a warning that names the answer; the next
    poll in a second."""
    source = azure(fake_azure)
    ask(source, time.time())
    fake_azure.answer_next(500, b"{}", times=2)
    answer = ask(source, time.time())
    assert "Scheduled Events failed:" in answer.reason and "HTTP 500 after 2 attempts" in answer.reason
    assert not answer.expected and source.period_s == 1.0


def test_throttled_past_five_requests_a_second() -> None:
    """IMDS allows 5 requests a second: beyond that 429, named as such; a poll a second is fine."""
    with FakeAzureMetadata(rate_limit=5) as fake:
        source = azure(fake)
        answers = [ask(source, time.time()) for _ in range(4)]
    assert "HTTP 429" in answers[-1].reason
    assert answers[0].reason.startswith("no scheduled event")


def test_another_clouds_metadata_service_is_not_azure(fake_aws_metadata: FakeMetadata) -> None:
    """At 169.254.169.254 on AWS the Azure paths are 401/404: expected, and the poll backs off."""
    source = azure(fake_aws_metadata.url, max_backoff_s=8.0)
    periods = []
    for _ in range(4):
        answer = ask(source, time.time())
        periods.append(source.period_s)
    assert answer.expected and answer.reason.startswith("not an Azure metadata service")
    assert periods == [2.0, 4.0, 8.0, 8.0]


def test_refused_connection_backs_off() -> None:
    source = azure(closed_port_url(), max_backoff_s=4.0)
    answers = [ask(source, time.time()) for _ in range(3)]
    assert all(a.expected and "not on an Azure VM?" in a.reason for a in answers)
    assert "connection refused" in answers[0].reason
    assert source.period_s == 4.0


def test_a_silent_service_times_out() -> None:
    """Accepted but never answered: unreachable once the (shortened) first-call wait is over."""
    with Silent() as silent:
        source = azure(silent.url, first_call_read_s=1.0)
        answer = ask(source, time.time())
    assert answer.expected and "no answer within 1s" in answer.reason


def test_an_unknown_vm_name_counts_every_event(fake_azure: FakeAzureMetadata) -> None:
    """Without this VM's name the events cannot be told apart: all of them count (an early
    save is cheaper than a missed one), and the detail says why."""
    fake_azure.vm_name = ""
    fake_azure.schedule("Reboot", 600, resources=["someone-else"])
    answer = ask(azure(fake_azure), time.time())
    assert answer.deadline is not None
    assert answer.deadline.detail["vm"].startswith("unknown (")


@pytest.mark.parametrize(("priority", "capacity"), [("Regular", "on-demand"), ("Spot", "spot"), ("", None)])
def test_priority_is_the_capacity(priority: str, capacity: str | None) -> None:
    with FakeAzureMetadata(priority=priority) as fake:
        assert ask(azure(fake), time.time()).capacity == capacity


def test_ack_approves_this_vms_events_only(fake_azure: FakeAzureMetadata) -> None:
    """--azure-ack: a POST of StartRequests with this VM's EventId (with `Metadata: true`); an
    event that also names another VM is left alone (approving it would start it for them)."""
    ours = fake_azure.schedule("Reboot", 900)
    shared = fake_azure.schedule("Freeze", 900, resources=["trainer-vm-0", "peer-vm"])
    source = azure(fake_azure, ack=True)
    ask(source, time.time())
    note = source.release()
    assert note is not None and f"approved scheduled event {ours} (Reboot)" in note and shared in note
    posts = [r for r in fake_azure.requests if r.method == "POST"]
    assert len(posts) == 1 and posts[0].headers.get("Metadata") == "true"
    assert json.loads(posts[0].body) == {"StartRequests": [{"EventId": ours}]}
    assert [a.event_ids for a in fake_azure.approvals] == [[ours]]


def test_no_ack_no_post(fake_azure: FakeAzureMetadata) -> None:
    fake_azure.schedule("Reboot", 900)
    source = azure(fake_azure)
    ask(source, time.time())
    assert source.release() is None
    assert not [r for r in fake_azure.requests if r.method == "POST"]
