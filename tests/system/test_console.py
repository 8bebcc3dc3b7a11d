"""The `esiwrap` executable (esiwrap._console): exit codes, output and log files intact although
it leaves with os._exit, and the collector back on once start-up is over."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from esiwrap.cli import resume_gc

SCRIPT = Path(sys.executable).parent / "esiwrap"


def esiwrap(*args: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), f"no console script at {SCRIPT}: install the package (scripts/test.sh does)"
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.system
def test_exit_codes_and_output_survive_the_fast_exit(tmp_path: Path) -> None:
    """--version, a usage error, a supervised command's own code, its log file and a report
    printed to a pipe: all complete, with the codes the contract names."""
    version = esiwrap("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("esiwrap ")
    bad = esiwrap("--stop-grace", "soon", "--", "true")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--stop-grace 'soon'" in bad.stderr

    log = tmp_path / "run.jsonl"
    run = esiwrap("--sources", "cli,env", "--log-file", str(log), "--", "sh", "-c", "exit 3")
    assert run.returncode == 3
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[-1]["event"] == "supervisor_exit" and events[-1]["code"] == 3

    report = esiwrap("report", str(log))
    assert report.returncode == 0 and report.stdout.endswith("(1 run; 0 other lines skipped)\n")
    nobody = esiwrap("status", "--status-file", str(tmp_path / "none.json"))
    assert nobody.returncode == 3 and nobody.stderr.startswith("esiwrap: no esiwrap is running")


@pytest.mark.system
def test_a_closed_pipe_is_not_an_error(tmp_path: Path) -> None:
    """`esiwrap report LOG | head -c 10`: the reader leaves early; no traceback, no noise."""
    log = tmp_path / "run.jsonl"
    esiwrap("--sources", "cli,env", "--log-file", str(log), "--", "true")
    lines = log.read_text() * 2000  # enough output to outlast the pipe's buffer
    many = tmp_path / "many.jsonl"
    many.write_text(lines)
    done = subprocess.run(["sh", "-c", f"'{SCRIPT}' report '{many}' | head -c 10"], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout == "run " + lines.split('"run_id":"', 1)[1][:6]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_resume_gc_turns_the_collector_back_on_with_start_up_frozen() -> None:
    """After start-up the collector runs again, skipping what existed then."""
    gc.disable()
    try:
        resume_gc()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        resume_gc()  # already on: nothing more to do
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()
