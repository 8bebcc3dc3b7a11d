"""structlog set-up: JSON lines (one object per line) unless stderr is a terminal.

Every line has `timestamp` (UTC ISO-8601, milliseconds), `level`, `event` and `run_id`.
`--log-file` adds a JSON-lines copy in a file, whatever the console format.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from datetime import datetime, timezone
from typing import IO, Any, Literal

import structlog
from structlog.typing import EventDict, WrappedLogger

LogFormat = Literal["json", "console"]
LEVELS = ("debug", "info", "warning", "error")


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

    def __init__(self, console: IO[str], file: IO[str] | None, fmt: LogFormat) -> None:
        self.console = console
        self.file = file
        self._text = structlog.dev.ConsoleRenderer(colors=False) if fmt == "console" else None

    def msg(self, **event_dict: Any) -> None:
        event_dict = _ordered(event_dict)
        line = json.dumps(event_dict, default=str, separators=(",", ":"))
        text = line if self._text is None else str(self._text(None, "info", dict(event_dict)))
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


def configure(
    run_id: str,
    level: str = "info",
    fmt: LogFormat | None = None,
    log_file: str | None = None,
    stream: IO[str] | None = None,
) -> None:
    console_stream = stream if stream is not None else sys.stderr
    if fmt is None:
        fmt = "console" if console_stream.isatty() else "json"
    file = open(log_file, "a", encoding="utf-8", buffering=1) if log_file else None  # noqa: SIM115
    tee = _Tee(console_stream, file, fmt)
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
