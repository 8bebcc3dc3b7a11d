"""Logging to the journal: `$JOURNAL_STREAM` naming stderr keeps every line one JSON object."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from esiwrap.shell import log


@pytest.fixture(autouse=True)
def _restore_log() -> Iterator[None]:
    yield
    log.reset()


def journal_env(stream: object) -> dict[str, str]:
    stat = os.fstat(stream.fileno())  # type: ignore[attr-defined]
    return {"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}


def test_journal_lines_are_prefixed_json_with_exceptions_as_a_field(tmp_path: Path) -> None:
    """On the journal, --log-format console is ignored: `<priority>` + one JSON object per line,
    a multi-line exception included (as the `exception` field)."""
    path = tmp_path / "stderr"
    with open(path, "w", encoding="utf-8") as stream:
        log.configure("run1", fmt="console", stream=stream, environ=journal_env(stream))
        logger = log.get_logger()
        logger.info("child_started", pid=1)
        logger.warning("save_missed", remaining_s=-1.0)
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logger.exception("supervisor_failed")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [line[:3] for line in lines] == ["<6>", "<4>", "<3>"]
    events = [json.loads(line[3:]) for line in lines]
    assert [e["event"] for e in events] == ["child_started", "save_missed", "supervisor_failed"]
    assert all(e["run_id"] == "run1" for e in events)
    assert "ValueError: boom\nsecond line" in events[2]["exception"]


def test_a_stream_that_is_not_the_journal_keeps_its_format(tmp_path: Path) -> None:
    """JOURNAL_STREAM naming another file (inherited from a parent) or garbage: not the journal."""
    other = tmp_path / "other"
    other.write_text("")
    path = tmp_path / "stderr"
    with open(path, "w", encoding="utf-8") as stream, open(other, encoding="utf-8") as elsewhere:
        assert not log.is_journal(stream, journal_env(elsewhere))
        assert not log.is_journal(stream, {"JOURNAL_STREAM": "garbage"})
        assert log.is_journal(stream, journal_env(stream))
        log.configure("run2", fmt="console", stream=stream, environ=journal_env(elsewhere))
        log.get_logger().info("child_started", pid=1)
    text = path.read_text(encoding="utf-8")
    assert not text.startswith(("<", "{")) and "child_started" in text
