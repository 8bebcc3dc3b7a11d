"""The JSON-lines contract: every line has timestamp (UTC, ms), level, event, run_id."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON

from esiwrap.shell import log
from esiwrap.shell.log import capture_logs

TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def test_every_json_line_has_the_contract_fields(esiwrap) -> None:
    """A whole run's log: one JSON object per line, the four contract keys first."""
    run = esiwrap("--deadline", "+1h", "--", "sh", "-c", "exit 0")
    run.finish(30)
    assert run.other_lines == []
    run_ids = {e["run_id"] for e in run.events}
    assert len(run_ids) == 1
    for event in run.events:
        assert list(event)[:4] == ["timestamp", "level", "event", "run_id"]
        assert TIMESTAMP.match(event["timestamp"]), event["timestamp"]
    assert run.names()[0] == "child_started" and run.names()[-1] == "supervisor_exit"


def test_the_command_sees_the_run_id_socket_and_save_signal(esiwrap) -> None:
    """The command's environment names the run (`ESIWRAP_RUN_ID`, the `run_id` of the log), the
    channel (`ESIWRAP_SOCKET`) and the save signal (`ESIWRAP_SIGNAL`), as docs/trainer.md says."""
    show = 'echo "run=$ESIWRAP_RUN_ID signal=$ESIWRAP_SIGNAL socket=${ESIWRAP_SOCKET:+set}"'
    run = esiwrap("--signal", "SIGUSR2", "--", "sh", "-c", show)
    assert run.finish(timeout=30) == 0
    assert run.stdout.decode().strip() == f"run={run.events[0]['run_id']} signal=SIGUSR2 socket=set"


@pytest.mark.system
def test_log_file_gets_json_while_console_is_readable(tmp_path: Path) -> None:
    """--log-format console for people, --log-file keeps the JSON lines for jq and report."""
    log_file = tmp_path / "run.jsonl"
    done = subprocess.run(
        [PYTHON, "-m", "esiwrap", "--log-format", "console", "--log-file", str(log_file), "--",
         "sh", "-c", "exit 0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "child_started" in done.stderr and not done.stderr.lstrip().startswith("{")
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [e["event"] for e in events][-1] == "supervisor_exit"


def test_configure_binds_run_id_and_filters_levels() -> None:
    """--log-level info drops debug events; capture_logs sees what the supervisor emits."""
    stream = io.StringIO()
    log.configure("abc123", level="info", fmt="json", stream=stream)
    logger = log.get_logger()
    logger.debug("step_observed", step=1)
    logger.info("save_completed", step=2)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["event"], e["run_id"]) for e in lines] == [("save_completed", "abc123")]
    with capture_logs() as captured:
        log.get_logger().info("deadline_resolved", source="cli")
    assert captured == [{"event": "deadline_resolved", "source": "cli", "log_level": "info"}]
