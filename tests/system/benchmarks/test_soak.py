"""benchmarks/soak.py keeps working: one quick run of one load, read from esiwrap's own log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # both tests run benchmarks/soak.py

SOAK = Path(__file__).resolve().parents[3] / "benchmarks" / "soak.py"


def test_a_quick_soak_runs_esiwrap_and_reads_every_figure_from_its_log(tmp_path: Path) -> None:
    """One run of the idle load with the exit-76 test's trainer (it starts in milliseconds): the
    script launches the real CLI, reads the run's JSON log, and prints the table with its row;
    the JSON has the run's exit code and the figures the table is made of."""
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(SOAK), "--quick", "--loads", "idle", "--workload", "test76",
                           "--runs", "1", "--json", str(out), "--keep-logs", str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| idle: ")]
    assert len(rows) == 1 and "| load | at once | runs | misses |" in done.stdout
    document = json.loads(out.read_text())
    (load,) = document["loads"]
    (run,) = document["runs"]
    assert (load["runs"], load["parallel"], load["workload"]) == (1, 1, "test76")
    assert run["code"] in (75, 76), run  # it ran to its end (a miss is the table's to show)
    assert run["delivery_s"] and run["attached_s"] is not None and run["timer_max_s"] is not None
    assert run["code"] != 75 or (run["signal_late_s"] and run["final_margin_s"] is not None)
    assert list((tmp_path / "logs").rglob("esiwrap.jsonl"))


def test_an_unknown_load_is_refused_in_one_line() -> None:
    """A load name the script does not know stops before anything starts: one line, exit 2."""
    done = subprocess.run([sys.executable, str(SOAK), "--loads", "idle,nope"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "nope" in last and "busy4" in last
