"""Knowledge before the first save: the prior from a checkpoint's size and the storage's speed,
and the interruption rate from the capacity's kind (issue 17).

Pure policy rules first, then the controller: the probe it asks for, what it makes of the answer,
the capacity and node count it learns from the sources and the trainers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from controller_driver import CHILD, Driver, logs
from hypothesis import given
from hypothesis import strategies as st

from esiwrap.core import controller as core
from esiwrap.core.controller import ControllerConfig
from esiwrap.core.policy import (
    NODE_FAILURE_RATE_PER_DAY,
    PRIOR_COVER_Z,
    SPOT_RATE_PER_DAY,
    UNKNOWN_RATE_PER_DAY,
    Capacity,
    Observations,
    PolicyConfig,
    interruption_rate,
    next_save,
    periodic_interval_s,
    plan_save,
    prior_margin,
    prior_save_s,
    save_estimate_s,
    unmeasured_save_s,
)
from esiwrap.core.values import Answer, Deadline

GB = 1e9
DEADLINE = 100_000.0


def attached(nbytes: float | None = None, bandwidth: float | None = None, at: float = 0.0) -> Observations:
    obs = Observations(100)
    obs.trainer_started(at)
    obs.record_step(1, 60.0, at + 60.0)
    obs.checkpoint_bytes, obs.bandwidth_bps = nbytes, bandwidth
    return obs


# ------------------------------------------------------------------ the prior
def test_the_prior_is_bytes_over_bandwidth_and_the_insurance_save_covers_its_error() -> None:
    """140 GB at 200 MB/s is 700 s; the insurance save allows that times exp(sigma x z)."""
    obs = attached(140 * GB, 200e6)
    config = PolicyConfig()
    assert prior_save_s(obs) == pytest.approx(700.0)
    assert prior_margin(config) == pytest.approx(math.exp(0.5 * PRIOR_COVER_Z))
    assert save_estimate_s(obs, config, "insurance") == pytest.approx(700.0 * prior_margin(config))
    plan = plan_save(DEADLINE, obs, config, "insurance")
    assert "prior 700s from 140 GB at 200 MB/s (probe)" in plan.why


def test_a_prior_replaces_the_guess_that_misses_a_big_checkpoint() -> None:
    """A 20-minute save: the blind guess (6 x 60 s) plans 6 minutes; the prior plans for more than
    the real save, so the insurance save is asked for early enough to land."""
    config = PolicyConfig()
    blind = plan_save(DEADLINE, attached(), config, "insurance")
    known = plan_save(DEADLINE, attached(240 * GB, 200e6), config, "insurance")
    assert blind.save_estimate_s == 360.0 and "a guess" in blind.why
    assert known.save_estimate_s > 1200.0
    assert known.signal_at < DEADLINE - 1200.0 - config.redundant_s


def test_without_size_or_speed_the_old_guess_stays() -> None:
    """A size without a measured speed, or the other way round, is no prior."""
    config = PolicyConfig()
    for obs in (attached(10 * GB, None), attached(None, 500e6)):
        assert prior_save_s(obs) is None
        assert unmeasured_save_s(obs, config) == config.save_duration_s * config.unmeasured_factor


def test_a_measured_save_outranks_the_prior() -> None:
    """Once a save was measured, the prior is not used at all."""
    obs = attached(140 * GB, 200e6)
    obs.record_requested_save(300.0, at=1000.0)
    config = PolicyConfig()
    assert save_estimate_s(obs, config, "insurance") == pytest.approx(300.0 * config.save_safety_factor)
    assert "save measured" in plan_save(DEADLINE, obs, config, "insurance").why


@given(st.floats(1e6, 1e13), st.floats(1e6, 1e11))
def test_the_prior_estimate_never_falls_below_the_prior(nbytes: float, bandwidth: float) -> None:
    """Whatever the size and speed, the insurance save plans at least bytes / bandwidth."""
    obs = attached(nbytes, bandwidth)
    assert save_estimate_s(obs, PolicyConfig(), "insurance") >= nbytes / bandwidth


def test_no_calibration_save_with_a_prior_or_while_one_is_coming() -> None:
    """Hours before the deadline with nothing measured: a blind run calibrates at once; a run with
    a prior plans its insurance save instead, and so does one whose probe is still running."""
    config = PolicyConfig(interruption_rate_per_day=0.0)
    blind = next_save(DEADLINE, attached(), config, 0, now=100.0)
    assert blind is not None and blind.kind == "calibration"
    known = next_save(DEADLINE, attached(10 * GB, 1e9), config, 0, now=100.0)
    assert known is not None and known.kind == "insurance"
    pending = attached(10 * GB)
    pending.prior_pending = True
    waiting = next_save(DEADLINE, pending, config, 0, now=100.0)
    assert waiting is not None and waiting.kind == "insurance"


def test_no_calibration_before_a_trainer_said_what_it_knows() -> None:
    """A deadline known before any trainer attached: no calibration is decided yet."""
    obs = Observations(100)
    plan = next_save(DEADLINE, obs, PolicyConfig(interruption_rate_per_day=0.0), 0, now=0.0)
    assert plan is not None and plan.kind == "insurance"


# ------------------------------------------------------------------ the interruption rate
@pytest.mark.parametrize(("capacity", "rate"), [
    (Capacity(), UNKNOWN_RATE_PER_DAY),
    (Capacity("spot", 1, "aws-spot"), SPOT_RATE_PER_DAY),
    (Capacity("spot", 4), 4 * SPOT_RATE_PER_DAY),
    (Capacity("reserved", 1, "volcengine"), NODE_FAILURE_RATE_PER_DAY),
    (Capacity("on-demand", 32), 32 * NODE_FAILURE_RATE_PER_DAY),
])
def test_the_rate_follows_the_capacity_and_its_nodes(capacity: Capacity, rate: float) -> None:
    """Spot capacity per instance, reserved and on-demand per node, unknown one a day."""
    obs = attached()
    obs.capacity = capacity
    assert interruption_rate(obs, PolicyConfig())[0] == pytest.approx(rate)


def test_the_flag_overrides_the_capacity_and_the_periodic_why_names_the_rate() -> None:
    """--interruption-rate wins over the capacity; a periodic save says which rate it assumed."""
    obs = attached(1 * GB, 1e9)
    obs.capacity = Capacity("spot", 1, "aws-spot")
    assert interruption_rate(obs, PolicyConfig(interruption_rate_per_day=0.5)) == (0.5, "--interruption-rate")
    plan = next_save(DEADLINE, obs, PolicyConfig(), 0, now=100.0)
    assert plan is not None and plan.kind == "periodic"
    assert f"{SPOT_RATE_PER_DAY:g} interruption(s) a day: spot capacity (aws-spot)" in plan.why


def test_a_reserved_slot_of_eight_hours_takes_no_periodic_save() -> None:
    """One node of reserved capacity: node failures put Young/Daly's interval beyond 8 hours, so
    the first save is the insurance save; unknown capacity still takes periodic ones."""
    reserved, unknown = attached(60 * GB, 1e9), attached(60 * GB, 1e9)
    reserved.capacity = Capacity("reserved", 1, "volcengine")
    deadline = 8 * 3600.0
    interval = periodic_interval_s(reserved, PolicyConfig())
    assert interval is not None and interval > deadline
    first = next_save(deadline, reserved, PolicyConfig(), 0, now=100.0)
    assert first is not None and first.kind == "insurance"
    other = next_save(deadline, unknown, PolicyConfig(), 0, now=100.0)
    assert other is not None and other.kind == "periodic"


# ------------------------------------------------------------------ the controller
def probes(actions: list[core.Action]) -> list[core.ProbeStorage]:
    return [a for a in actions if isinstance(a, core.ProbeStorage)]


def test_a_trainer_that_names_its_checkpoint_directory_gets_its_storage_probed() -> None:
    """The hello names the directory: the controller asks the shell to probe it, once; the answer
    is logged and the next plan rests on the prior."""
    d = Driver()
    d.deadline(2 * 3600.0)
    out = d.hello(checkpoint_bytes=50 * GB, checkpoint_dir="/ckpt", resumed_from="/ckpt/step-9")
    assert probes(out) == [core.ProbeStorage("/ckpt", "/ckpt/step-9", int(50 * GB))]
    assert probes(d.hello(pid=CHILD + 1, checkpoint_dir="/other")) == []  # asked once
    out = d.feed(core.StorageProbed("/ckpt", 250e6, written_bytes=256e6, seconds=1.02))
    probed = logs(out, "storage_probed")
    assert probed and probed[0]["bandwidth_mb_s"] == 250.0 and probed[0]["written_bytes"] == 256_000_000
    scheduled = logs(out, "save_scheduled")
    assert scheduled and "prior 200s from 50 GB at 250 MB/s (probe)" in scheduled[-1]["why"]


def test_without_a_directory_the_state_files_directory_is_probed() -> None:
    """No trainer names a directory: the one of --state-file (next to the checkpoints) is used."""
    d = Driver(ControllerConfig(probe_dir="/mnt/job"))
    d.deadline(3600.0)
    assert probes(d.hello(checkpoint_bytes=GB)) == [core.ProbeStorage("/mnt/job", None, int(GB))]


def test_no_probe_when_turned_off_or_already_measured() -> None:
    """--no-probe-storage asks for nothing; nor does a run with measured saves (the state file)."""
    off = Driver(ControllerConfig(probe_storage=False))
    off.deadline(3600.0)
    assert probes(off.hello(checkpoint_bytes=GB, checkpoint_dir="/ckpt")) == []
    from esiwrap.core.controller import Controller
    from esiwrap.core.policy import Prior

    measured = Driver(controller=Controller(ControllerConfig(), prior=Prior(steps=[1.0], saves=[30.0])))
    assert probes(measured.hello(checkpoint_dir="/ckpt")) == []


def test_a_failed_probe_is_a_warning_and_the_guess_stays() -> None:
    """The probe could not write: one warning with the reason; plans keep the guess."""
    d = Driver()
    d.deadline(3600.0)
    d.hello(checkpoint_bytes=GB, checkpoint_dir="/ro")
    out = d.feed(core.StorageProbed("/ro", None, error="Read-only file system (/ro)"))
    warning = logs(out, "storage_probed")
    assert warning[0]["level"] == "warning" and "Read-only" in warning[0]["error"]
    assert d.controller.obs.bandwidth_bps is None


def test_the_probe_is_repeated_rarely_while_nothing_is_measured() -> None:
    """Six hours after a probe, with still no save measured, the storage is probed again."""
    d = Driver(ControllerConfig(policy=PolicyConfig(interruption_rate_per_day=0.0)))
    d.deadline(20 * 3600.0)
    d.hello(checkpoint_bytes=GB, checkpoint_dir="/ckpt")
    d.feed(core.StorageProbed("/ckpt", 1e9, 256e6, 0.3))
    assert probes(d.advance(5 * 3600.0)) == []
    assert probes(d.advance(1.5 * 3600.0)) == [core.ProbeStorage("/ckpt", None, int(GB))]


def test_the_previous_checkpoint_gives_size_and_speed_when_the_trainer_gives_none() -> None:
    """A resumed trainer that reports no size: its previous checkpoint's bytes are the size."""
    d = Driver()
    d.deadline(3600.0)
    d.hello(resumed_from="/ckpt/step-9")
    d.feed(core.StorageProbed("/ckpt/step-9", 80e6, written_bytes=8 * GB, seconds=100.0,
                              source="previous checkpoint"))
    assert d.controller.obs.checkpoint_bytes == 8 * GB
    assert d.controller.obs.bandwidth_source == "previous checkpoint"


def test_a_checkpoint_size_message_updates_the_prior() -> None:
    """The optimizer's state appears after the first step: a later size message counts."""
    d = Driver()
    d.deadline(3600.0)
    d.hello(checkpoint_bytes=1 * GB, checkpoint_dir="/ckpt")
    d.feed(core.StorageProbed("/ckpt", 1e9, 256e6, 0.3))
    d.feed(core.CheckpointSize(CHILD, 3 * GB))
    assert prior_save_s(d.controller.obs) == pytest.approx(3.0)


def test_the_capacity_kind_comes_from_the_sources_and_spot_wins() -> None:
    """A reserved end and a spot source at once: spot (the first reclamation counts); the rate
    in a periodic save's why names the source."""
    d = Driver()
    reserved = Deadline(at=d.wall + 8 * 3600.0, source="volcengine", capacity="reserved")
    d.feed(core.DeadlineAnswers((Answer("volcengine", deadline=reserved, capacity="reserved"),
                                 Answer("aws-spot", reason="no notice", expected=True, capacity="spot"))))
    assert d.controller.obs.capacity == Capacity("spot", 1, "aws-spot")


def test_the_job_spans_every_watched_ray_node_or_what_torchrun_said() -> None:
    """Two other Ray nodes answered: three nodes; a trainer's hello that says more wins."""
    d = Driver()
    d.feed(core.DeadlineAnswers(tuple(
        Answer(f"node:{n}/env:MLP", reason="not set", expected=True) for n in ("aaaa1111", "bbbb2222"))))
    assert d.controller.obs.capacity.nodes == 3
    d.hello(nodes=16)
    assert d.controller.obs.capacity.nodes == 16


# ------------------------------------------------------------------ the trainer's size
def test_checkpoint_bytes_counts_tensors_once_and_foresees_adams_state() -> None:
    """A model's parameters and buffers; Adam's two tensors per parameter before its first step
    (it has none yet) and its real state after; a tensor shared by two objects counts once."""
    torch = pytest.importorskip("torch")
    import esiwrap.trainer as esi

    model = torch.nn.Sequential(torch.nn.Linear(100, 10), torch.nn.BatchNorm1d(10))
    params = sum(p.numel() * 4 for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert esi.checkpoint_bytes(model) == params + buffers
    adam = torch.optim.Adam(model.parameters())
    assert esi.checkpoint_bytes(model, adam) == params + buffers + 2 * params
    model(torch.randn(4, 100)).sum().backward()
    adam.step()
    steps = sum(s["step"].numel() * s["step"].element_size() for s in adam.state.values())
    assert esi.checkpoint_bytes(model, adam) == params + buffers + 2 * params + steps
    plain_sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert esi.checkpoint_bytes(plain_sgd) == 0
    weight = model[0].weight
    assert esi.checkpoint_bytes(weight, {"again": weight}, [weight]) == weight.numel() * 4


def test_a_probe_never_writes_more_than_a_checkpoint_and_little_while_its_size_is_unknown(
        tmp_path: Path) -> None:
    """The probe's bound is the checkpoint's size, or 64 MiB while no trainer said how big a
    checkpoint is (not the gigabyte it may write in two seconds); the shell's prober then writes
    no more than that, and at least 64 KiB (an 18 KB checkpoint: 64 KiB, really written)."""
    import threading

    from esiwrap.core.controller.probe import UNKNOWN_SIZE_PROBE_BYTES
    from esiwrap.shell.storage_probe import StorageProber

    unknown = Driver()
    unknown.deadline(3600.0)
    assert probes(unknown.hello(checkpoint_dir="/ckpt")) == [
        core.ProbeStorage("/ckpt", None, UNKNOWN_SIZE_PROBE_BYTES)]
    assert UNKNOWN_SIZE_PROBE_BYTES == 64 << 20
    small = Driver()
    small.deadline(3600.0)
    (asked,) = probes(small.hello(checkpoint_bytes=18_000, checkpoint_dir=str(tmp_path)))
    assert asked.max_bytes == 18_000
    done = threading.Event()
    prober = StorageProber(done.set)
    try:
        prober.submit(asked.path, None, asked.max_bytes)
        assert done.wait(60)
        (measured,) = prober.drain()
    finally:
        prober.stop()
    assert measured.bandwidth_bps and measured.written_bytes == 64 << 10
    assert list(tmp_path.iterdir()) == []  # and removed
