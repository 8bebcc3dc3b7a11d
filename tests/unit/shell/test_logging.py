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
    assert run.names()[:2] == ["child_started", "settings"] and run.names()[-1] == "supervisor_exit"
    assert "settings" not in run.first("child_started")  # on a line of its own: lines stay short


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


SETTINGS = {f"--option-{n}": float(n) for n in range(21)}  # what child_started carries today
WHY = ("insurance: must land before the deadline; no save measured yet, prior 1s from 63756 B at "
       "312 MB/s (probe), planned as 6s")


def console_run(tmp_path: Path, environ: dict[str, str]) -> tuple[list[str], list[dict[str, object]]]:
    """Three events through the console format and a log file: the console's lines, the file's."""
    stream, log_file = io.StringIO(), tmp_path / "run.jsonl"
    try:
        log.configure("4fdf09bc26ce", fmt="console", log_file=str(log_file), stream=stream, environ=environ)
        logger = log.get_logger()
        logger.info("child_started", pid=42, argv=["python", "train.py"], host="vm", settings=SETTINGS)
        logger.info("save_scheduled", kind="insurance", in_s=25.835, why=WHY)
        logger.info("save_completed", step=27, duration_s=0.013)
    finally:
        log.reset()
    return stream.getvalue().splitlines(), [json.loads(line) for line in log_file.read_text().splitlines()]


def test_console_lines_fit_the_terminal_and_fold_what_the_json_log_keeps(tmp_path: Path) -> None:
    """`--log-format console` on an 80-column terminal: every line fits, an entry's further lines
    are indented by four spaces, the run's settings are cut to their first entries and a count
    (`… +N more`), the run's id is on the first entry only; the log file's JSON keeps it all."""
    lines, entries = console_run(tmp_path, {"COLUMNS": "80"})
    assert max(len(line) for line in lines) <= 80
    starts = [line for line in lines if not line.startswith(log.CONTINUATION)]
    assert [line.split("] ", 1)[1].split()[0] for line in starts] == [
        "child_started", "save_scheduled", "save_completed"]
    assert all(TIMESTAMP.match(line.split()[0]) for line in starts)
    text = " ".join(line.strip() for line in lines)
    assert "'--option-0': 0.0" in text and "… +" in text and "'--option-20'" not in text
    assert " ".join(WHY.split()) in text  # wrapped, not cut
    assert text.count("run_id=4fdf09bc26ce") == 1
    assert entries[0]["settings"] == SETTINGS and all(e["run_id"] == "4fdf09bc26ce" for e in entries)


def test_console_lines_are_not_wrapped_where_no_width_is_known(tmp_path: Path) -> None:
    """Not a terminal and no $COLUMNS: one line per entry (folded all the same)."""
    lines, _ = console_run(tmp_path, {})
    assert len(lines) == 3 and "… +" in lines[0]


@pytest.mark.parametrize("value", ["short", list(range(300)), {str(n): n for n in range(300)}, "x" * 1000])
def test_fold_keeps_short_values_and_says_how_much_it_cut(value: object) -> None:
    """A value short enough is the value; a longer one its first entries (or characters), then how
    many more there are."""
    folded = log.fold(value)
    if value == "short":
        assert folded == "short"
        return
    text = repr(folded)
    assert len(text) <= log.FOLD_KEEP_CHARS + 40
    if isinstance(value, str):
        assert text == repr(value[:log.FOLD_KEEP_CHARS]) + f"… (+{1000 - log.FOLD_KEEP_CHARS} characters)"
    else:
        shown = text[1:-1].split(", ")[:-1]
        assert text[1:-1].endswith(f"… +{300 - len(shown)} more") and shown[0] in ("0", "'0': 0")
