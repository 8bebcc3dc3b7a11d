"""structlog set-up: JSON lines (one object per line) unless stderr is a terminal.

Every line has `timestamp` (UTC ISO-8601, milliseconds), `level`, `event` and `run_id`.
`--log-file` adds a JSON-lines copy in a file, whatever the console format.

Under systemd, when `$JOURNAL_STREAM` names stderr's own device and inode, stderr is the journal:
lines stay JSON whatever `--log-format` says (one object per line, exceptions as a field, no
colours), each behind a `<N>` syslog priority prefix that journald strips and turns into the
entry's PRIORITY (`journalctl -p warning` works; `journalctl -o cat` prints the bare JSON).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import IO, Any, Literal

import structlog
from structlog.typing import EventDict, WrappedLogger

LogFormat = Literal["json", "console"]
LEVELS = ("debug", "info", "warning", "error")
SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2, "exception": 3}


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _timestamp(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    event_dict["timestamp"] = now.replace("+00:00", "Z")
    return event_dict


class _Tee:
    """The logger at the end of the chain: renders each event for the console and the file.

    The last processor hands over the event dict itself, so one event can be written as JSON to
    the file and as JSON or readable text to the console.
    """

    def __init__(self, console: IO[str], file: IO[str] | None, fmt: LogFormat, journal: bool = False) -> None:
        self.console = console
        self.file = file
        self.journal = journal
        self._text = structlog.dev.ConsoleRenderer(colors=False) if fmt == "console" else None

    def msg(self, **event_dict: Any) -> None:
        event_dict = _ordered(event_dict)
        line = json.dumps(event_dict, default=str, separators=(",", ":"))
        text = line if self._text is None else str(self._text(None, "info", dict(event_dict)))
        if self.journal:
            text = f"<{SYSLOG_PRIORITY.get(str(event_dict.get('level')), 6)}>{line}"
        _write(self.console, text)
        if self.file is not None:
            _write(self.file, line)

    info = debug = warning = error = critical = exception = msg


_FIRST_KEYS = ("timestamp", "level", "event", "run_id")


def _ordered(event_dict: dict[str, Any]) -> dict[str, Any]:
    """The keys a person scans for first, then the event's own fields."""
    head = {key: event_dict.pop(key) for key in _FIRST_KEYS if key in event_dict}
    return {**head, **event_dict}


def _write(stream: IO[str], text: str) -> None:
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed pipe or full disk must not take the supervisor down


def _hand_over(_: WrappedLogger, __: str, event_dict: EventDict) -> Any:
    return event_dict


def is_journal(stream: IO[str], environ: Mapping[str, str]) -> bool:
    """True when `stream` is the journal socket systemd announced as `$JOURNAL_STREAM` (dev:inode)."""
    device, sep, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (sep and device.isdigit() and inode.isdigit()):
        return False
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # closed, or not a real file (tests, io.StringIO)
        return False
    return stat.st_dev == int(device) and stat.st_ino == int(inode)


def configure(
    run_id: str,
    level: str = "info",
    fmt: LogFormat | None = None,
    log_file: str | None = None,
    stream: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    console_stream = stream if stream is not None else sys.stderr
    journal = is_journal(console_stream, os.environ if environ is None else environ)
    if journal:
        fmt = "json"
    elif fmt is None:
        fmt = "console" if console_stream.isatty() else "json"
    file = open(log_file, "a", encoding="utf-8", buffering=1) if log_file else None  # noqa: SIM115
    tee = _Tee(console_stream, file, fmt, journal)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _timestamp,
            structlog.processors.format_exc_info,
            _hand_over,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper(), logging.INFO)
        ),
        logger_factory=lambda *_: tee,
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(run_id=run_id)


def get_logger() -> Any:
    return structlog.get_logger("esiwrap")
