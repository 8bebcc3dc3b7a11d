"""The job's history (pure): the learned interruption rate, the no-progress verdict, how a run's
end is classified, the state file's records, and the plans that use them."""

from __future__ import annotations

import math
from dataclasses import replace

from freezegun import freeze_time
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esiwrap.core import state
from esiwrap.core.history import (
    ANNOUNCED_WITHIN_S,
    HALF_LIFE_S,
    PRIOR_INTERRUPTIONS,
    STALE_AFTER_S,
    Evidence,
    RunRecord,
    close_vanished,
    ending_of,
    evidence,
    no_progress,
    posterior_rate,
    record_from_json,
    record_to_json,
)
from esiwrap.core.policy import (
    NODE_FAILURE_RATE_PER_DAY,
    SPOT_RATE_PER_DAY,
    Capacity,
    Observations,
    PolicyConfig,
    Prior,
    interruption_rate,
    next_save,
)

DAY = 86_400.0
# No wall-clock bound: the suite runs beside busy loops, and these are pure functions.
UNTIMED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def spot_run(start: float, hours: float, interrupted: bool, nodes: int = 1) -> RunRecord:
    return RunRecord(start, start + hours * 3600.0, nodes=nodes, capacity="spot",
                     ending="interrupted" if interrupted else "announced", start_step=1, end_step=2)


@UNTIMED
@given(default=st.floats(1e-4, 100.0), prior=st.floats(0.01, 10.0))
def test_with_no_history_the_rate_is_the_default(default: float, prior: float) -> None:
    assert math.isclose(posterior_rate(default, Evidence(), prior), default, rel_tol=1e-9)


@UNTIMED
@given(default=st.floats(0.01, 50.0), true_rate=st.floats(1e-3, 50.0), prior=st.floats(0.01, 2.0))
def test_much_history_outweighs_the_prior(default: float, true_rate: float, prior: float) -> None:
    """10,000 node-days at the true rate: the posterior is the job's own rate, whatever the default."""
    days = 10_000.0
    learned = posterior_rate(default, Evidence(true_rate * days, days, 100), prior)
    assert math.isclose(learned, true_rate, rel_tol=0.05, abs_tol=prior / days * 2)


@UNTIMED
@given(k=st.floats(0, 50), days=st.floats(0.01, 100), more=st.floats(0.01, 10))
def test_an_interruption_raises_the_rate_and_calm_exposure_lowers_it(k: float, days: float,
                                                                      more: float) -> None:
    base = posterior_rate(SPOT_RATE_PER_DAY, Evidence(k, days, 1), 0.1)
    assert posterior_rate(SPOT_RATE_PER_DAY, Evidence(k + 1, days, 1), 0.1) > base
    assert posterior_rate(SPOT_RATE_PER_DAY, Evidence(k, days + more, 1), 0.1) < base


def test_evidence_weighs_runs_by_age_and_counts_only_the_capacity_kind() -> None:
    now = 10 * DAY
    runs = [spot_run(now - HALF_LIFE_S - 3600.0, 1.0, True), spot_run(now - 3600.0, 1.0, False),
            RunRecord(0.0, 3600.0, nodes=256, capacity="reserved", ending="interrupted")]
    seen = evidence(runs, "spot", now)
    assert seen.runs == 2
    assert math.isclose(seen.interruptions, 0.5, rel_tol=1e-9)  # one half-life old
    assert math.isclose(seen.node_days, (0.5 + 1.0) / 24.0, rel_tol=1e-9)
    reserved = evidence(runs, "reserved", now)
    weight = 0.5 ** ((now - 3600.0) / HALF_LIFE_S)
    assert reserved.runs == 1 and math.isclose(reserved.node_days * 24.0, 256.0 * weight, rel_tol=1e-9)


def observations(kind: str | None, nodes: int, runs: tuple[RunRecord, ...], at: float) -> Observations:
    obs = Observations(100, Prior(runs=runs, runs_at=at))
    obs.capacity = Capacity(kind, nodes, "src")  # type: ignore[arg-type]
    return obs


def test_the_rate_and_its_basis_name_the_job_history() -> None:
    """A calm spot pool: 2 days without an interruption bring 8 a day down to the job's own; the
    `why` says what it rests on. --interruption-rate still wins."""
    now = 3 * DAY
    calm = (spot_run(0.0, 24.0, False), spot_run(DAY + 60, 24.0, False))
    rate, basis = interruption_rate(observations("spot", 1, calm, now), PolicyConfig())
    alpha = PRIOR_INTERRUPTIONS["spot"]
    seen = evidence(calm, "spot", now)
    assert math.isclose(rate, alpha / (alpha / SPOT_RATE_PER_DAY + seen.node_days), rel_tol=1e-9)
    assert rate < 0.1 * SPOT_RATE_PER_DAY
    assert "default 8/day" in basis and "0 interruption(s) without notice" in basis
    assert "2 earlier run(s)" in basis
    fixed = PolicyConfig(interruption_rate_per_day=3.0)
    assert interruption_rate(observations("spot", 1, calm, now), fixed) == (3.0, "--interruption-rate")
    rate_256, basis_256 = interruption_rate(observations("reserved", 256, (), now), PolicyConfig())
    assert math.isclose(rate_256, 256 * NODE_FAILURE_RATE_PER_DAY) and "x 256 nodes" in basis_256


@UNTIMED
@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=12), st.integers(0, 5))
def test_the_guard_stops_only_after_limit_runs_without_progress(history: list[tuple[bool, bool]],
                                                                 limit: int) -> None:
    """Each run: (progressed, stopped by the guard). A verdict exactly when the last `limit` runs
    made no progress and none of them was the guard's own stop; 0 never stops."""
    runs = []
    step = 10
    for i, (progressed, stopped) in enumerate(history):
        end = step + 5 if progressed else step
        runs.append(RunRecord(float(i), float(i) + 1, ending="no_progress" if stopped else "announced",
                              start_step=step, end_step=end))
        step = end
    verdict = no_progress(runs, limit)
    tail = history[-limit:] if limit else []
    expected = limit > 0 and len(history) >= limit and not any(p or s for p, s in tail)
    assert (verdict is not None) == expected
    if verdict is not None:
        assert len(verdict.runs) == limit and verdict.fields()["cause"]


def test_runs_interrupted_without_notice_before_a_save_do_not_count() -> None:
    """A stormy pool took three runs before they could save: bad luck, not a broken job. They do
    not end a count either."""
    unlucky = [RunRecord(0.0, 600.0, ending="interrupted", start_step=5, end_step=5)] * 3
    assert no_progress(unlucky, 3) is None
    short = RunRecord(0.0, 100.0, ending="announced", start_step=5, end_step=5)
    assert no_progress([short, unlucky[0], short, short], 3) is not None


def test_the_likely_cause() -> None:
    too_short = [RunRecord(0.0, 100.0, ending="announced") for _ in range(3)]
    verdict = no_progress(too_short, 3, step_s=60.0, save_s=60.0)
    assert verdict is not None and verdict.cause.startswith("slot shorter than a step plus a save (120s")
    resume = [RunRecord(0.0, 3600.0, ending="announced", start_step=500, end_step=500, saves=2)] * 3
    verdict = no_progress(resume, 3)
    assert verdict is not None and verdict.cause.startswith("resume failing")
    uploads = [RunRecord(0.0, 3600.0, ending="announced", saves=2, uploads_failed=2)] * 3
    verdict = no_progress(uploads, 3)
    assert verdict is not None and verdict.cause.startswith("uploads failing")


def test_how_a_run_ended() -> None:
    """From why the controller stopped the run, and how far its deadline was."""
    assert ending_of("child", 50.0) == "child"
    assert ending_of("deadline", 0.0) == "announced"  # the deadline came, or the last planned save
    assert ending_of("sigterm", 100.0) == "announced"  # the reclamation, as the deadline said
    assert ending_of("sigterm", None) == "interrupted"  # preemption with no deadline near
    assert ending_of("sigterm", 5 * 3600.0) == "interrupted"
    assert ending_of("by hand", None) == ending_of("peer", 30.0) == ending_of("", None) == "other"


def test_the_controller_says_why_it_stopped() -> None:
    """Every exit the controller decides carries its cause: the stop after the last planned save
    is the deadline's, a SIGTERM's is the SIGTERM's, the child's own end is the child's."""
    from controller_driver import CHILD, Driver, exits

    from esiwrap.core import controller as core

    planned = Driver()
    planned.hello()
    planned.steps(1, 3, 10.0)
    planned.deadline(400.0)
    planned.steps(4, 20, 10.0)  # the insurance save is asked for on the way
    assert planned.controller.request is not None
    planned.save(planned.controller.obs.last_step or 0, 5.0)
    planned.advance(500.0)  # past the deadline: stopped, then killed (the child never exits here)
    assert [e.cause for e in exits(planned.actions)] == ["deadline"]
    stopped = Driver()
    stopped.hello()
    stopped.steps(1, 2, 10.0)
    stopped.feed(core.SignalReceived("SIGTERM"))  # a save, then the stop
    stopped.save(2, 1.0)
    stopped.feed(core.ChildExited(CHILD, 0))
    stopped.feed(core.TreeChecked(0))
    assert [e.cause for e in exits(stopped.actions)] == ["sigterm"]
    gone = Driver()
    gone.feed(core.ChildExited(CHILD, 3))
    gone.feed(core.TreeChecked(0))
    assert [(e.code, e.cause) for e in exits(gone.actions)] == [(3, "child")]


def test_vanished_runs_are_closed_as_interruptions() -> None:
    now = 1000.0
    here = RunRecord(0.0, now - 10.0, host="a")
    elsewhere_alive = RunRecord(0.0, now - 10.0, host="b")
    elsewhere_gone = RunRecord(0.0, now - STALE_AFTER_S - 1.0, host="b")
    closed = close_vanished([here, elsewhere_alive, elsewhere_gone], now, host="a")
    assert [r.ending for r in closed] == ["interrupted", "running", "interrupted"]


def test_a_run_that_vanished_at_its_deadline_went_with_it() -> None:
    """Capacity taken a little before its known deadline (a clock a little off, a reclamation a
    little early) is the deadline's reclamation, not an interruption without notice: counting it
    as one would raise the job's learned rate and its periodic saves. Far from the deadline, or
    with none known, a vanished run was interrupted."""
    now = 100_000.0
    seen = now - 10.0
    near = RunRecord(0.0, seen, "near", host="a", deadline_at=seen + 90.0)
    at_edge = RunRecord(0.0, seen, "edge", host="a", deadline_at=seen + ANNOUNCED_WITHIN_S)
    past = RunRecord(0.0, seen, "past", host="a", deadline_at=seen - 30.0)
    far = RunRecord(0.0, seen, "far", host="a", deadline_at=seen + ANNOUNCED_WITHIN_S + 1.0)
    unknown = RunRecord(0.0, seen, "unknown", host="a")
    closed = close_vanished([near, at_edge, past, far, unknown], now, host="a")
    assert [r.ending for r in closed] == ["announced", "announced", "announced", "interrupted", "interrupted"]
    assert abs(evidence(closed, None, now).interruptions - 2.0) < 1e-3  # only `far` and `unknown` count


@UNTIMED
@given(st.builds(RunRecord, started_at=st.floats(0, 1e9), seen_at=st.floats(1e9, 2e9),
                 run_id=st.text(max_size=8), nodes=st.integers(1, 4096),
                 capacity=st.sampled_from([None, "spot", "reserved", "on-demand"]),
                 source=st.text(max_size=8), ending=st.sampled_from(["running", "announced", "interrupted"]),
                 start_step=st.none() | st.integers(0, 10**6), end_step=st.none() | st.integers(0, 10**6),
                 saves=st.integers(0, 9), host=st.text(max_size=8),
                 deadline_at=st.none() | st.floats(1e9, 3e9)))
def test_records_round_trip(run: RunRecord) -> None:
    back = record_from_json(record_to_json(run))
    assert back is not None
    assert back.ending == run.ending and back.nodes == run.nodes and back.capacity == run.capacity
    assert back.start_step == run.start_step and back.end_step == run.end_step and back.host == run.host
    assert abs(back.seen_at - run.seen_at) < 1e-2
    assert (back.deadline_at is None) == (run.deadline_at is None)
    if back.deadline_at is not None and run.deadline_at is not None:
        assert abs(back.deadline_at - run.deadline_at) < 1e-2


@freeze_time("2026-12-01 00:00:00")
def test_the_state_file_keeps_the_runs_and_drops_a_bad_one() -> None:
    import time

    now = time.time()
    job = state.JobState(updated_at=now).with_run(RunRecord(now - 7200, now - 3600, "r1", capacity="spot",
                                                            ending="announced", start_step=3, end_step=9))
    text = state.render(job.with_run(RunRecord(now - 3000, now - 60, "r2", ending="running", host="h")))
    back = state.parse(text, now)
    assert [r.run_id for r in back.runs] == ["r1", "r2"]
    assert [r.ending for r in back.starting(now, "h").runs] == ["announced", "interrupted"]
    assert back.prior(now).runs == back.runs[:1]  # the open one is not evidence yet
    broken = text.replace('"nodes":1,"ending":"announced"', '"nodes":-1,"ending":"announced"')
    assert [r.run_id for r in state.parse(broken, now).runs] == ["r2"]


def test_an_unmeasured_upload_is_measured_at_once() -> None:
    """--upload, nothing uploaded yet: the first save comes as soon as a step is known, whatever
    the deadline; once an upload runs or was measured, planning is as before."""
    config = PolicyConfig(uploads=True)
    obs = Observations(100)
    obs.capacity = Capacity("reserved", 1, "cli")
    obs.trainer_started(0.0)
    obs.checkpoint_bytes, obs.bandwidth_bps = 1e9, 1e8  # a prior for the save, none for the upload
    assert next_save(3600.0, obs, config, 0, 1.0).kind == "insurance"  # type: ignore[union-attr]
    obs.record_step(1, 30.0, 30.0)
    near = next_save(900.0, obs, config, 0, 30.0)  # the insurance is next within 10 minutes anyway
    assert near is not None and near.kind == "insurance"
    first = next_save(3600.0, obs, config, 0, 30.0)
    assert first is not None and first.kind == "calibration" and "upload" in first.why
    obs.upload_began(100.0)
    obs.record_requested_save(10.0, 100.0)
    assert next_save(3600.0, obs, config, 0, 101.0).kind != "calibration"  # type: ignore[union-attr]
    measured = Observations(100, Prior(uploads=(120.0,)))
    measured.trainer_started(0.0)
    measured.record_step(1, 30.0, 30.0)
    assert next_save(3600.0, measured, config, 0, 30.0).kind != "calibration"  # type: ignore[union-attr]


def test_the_insurance_is_taken_where_the_final_save_is_at_risk() -> None:
    """A checkpoint 6 minutes before the insurance moment: on calm capacity the final save is
    enough (0.1 x 360 s < a 60 s save); on stormy capacity (60 a day) the insurance pays."""
    def plan(rate: float) -> str:
        obs = Observations(100)
        obs.capacity = Capacity("spot", 1, "src")
        obs.trainer_started(0.0)
        for k in range(1, 60):
            obs.record_step(k, 60.0, 60.0 * k)
        obs.record_requested_save(60.0, 3300.0, began_at=3240.0)
        chosen = next_save(3600.0 + 400.0, obs, PolicyConfig(interruption_rate_per_day=rate), 0, 3300.0)
        assert chosen is not None
        return chosen.kind

    assert plan(0.01) == "final"
    assert plan(60.0) == "insurance"


def test_the_report_names_the_rate_and_what_it_rests_on() -> None:
    from esiwrap.tools.report import render_text, summarize

    why = ("periodic: 41m since the last checkpoint (Young/Daly for 0.71 interruption(s) a day: spot "
           "capacity (aws-spot): default 8/day per instance, + this job's 0 interruption(s) without "
           "notice in 0.7 node-days over 2 earlier run(s) (state file); a save stops training 60s)")
    events = [{"timestamp": "2026-12-01T00:00:00Z", "run_id": "r", "event": "child_started", "pid": 1},
              {"timestamp": "2026-12-01T00:00:01Z", "run_id": "r", "event": "save_scheduled",
               "kind": "periodic", "why": why},
              {"timestamp": "2026-12-01T00:00:02Z", "run_id": "r", "event": "supervisor_exit", "code": 75}]
    run = summarize(events)
    assert run.interruption_rate is not None
    assert run.interruption_rate.startswith("0.71 interruption(s) a day")
    assert "over 2 earlier run(s) (state file)" in run.interruption_rate
    assert "  rate      0.71 interruption(s) a day: spot capacity" in render_text([run], 0)


def test_a_run_killed_on_a_machine_that_lived_on_is_not_an_interruption() -> None:
    """The run the state file's lock names as killed ends `killed`; other open records on this
    host still end `interrupted`; neither is `killed` when the lock says nothing."""
    now = 1.8e9
    runs = (RunRecord(now - 500, now - 10, "k", host="h"), RunRecord(now - 900, now - 600, "v", host="h"))
    assert [r.ending for r in close_vanished(runs, now, "h", killed="k")] == ["killed", "interrupted"]
    assert [r.ending for r in close_vanished(runs, now, "h")] == ["interrupted", "interrupted"]
    assert evidence(close_vanished(runs, now, "h", killed="k"), None, now).interruptions < 1.0


def test_a_write_keeps_every_other_runs_record_at_its_latest() -> None:
    """This run's record is its own; another run's is the newer of the file's and this run's view
    (seen later, or closed); a record only the file has is kept, in start order."""
    now = 1.8e9
    mine = RunRecord(now - 50, now, "me", host="a")
    other_then = RunRecord(now - 300, now - 200, "other", host="b")
    other_now = RunRecord(now - 300, now - 20, "other", host="b")
    newcomer = RunRecord(now - 40, now - 5, "newcomer", host="c")
    ours = state.JobState(updated_at=now, runs=(other_then, mine))
    disk = state.JobState(updated_at=now - 1, runs=(other_now, newcomer, replace(mine, seen_at=now - 30)))
    assert state.merged(disk, ours, "me").runs == (other_now, mine, newcomer)
