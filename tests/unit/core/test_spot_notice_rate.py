"""A spot source that watches for the cloud's notice turns interruptions into deadlines: the
periodic saves guard only against those whose notice is too short for the rest of a step plus a
save (`policy.unwarned_share`). From the source (it says how long a notice it watches for) through
the deadline book (on every node, or not at all) to the plan and the simulator."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from controller_driver import Driver, logs
from fakes.metadata import FakeMetadata
from fakes.network import closed_port_url
from hypothesis import given
from hypothesis import strategies as st

from esiwrap.core import controller as core
from esiwrap.core.policy import (
    NOTICE_MISSED_SHARE,
    SPOT_RATE_PER_DAY,
    Capacity,
    Observations,
    PolicyConfig,
    interruption_rate,
    periodic_interval_s,
    unwarned_share,
)
from esiwrap.core.values import Answer, Deadline
from esiwrap.sources import remote
from esiwrap.sources.chain import ask
from esiwrap.sources.metadata import AWS, VOLCENGINE, MetadataClient, Timeouts
from esiwrap.sources.spot import (
    AWS_NOTICE_S,
    SPOT_POLL_S,
    VOLCENGINE_NOTICE_S,
    VOLCENGINE_SPOT_PATH,
    aws_spot,
    volcengine_spot,
)
from esiwrap.tools import whatif

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from runners import run_esiwrap
from traces import Params, generate


def spot_job(step_s: float, save_s: float | None, notice_s: float | None) -> Observations:
    """A run on spot capacity with steps of `step_s` and, when given, one measured save."""
    obs = Observations(100)
    obs.trainer_started(0.0)
    for k in range(1, 6):
        obs.record_step(k, step_s, k * step_s)
    if save_s is not None:
        obs.record_save(save_s, 6 * step_s)
    obs.capacity = Capacity("spot", 1, "aws-spot", notice_s)
    return obs


# ------------------------------------------------------------------ the sources
def test_a_spot_source_that_reaches_its_metadata_watches_for_a_notice(
        fake_aws_metadata: FakeMetadata) -> None:
    """No notice yet (404): the answer says which notice the source can see, the cloud's less one
    poll (a notice may come just after a poll)."""
    answer = ask(aws_spot(MetadataClient(fake_aws_metadata.url, AWS), 300.0), time.time())
    assert answer.deadline is None and answer.expected
    assert answer.notice_s == AWS_NOTICE_S - SPOT_POLL_S


def test_a_notice_under_way_still_says_how_long_a_notice_is(fake_metadata: FakeMetadata) -> None:
    fake_metadata.set(VOLCENGINE_SPOT_PATH, "+4m")
    answer = ask(volcengine_spot(MetadataClient(fake_metadata.url, VOLCENGINE), 300.0), time.time())
    assert answer.deadline is not None
    assert answer.notice_s == VOLCENGINE_NOTICE_S - SPOT_POLL_S


def test_a_spot_source_that_cannot_reach_its_metadata_promises_no_notice() -> None:
    client = MetadataClient(closed_port_url(), AWS, Timeouts(connect_s=0.5, read_s=0.5))
    answer = ask(aws_spot(client, 300.0), time.time())
    assert answer.deadline is None and answer.notice_s is None


def test_a_nodes_notice_travels_with_its_answer_and_nonsense_is_none() -> None:
    answer = Answer("node:1a2b3c4d/aws-spot", reason="no spot interruption notice", expected=True,
                    capacity="spot", notice_s=115.0)
    fields = json.loads(json.dumps(remote.to_fields(answer)))
    assert remote.from_fields(fields, time.time()) == answer
    for bad in (-1.0, 0, True, "115", float("inf")):
        assert remote.from_fields({**fields, "notice_s": bad}, time.time()).notice_s is None, bad


# ------------------------------------------------------------------ the deadline book
def spot_answer(source: str, notice_s: float | None) -> Answer:
    return Answer(source, reason="no spot interruption notice", expected=True, capacity="spot",
                  notice_s=notice_s)


def test_the_notice_counts_only_while_it_is_watched_on_every_node() -> None:
    """One node watching: its notice. A second Ray node that watches none: no notice for the job
    (an interruption there comes unannounced). That node watching a shorter one: the shorter."""
    d = Driver()
    d.feed(core.DeadlineAnswers((spot_answer("aws-spot", 115.0),)))
    assert d.controller.obs.capacity == Capacity("spot", 1, "aws-spot", 115.0)
    d.feed(core.DeadlineAnswers((Answer("node:bbbb2222/env:MLP", reason="not set", expected=True),)))
    assert d.controller.obs.capacity.nodes == 2 and d.controller.obs.capacity.notice_s is None
    d.feed(core.DeadlineAnswers((spot_answer("node:bbbb2222/aws-spot", 25.0),)))
    assert d.controller.obs.capacity.notice_s == 25.0
    d.feed(core.DeadlineAnswers((spot_answer("aws-spot", None),)))  # its metadata went away
    assert d.controller.obs.capacity.notice_s is None


def test_the_deadline_events_say_which_notice_was_watched_and_the_what_if_replays_with_it() -> None:
    """deadline_resolved carries notice_s when a notice is watched (not otherwise), and `esiwrap
    report --what-if` reads it back into the trace it replays, as it does the capacity."""
    d = Driver()
    end = Deadline(at=d.wall + 8 * 3600.0, source="cli")
    out = d.feed(core.DeadlineAnswers((spot_answer("aws-spot", 115.0), Answer("cli", deadline=end))))
    (resolved,) = logs(out, "deadline_resolved")
    assert resolved["capacity"] == "spot" and resolved["notice_s"] == 115.0
    known = whatif._knowledge([{"event": "deadline_resolved", **resolved}])
    assert known["capacity"] == "spot" and known["notice_s"] == 115.0
    plain = Driver()
    (unwatched,) = logs(plain.deadline(3600.0), "deadline_resolved")
    assert "notice_s" not in unwatched
    assert "notice_s" not in whatif._knowledge([{"event": "deadline_resolved", **unwatched}])


# ------------------------------------------------------------------ the policy
def test_a_notice_that_holds_a_step_and_a_save_leaves_only_the_missed_notices() -> None:
    """60 s steps, a 30 s save, a 115 s notice: every notice leaves room, so the periodic saves
    guard only against notices that do not come (NOTICE_MISSED_SHARE); the why says so."""
    obs = spot_job(60.0, 30.0, 115.0)
    assert unwarned_share(obs, PolicyConfig()) == NOTICE_MISSED_SHARE
    rate, why = interruption_rate(obs, PolicyConfig())
    assert rate == pytest.approx(SPOT_RATE_PER_DAY * NOTICE_MISSED_SHARE)
    assert "0.05 of them without a usable warning (a 115 s notice is watched)" in why
    without = replace(obs.capacity, notice_s=None)
    plain = spot_job(60.0, 30.0, None)
    assert plain.capacity == without
    warned, unwarned = periodic_interval_s(obs, PolicyConfig()), periodic_interval_s(plain, PolicyConfig())
    assert warned is not None and unwarned is not None and warned > 4 * unwarned


def test_a_notice_shorter_than_the_save_is_no_warning() -> None:
    """A 4-minute save against a 2-minute notice: every interruption counts, as without a notice."""
    obs = spot_job(60.0, 240.0, 115.0)
    assert unwarned_share(obs, PolicyConfig()) == 1.0
    rate, why = interruption_rate(obs, PolicyConfig())
    assert rate == pytest.approx(SPOT_RATE_PER_DAY)
    assert "(a 115 s notice is watched, too short for a step plus a save)" in why


def test_an_unmeasured_save_never_talks_the_cadence_down() -> None:
    """Before a save is measured, the share uses the insurance save's cautious estimate (the
    guess x --unmeasured-factor), not the bare guess: with a 115 s notice that is no warning."""
    watched, blind = spot_job(60.0, None, 115.0), spot_job(60.0, None, None)
    assert unwarned_share(watched, PolicyConfig()) == 1.0
    assert interruption_rate(watched, PolicyConfig())[0] == pytest.approx(SPOT_RATE_PER_DAY)
    interval = periodic_interval_s(watched, PolicyConfig())
    assert interval is not None and interval == periodic_interval_s(blind, PolicyConfig())


def test_reserved_capacity_is_not_touched_by_a_spot_sources_notice() -> None:
    obs = spot_job(60.0, 30.0, 295.0)
    obs.capacity = Capacity("reserved", 1, "volcengine", 295.0)
    assert unwarned_share(obs, PolicyConfig()) == 1.0


@given(step=st.floats(1.0, 3600.0), save=st.floats(0.1, 3600.0),
       notice=st.floats(1.0, 3600.0), more=st.floats(0.0, 3600.0))
def test_the_share_is_a_probability_that_a_longer_notice_never_raises(step: float, save: float,
                                                                      notice: float, more: float) -> None:
    config = PolicyConfig()
    share = unwarned_share(spot_job(step, save, notice), config)
    assert NOTICE_MISSED_SHARE <= share <= 1.0
    assert unwarned_share(spot_job(step, save, notice + more), config) <= share
    assert unwarned_share(spot_job(step, save + more, notice), config) >= share


# ------------------------------------------------------------------ the simulator
def test_a_watched_notice_spares_the_periodic_saves_of_a_moving_spot_run() -> None:
    """The simulator's `moving` run at 8 h (a renewal, then a 2-5 minute notice) through the real
    controller: with its source watching for the notice, the notice saves the run with far fewer
    saves and less work lost than when the notice comes from nowhere."""
    params = Params(horizon_s=8 * 3600.0)
    watched = [generate("moving", run, 1, params) for run in range(4)]
    assert all(s.notice_s == params.notice_s[0] for s in watched)
    with_notice = [run_esiwrap(s, PolicyConfig()) for s in watched]
    blind = [run_esiwrap(replace(s, notice_s=None), PolicyConfig()) for s in watched]
    assert not any(o.missed for o in with_notice)
    assert sum(o.saves for o in with_notice) * 2 < sum(o.saves for o in blind)
    assert sum(o.lost_s for o in with_notice) < sum(o.lost_s for o in blind)
