"""The writes the supervisor's loop never waits for (issue 24): files through `esiwrap.shell.writer`,
log lines through `esiwrap.shell.log`'s background sink. A write that blocks (a busy disk, a reader that
does not read) is simulated by a write that waits on an event the test sets."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from esiwrap.shell import log
from esiwrap.shell.files import write_atomic
from esiwrap.shell.writer import FileWriter


class Gate:
    """A write function that blocks until opened, and records what it wrote, in order."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.written: list[tuple[str, str]] = []

    def __call__(self, path: str, text: str) -> None:
        self.entered.set()
        assert self.open.wait(30)
        self.written.append((path, text))
        Path(path).write_text(text)


def test_a_blocked_write_never_blocks_the_caller_and_the_newest_text_wins(tmp_path: Path) -> None:
    """While the first write hangs, queuing returns at once; of three texts queued for one path
    behind it only the newest is written; flush is bounded, then completes once the disk frees."""
    gate, writer = Gate(), FileWriter()
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    writer.replace(first, "a1", gate)
    assert gate.entered.wait(30)
    for text in ("b1", "b2", "b3"):
        writer.replace(second, text, gate)  # returns while the disk is stuck
    assert writer.flush(0.05) is False
    gate.open.set()
    assert writer.flush(30) is True
    assert gate.written == [(first, "a1"), (second, "b3")]
    writer.close(1)


def test_a_failed_write_is_reported_to_its_callback(tmp_path: Path) -> None:
    results: list[tuple[str, str | None]] = []
    done = threading.Event()

    def record(path: str, error: OSError | None) -> None:
        results.append((path, None if error is None else type(error).__name__))
        done.set()

    writer = FileWriter()
    missing = str(tmp_path / "no-such-dir" / "status.json")
    writer.replace(missing, "{}", write_atomic, done=record)
    assert done.wait(30)
    assert results == [(missing, "FileNotFoundError")]
    good = str(tmp_path / "status.json")
    writer.replace(good, "{}", write_atomic)
    writer.remove(good)
    assert writer.close(30)
    assert not Path(good).exists()


class StuckStream(io.StringIO):
    """A console whose reader has stopped reading: write blocks until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        assert self.release.wait(30)
        return super().write(text)


def test_the_background_log_never_blocks_the_logger_and_keeps_the_order() -> None:
    stream = StuckStream()
    log.configure("run1", fmt="json", stream=stream, background=True)
    try:
        logger = log.get_logger()
        for n in range(50):
            logger.info("step_observed", step=n)  # the stream is stuck: these return at once
        log.passthrough("upload: 10% done")
        assert log.flush(0.05) is False
        stream.release.set()
        assert log.flush(30) is True
        lines = stream.getvalue().splitlines()
        assert [json.loads(line)["step"] for line in lines[:50]] == list(range(50))
        assert lines[50] == "upload: 10% done"
    finally:
        log.reset()
