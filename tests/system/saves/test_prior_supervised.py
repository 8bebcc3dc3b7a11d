"""The prior end to end (issue 17): a real trainer reports its checkpoint's size, esiwrap probes
the storage the checkpoints go to (a real FUSE filesystem paced like network storage), plans its
first save from the two and meets a deadline that the blind guess misses.

The deadline comes from the Volcengine fakes, set once both trainers are ready: how long torch
takes to start on a busy node (10 s and more) must not eat into it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import slowfs
from esiwrap_harness import PYTHON, TINY_TRAINER, EsiwrapRun
from fakes.fixtures import SCHEDULED_ID, rfc3339_in
from fakes.volcengine_api import FakeVolcengineApi

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_SAVE_MISSED
from esiwrap.shell.storage_probe import (
    PROBE_CHUNK_BYTES,
    PROBE_MAX_BYTES,
    PROBE_MAX_S,
    measure_checkpoint,
    probe_bandwidth,
)
from esiwrap.times import iso_epoch

pytestmark = pytest.mark.system

PACE_BPS = 8e6  # the filesystem's write speed: a 32 MB checkpoint takes 4 s or more
FROZEN_MB = "32"
DEADLINE_IN_S = 40  # from the moment both runs are ready


@pytest.fixture(scope="module")
def slow_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with slowfs.mounted(tmp_path_factory.mktemp("slowfs"), PACE_BPS) as mnt:
        yield mnt


def trainer_run(esiwrap, ckpt: Path, env: dict[str, str], *flags: str) -> EsiwrapRun:
    # A guess of 1 s (--save-duration 1 --unmeasured-factor 1) that the real save far exceeds.
    return esiwrap("--sources", "volcengine", "--refresh", "1", "--redundant-time", "2",
                   "--save-duration", "1", "--unmeasured-factor", "1", "--final-margin", "1",
                   "--stop-grace", "20", *flags, "--",
                   PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(ckpt), "--step-seconds", "0.5",
                   "--frozen-mb", FROZEN_MB, env=env)


def test_the_probe_measures_the_paced_storage_and_leaves_nothing(slow_storage: Path) -> None:
    """The probe writes a bounded amount with fdatasync, finds about the filesystem's pace (FUSE
    adds its own cost: slower, never faster) and removes its file."""
    probe = probe_bandwidth(str(slow_storage))
    assert probe.bandwidth_bps is not None and probe.error == ""
    assert probe.bandwidth_bps <= PACE_BPS * 1.1
    # bounded: the chunk that crosses PROBE_MAX_S is the last, and at this pace a chunk takes over
    # a second (however busy the machine: slower, never faster)
    assert PROBE_CHUNK_BYTES / PACE_BPS > PROBE_MAX_S / 2
    assert 0 < probe.written_bytes <= min(PROBE_MAX_BYTES, 2 * PROBE_CHUNK_BYTES)
    assert not [p for p in os.listdir(slow_storage) if p.startswith(".esiwrap-probe-")]


def test_a_size_reported_meets_a_deadline_the_guess_misses(esiwrap, slow_storage: Path,
                                                          cloud_env: dict[str, str],
                                                          fake_api: FakeVolcengineApi) -> None:
    """The same trainer and flags twice, and a release time 40 s away once both are ready.
    Without the probe, the first save is planned on the 1 s guess, comes 3.5 s before the
    deadline and cannot finish before it (4 s at the filesystem's pace): the deadline passes with
    the save under way. The fake instance is not reclaimed, so that save ends as a last-chance
    one, after the deadline (on real capacity, lost with it). With the probe, `save_scheduled`
    rests on the prior (the trainer's bytes at the probed speed) with an estimate above the real
    save, which then completes before the deadline: exit 75."""
    fake_api.set_release(SCHEDULED_ID, "")  # no release time yet: no deadline
    blind = trainer_run(esiwrap, slow_storage / "blind", cloud_env, "--no-probe-storage")
    informed = trainer_run(esiwrap, slow_storage / "informed", cloud_env)
    blind.wait_event("trainer_attached", timeout=120)
    informed.wait_event("storage_probed", timeout=120)
    fake_api.set_release(SCHEDULED_ID, rfc3339_in(DEADLINE_IN_S))
    blind_exit = blind.finish(timeout=120)
    assert "a guess" in blind.first("save_scheduled")["why"]
    assert "deadline_passed_alive" in blind.names(), blind.names()
    if blind_exit == EXIT_CHECKPOINTED:  # the last-chance save completed: the reason says when
        assert blind.first("save_completed")["remaining_s"] < 0
        assert "after the deadline" in blind.first("supervisor_exit")["reason"]
    else:
        assert blind_exit == EXIT_SAVE_MISSED
    assert informed.finish(timeout=120) == EXIT_CHECKPOINTED, informed.names()

    attached = informed.first("trainer_attached")
    assert attached["checkpoint_bytes"] > float(FROZEN_MB) * 1e6
    probed = informed.first("storage_probed")
    # the checkpoint directory does not exist before the first save: its nearest ancestor is probed
    assert probed["path"] == str(slow_storage) and probed["bandwidth_mb_s"] > 0
    planned = [e for e in informed.events if e["event"] == "save_scheduled" and "prior" in e["why"]]
    assert planned, [e["why"] for e in informed.events if e["event"] == "save_scheduled"]
    completed = informed.first("save_completed")
    assert planned[-1]["save_estimate_s"] > completed["duration_s"]
    assert completed["remaining_s"] > 0
    deadline = iso_epoch(informed.first("deadline_resolved")["deadline"])
    assert iso_epoch(completed["timestamp"]) < deadline
    assert (slow_storage / "informed" / "latest.pt").stat().st_size > float(FROZEN_MB) * 1e6


def test_a_previous_checkpoint_tells_its_size_and_speed(tmp_path: Path) -> None:
    """A checkpoint directory's files: their bytes, and the speed from the time between the first
    file's end and the last one's, when most bytes fall in that span."""
    shards = tmp_path / "global_step_9"
    shards.mkdir()
    for i, (size, mtime) in enumerate([(1_000, 100.0), (4_000_000, 102.0), (4_000_000, 104.0)]):
        path = shards / f"shard-{i}"
        path.write_bytes(b"\0" * size)
        os.utime(path, (mtime, mtime))
    measured = measure_checkpoint(str(shards))
    assert measured.written_bytes == 8_001_000
    assert measured.bandwidth_bps == pytest.approx(8_000_000 / 4.0)
    lone = tmp_path / "one.pt"
    lone.write_bytes(b"\0" * 10)
    only_size = measure_checkpoint(str(lone))
    assert only_size.written_bytes == 10 and only_size.bandwidth_bps is None and only_size.error
    assert measure_checkpoint(str(tmp_path / "missing")).error
