"""One live run per state file, with real esiwrap runs and real locks.

* A second run on a state file a live run holds exits 2 before its command starts, naming the
  holder (pid, host, run id) and the fix; the first run is untouched.
* A holder killed with SIGKILL on this machine, which lived on, leaves its lock: the next run
  takes it over (`state_lock_taken_over`) and records the killed run as `killed`, not as an
  interruption of the capacity. The same holder left from another boot (a new instance with the
  same host name) is an interruption.
* A lock still held for another host that stopped refreshing it (a network filesystem keeping a
  vanished machine's lock) is broken; one refreshed recently keeps the second run out.
* A record another writer put in the file meanwhile (an older esiwrap, which takes no lock) is
  kept by every write.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import PLAIN_TRAINER, PYTHON, EsiwrapRun, kill_leftovers

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_USAGE

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
FAST = ["--stop-grace", "2", "--status-file", "none", "--redundant-time", "1", "--save-duration", "0.3",
        "--final-margin", "0.5", "--no-probe-storage"]


def start(tmp: Path, deadline: str, *extra: str, marker: Path | None = None) -> EsiwrapRun:
    command = [PYTHON, str(PLAIN_TRAINER), "--ckpt", str(tmp / "ckpt.json"), "--step-seconds", "0.2"]
    if marker is not None:  # the command proves it ran by leaving a file
        command = ["sh", "-c", f'touch "{marker}" && exec "$@"', "sh", *command]
    return EsiwrapRun(["--deadline", deadline, *FAST, "--state-file", str(tmp / "state.json"), *extra, "--",
                       *command])


def runs(tmp: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads((tmp / "state.json").read_text())["runs"]
    return found


def holding(tmp: Path, run: EsiwrapRun) -> str:
    """Wait until `run` holds the state file (its record is on disk); its run id."""
    run.wait_for(lambda e: (tmp / "state.json").exists() and e["event"] == "step_observed", 60,
                 "the first run's record on disk")
    return str(run.first("child_started")["run_id"])


def test_a_second_run_on_a_live_state_file_exits_2_before_its_command_starts(tmp_path: Path) -> None:
    """The second run says who holds the file and what to do, exits 2, and its command never runs;
    the first run goes on to its own exit 75 with its record intact."""
    first = start(tmp_path, "+30s", "--log-level", "debug")
    try:
        run_id = holding(tmp_path, first)
        marker = tmp_path / "second-ran"
        second = start(tmp_path, "+30s", marker=marker)
        code = second.finish(timeout=60)
        said = " ".join(second.other_lines)
        assert code == EXIT_USAGE, second.story()
        assert not marker.exists()
        assert f"pid {first.pid} on {socket.gethostname()}, run {run_id[:8]}" in said
        assert "holds this state file: give each job its own --state-file" in said
        assert str(tmp_path / "state.json") in said
        first.signal(signal.SIGTERM)
        assert first.finish(timeout=60) == EXIT_CHECKPOINTED
    finally:
        first.kill()
    (record,) = runs(tmp_path)
    assert record["run_id"] == run_id and record["ending"] in ("announced", "interrupted")


def killed_holder(tmp: Path) -> tuple[int, str]:
    """A run SIGKILLed while it holds the state file: its esiwrap pid and run id."""
    run = start(tmp, "+120s", "--log-level", "debug")
    try:
        run_id = holding(tmp, run)
        child = run.child_pid()
        run.signal(signal.SIGKILL)
        run.finish(timeout=30)
    finally:
        run.kill()
        kill_leftovers(run.pid)
    kill_leftovers(child)
    return run.pid, run_id


def finish_after(tmp: Path) -> EsiwrapRun:
    run = start(tmp, "+4s")
    try:
        assert run.finish(timeout=120) == EXIT_CHECKPOINTED, run.story()
    finally:
        run.kill()
    return run


def test_a_sigkilled_holder_is_taken_over_and_recorded_as_killed(tmp_path: Path) -> None:
    """Its lock file still names it; the next run takes the lock over, says so, and the history
    says the killed run was killed (not an interruption that would raise the learned rate)."""
    pid, run_id = killed_holder(tmp_path)
    after = finish_after(tmp_path)
    (taken,) = [e for e in after.events if e["event"] == "state_lock_taken_over"]
    assert taken["holder_pid"] == pid and taken["holder_run_id"] == run_id
    assert taken["holder_host"] == socket.gethostname() and taken["recorded_as"] == "killed"
    assert f"pid {pid} is gone" in taken["why"] or "gone" in taken["why"]
    killed, this = runs(tmp_path)
    assert (killed["run_id"], killed["ending"]) == (run_id, "killed")
    assert this["ending"] == "announced"


def test_a_holder_left_from_another_boot_was_an_interruption(tmp_path: Path) -> None:
    """The same leftover lock, but written on another boot of a machine with this host name (a
    new instance of the same container): the run vanished with its capacity: `interrupted`."""
    _, run_id = killed_holder(tmp_path)
    lock = tmp_path / "state.json.lock"
    record = json.loads(lock.read_text())
    lock.write_text(json.dumps({**record, "boot_id": "another-boot"}) + "\n")
    after = finish_after(tmp_path)
    (taken,) = [e for e in after.events if e["event"] == "state_lock_taken_over"]
    assert taken["recorded_as"] == "interrupted"
    first = runs(tmp_path)[0]
    assert (first["run_id"], first["ending"]) == (run_id, "interrupted")


HOLD = """
import fcntl, json, os, sys, time
path, host, age = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
now = time.time()
os.write(fd, json.dumps({"host": host, "pid": 4242, "run_id": "elsewhere", "started_at": now - age,
                         "refreshed_at": now - age, "boot_id": "theirs"}).encode())
print("holding", flush=True)
sys.stdin.read()
"""


def held_elsewhere(tmp: Path, age_s: float) -> subprocess.Popen[str]:
    """A process that holds the lock for another host, whose record was last refreshed `age_s` ago."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp / "state.json.lock"), "gpu-node-9",
                               str(age_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


def test_a_lock_another_host_stopped_refreshing_is_broken_and_a_fresh_one_is_kept(tmp_path: Path) -> None:
    """Held for gpu-node-9, refreshed 10 minutes ago: that machine is gone, the run takes over and
    ends in 75. Refreshed a moment ago: the run is refused (exit 2) and names gpu-node-9."""
    fresh = held_elsewhere(tmp_path, 1.0)
    try:
        refused = start(tmp_path, "+4s")
        assert refused.finish(timeout=60) == EXIT_USAGE
        assert "pid 4242 on gpu-node-9, run elsewher" in " ".join(refused.other_lines)
    finally:
        fresh.kill()
        fresh.wait()
        refused.kill()
    (tmp_path / "state.json.lock").unlink()
    stale = held_elsewhere(tmp_path, 600.0)
    try:
        after = finish_after(tmp_path)
    finally:
        stale.kill()
        stale.wait()
    (taken,) = [e for e in after.events if e["event"] == "state_lock_taken_over"]
    assert taken["holder_host"] == "gpu-node-9" and "has not refreshed its lock" in taken["why"]


def test_a_record_another_writer_added_is_kept_by_every_write(tmp_path: Path) -> None:
    """While a run holds the file, a writer that takes no lock (an older esiwrap) adds its record;
    the run's later writes, up to its last, keep it."""
    run = start(tmp_path, "+6s", "--log-level", "debug")
    try:
        own = holding(tmp_path, run)
        state = tmp_path / "state.json"
        text = json.loads(state.read_text())
        now = time.time()
        text["runs"].append({"started_at": now - 100, "seen_at": now - 1, "nodes": 1, "ending": "running",
                             "run_id": "older-writer", "host": "gpu-node-7"})
        tmp = tmp_path / "state.json.other"
        tmp.write_text(json.dumps(text))
        os.replace(tmp, state)
        assert run.finish(timeout=120) == EXIT_CHECKPOINTED, run.story()
    finally:
        run.kill()
    assert sorted(r["run_id"] for r in runs(tmp_path)) == sorted([own, "older-writer"])
