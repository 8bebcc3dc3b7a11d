"""Spot interruption notices (Volcengine and AWS) as deadlines, from loopback metadata fakes."""

from __future__ import annotations

import json
import time

from fakes.fixtures import rfc3339_in
from fakes.metadata import FakeMetadata
from fakes.network import closed_port_url

from esiwrap.sources.chain import ask
from esiwrap.sources.metadata import AWS, VOLCENGINE, MetadataClient, Timeouts
from esiwrap.sources.spot import (
    AWS_LIFE_CYCLE_PATH,
    AWS_REBALANCE_PATH,
    AWS_SPOT_PATH,
    SPOT_POLL_S,
    VOLCENGINE_NOTICE_S,
    VOLCENGINE_SPOT_PATH,
    aws_spot,
    volcengine_spot,
)
from esiwrap.times import parse_iso


def test_no_notice_is_an_expected_404(fake_metadata: FakeMetadata) -> None:
    """404 on the notice item: no notice, info level, polled again in 5 s."""
    spot = volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0)
    answer = ask(spot, time.time())
    assert answer.deadline is None and answer.expected
    assert answer.reason == "no spot interruption notice"
    assert spot.period_s == SPOT_POLL_S
    assert all(h.token_ok for h in fake_metadata.gets(VOLCENGINE_SPOT_PATH))


def test_volcengine_notice_is_the_deadline(fake_metadata: FakeMetadata) -> None:
    """A termination time in the metadata is the deadline, its raw text kept."""
    raw = rfc3339_in(200)
    fake_metadata.set(VOLCENGINE_SPOT_PATH, raw)
    answer = ask(volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0), time.time())
    assert answer.deadline is not None
    assert answer.deadline.at == parse_iso(raw) and answer.deadline.raw == raw


def test_unreadable_notice_time_assumes_the_documented_warning(fake_metadata: FakeMetadata) -> None:
    """A notice whose time cannot be read still counts: first seen + 5 minutes."""
    fake_metadata.set(VOLCENGINE_SPOT_PATH, "2026-11-30 12:00:00")  # no offset: which zone?
    spot = volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0)
    first = time.time()
    answer = ask(spot, first)
    assert answer.deadline is not None
    assert answer.deadline.at == first + VOLCENGINE_NOTICE_S
    again = ask(spot, first + 30)  # the same notice later: still anchored where it was first seen
    assert again.deadline is not None and again.deadline.at == answer.deadline.at


def test_a_stated_time_later_than_the_warning_is_capped(fake_metadata: FakeMetadata) -> None:
    """Never later than first seen + the documented warning, whatever the notice says."""
    fake_metadata.set(VOLCENGINE_SPOT_PATH, rfc3339_in(3600))
    now = time.time()
    answer = ask(volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0), now)
    assert answer.deadline is not None and answer.deadline.at == now + VOLCENGINE_NOTICE_S


def test_unreachable_metadata_backs_off() -> None:
    """Nothing answers: the poll period doubles up to the cap, instead of probing every 5 s."""
    # remember_unreachable_s=0: every poll really probes, as it would after waiting its period
    client = MetadataClient(closed_port_url(), VOLCENGINE, Timeouts(remember_unreachable_s=0.0))
    spot = volcengine_spot(client, 30.0)
    periods = []
    for _ in range(4):
        answer = ask(spot, time.time())
        periods.append(spot.period_s)
    assert "not on a Volcengine ECS instance?" in answer.reason and answer.expected
    assert periods == [10.0, 20.0, 30.0, 30.0]


def test_aws_instance_action_with_imdsv2(fake_aws_metadata: FakeMetadata) -> None:
    """AWS: token with the AWS headers, then instance-action's JSON time is the deadline."""
    spot = aws_spot(MetadataClient(fake_aws_metadata.url, AWS), 300.0)
    assert ask(spot, time.time()).reason == "no spot interruption notice"
    when = rfc3339_in(100, offset_hours=0)
    fake_aws_metadata.set(AWS_SPOT_PATH, json.dumps({"action": "terminate", "time": when}))
    answer = ask(spot, time.time())
    assert answer.deadline is not None
    assert answer.deadline.at == parse_iso(when)
    assert answer.deadline.detail["action"] == "terminate"
    assert fake_aws_metadata.hits[0].method == "PUT"
    assert all(h.token_ok for h in fake_aws_metadata.gets(AWS_SPOT_PATH))


def test_an_expired_token_is_renewed(fake_metadata: FakeMetadata) -> None:
    """The service forgets the session token (401): one new token PUT, then the poll goes on."""
    spot = volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0)
    assert ask(spot, time.time()).reason == "no spot interruption notice"
    fake_metadata.tokens.clear()
    assert ask(spot, time.time()).reason == "no spot interruption notice"
    assert [h.method for h in fake_metadata.hits] == ["PUT", "GET", "GET", "PUT", "GET"]


def test_aws_rebalance_recommendation_is_an_early_warning(fake_aws_metadata: FakeMetadata) -> None:
    """The rebalance item (404 while there is none) is no deadline but the answer's early
    warning, with its noticeTime; it clears when the item goes."""
    spot = aws_spot(MetadataClient(fake_aws_metadata.url, AWS), 300.0)
    assert ask(spot, time.time()).early_warning == ""
    fake_aws_metadata.set(AWS_REBALANCE_PATH, json.dumps({"noticeTime": "2027-01-15T08:00:00Z"}))
    answer = ask(spot, time.time())
    assert answer.deadline is None and answer.reason == "no spot interruption notice"
    assert answer.early_warning.startswith("EC2 rebalance recommendation (noticeTime 2027-01-15T08:00:00Z)")
    fake_aws_metadata.set(AWS_REBALANCE_PATH, "<garbled>")  # still a recommendation: the item is there
    assert "'<garbled>'" in ask(spot, time.time()).early_warning
    fake_aws_metadata.set(AWS_REBALANCE_PATH, None)
    assert ask(spot, time.time()).early_warning == ""
    assert all(h.token_ok for h in fake_aws_metadata.gets(AWS_REBALANCE_PATH))


def test_aws_instance_life_cycle_is_the_capacity(fake_aws_metadata: FakeMetadata) -> None:
    """spot, on-demand, scheduled (a reservation): read once, not on every poll."""
    spot = aws_spot(MetadataClient(fake_aws_metadata.url, AWS), 300.0)
    fake_aws_metadata.set(AWS_LIFE_CYCLE_PATH, "spot")
    assert ask(spot, time.time()).capacity == "spot"
    assert ask(spot, time.time()).capacity == "spot"
    assert len(fake_aws_metadata.gets(AWS_LIFE_CYCLE_PATH)) == 1
    for life_cycle, capacity in (("on-demand", "on-demand"), ("scheduled", "reserved")):
        other = aws_spot(MetadataClient(fake_aws_metadata.url, AWS), 300.0)
        fake_aws_metadata.set(AWS_LIFE_CYCLE_PATH, life_cycle)
        assert ask(other, time.time()).capacity == capacity
