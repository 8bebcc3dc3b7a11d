"""esiwrap's log: JSON lines (one object per line) unless stderr is a terminal.

Every line has `timestamp` (UTC ISO-8601, milliseconds), `level`, `event` and `run_id`.
`--log-file` adds a JSON-lines copy in a file, whatever the console format.

The supervisor's log is written by a thread of its own (`configure(background=True)`): a journal
whose daemon is busy, a pipe whose reader is slow or a log file on a disk that a checkpoint keeps
busy can each block a write for seconds, and the loop must not wait for them. Lines keep their
order and their timestamps (taken when the event happened); `flush()` waits, bounded, for the
ones queued (the `esiwrap` executable calls it before it exits). Beyond MAX_QUEUED lines waiting,
new ones are counted and dropped, and a line says how many once the writes flow again.

Under systemd, when `$JOURNAL_STREAM` names stderr's own device and inode, stderr is the journal:
lines stay JSON whatever `--log-format` says (one object per line, exceptions as a field, no
colours), each behind a `<N>` syslog priority prefix that journald strips and turns into the
entry's PRIORITY (`journalctl -p warning` works; `journalctl -o cat` prints the bare JSON).

The logger is our own few lines rather than structlog's pipeline: `import structlog` alone
imports its development renderer (and `rich` when installed) and asyncio, about three times
what the rest of a supervised run's start-up costs. structlog's `ConsoleRenderer` still draws the
readable console format, imported only when that format is used. `capture_logs()` is the test
helper, shaped like `structlog.testing.capture_logs`.

The console format fits a terminal: a value longer than FOLD_CHARS (the run's settings, a long
command line) is cut to its first entries and how many more there are (`… +17 more`), and each
entry is wrapped at the terminal's width (its columns; else `$COLUMNS`; not wrapped when neither
is known), continued on lines indented by four spaces; the run's id is on its first entry only.
The JSON lines (`--log-file`, the journal, `--log-format json`) always hold every value whole, and
the run's id on every line.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

from esiwrap.choices import LogFormat, LogLevel
from esiwrap.times import iso_utc

SEVERITY = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
_FIRST_KEYS = ("timestamp", "level", "event", "run_id")
MAX_QUEUED = 100_000  # lines waiting for a blocked console or log file (a few tens of MB at most)
EXIT_FLUSH_S = 5.0  # how long leaving waits for the lines still queued
FOLD_CHARS = 400  # a console value longer than this is cut (about five lines of 80 columns)
FOLD_KEEP_CHARS = 120  # ...to what fits in this much, and how much more there is
CONTINUATION = "    "  # how the console's wrapped lines of an entry begin
EVENT_COLUMN = 22  # the console pads event names to this width (structlog's default is 30)

Entry = dict[str, Any]


def new_run_id() -> str:
    return os.urandom(6).hex()  # 12 hex digits, as uuid4().hex[:12] was, without importing uuid


def _exception_text(exc_info: Any) -> str:
    """The traceback of `exc_info` (True: the exception being handled), as logging prints it."""
    import traceback

    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    elif not isinstance(exc_info, tuple):
        exc_info = sys.exc_info()
    if exc_info[0] is None:
        return "NoneType: None"
    return "".join(traceback.format_exception(*exc_info)).rstrip("\n")


class _Lines:
    """The console's and the log file's lines, written in order by a thread of their own."""

    def __init__(self, console: IO[str], file: IO[str] | None) -> None:
        self.console = console
        self.file = file
        self._cond = threading.Condition()
        self._queue: deque[tuple[str | None, str | None]] = deque()  # (console text, file line)
        self._busy = False
        self._dropped = 0
        threading.Thread(target=self._run, name="esiwrap-log", daemon=True).start()

    def put(self, console_text: str | None, file_line: str | None) -> None:
        with self._cond:
            if len(self._queue) >= MAX_QUEUED:
                self._dropped += 1
                return
            self._queue.append((console_text, file_line))
            self._cond.notify()

    def flush(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                batch, self._queue = self._queue, deque()
                dropped, self._dropped = self._dropped, 0
                self._busy = True
            for console_text, file_line in batch:
                if console_text is not None:
                    _write(self.console, console_text)
                if file_line is not None and self.file is not None:
                    _write(self.file, file_line)
            if dropped:
                _write(self.console, f"esiwrap: {dropped} log lines dropped: the log was not read")
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class _Folded:
    """A value as the console shows it when it is too long: its repr is the shortened text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def fold(value: Any) -> Any:
    """`value`, or for the console a shorter stand-in when its text is longer than FOLD_CHARS:
    the first entries of a dict or list and how many more, the start of a text and how much
    more."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= FOLD_CHARS:
        return value
    if isinstance(value, dict):
        items = [f"{key!r}: {item!r}" for key, item in value.items()]
        return _Folded("{" + _first_of(items) + "}")
    if isinstance(value, (list, tuple)):
        return _Folded("[" + _first_of([repr(item) for item in value]) + "]")
    return _Folded(repr(text[:FOLD_KEEP_CHARS]) + f"… (+{len(text) - FOLD_KEEP_CHARS} characters)")


def _first_of(items: list[str]) -> str:
    shown: list[str] = []
    size = 0
    for item in items:
        if shown and size + len(item) > FOLD_KEEP_CHARS:
            break
        shown.append(item)
        size += len(item) + 2
    return ", ".join([*shown, f"… +{len(items) - len(shown)} more"])


def wrap(text: str, width: int | None) -> str:
    """An entry's first line (a traceback below it stays as it is) in lines of at most `width`
    columns, the later ones indented (`CONTINUATION`); as it is when `width` is None."""
    first, newline, rest = text.partition("\n")
    if width is None or len(first) <= width:
        return text
    import textwrap

    lines = textwrap.wrap(first, width, subsequent_indent=CONTINUATION, break_on_hyphens=False)
    return "\n".join(lines) + newline + rest


def console_width(stream: IO[str], environ: Mapping[str, str]) -> int | None:
    """The columns of the terminal `stream` is, else `$COLUMNS`, else None (not wrapped)."""
    try:
        if stream.isatty():
            return max(40, os.get_terminal_size(stream.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        pass
    columns = environ.get("COLUMNS", "").strip()
    return max(40, int(columns)) if columns.isdigit() else None


class _Sink:
    """Where events go: the console (JSON, readable text, or the journal) and an optional file;
    with `background`, written by a thread of their own (`_Lines`)."""

    def __init__(self, run_id: str | None, level: str, console: IO[str], file: IO[str] | None,
                 fmt: LogFormat, journal: bool, background: bool = False, width: int | None = None) -> None:
        self.run_id = run_id
        self.threshold = SEVERITY.get(level, SEVERITY["info"])
        self.console = console
        self.file = file
        self.journal = journal
        self.lines = _Lines(console, file) if background else None
        self.width = width  # the console format's: wrapped to it (None: not wrapped)
        self._run_id_shown = False  # the console format names the run on its first entry only
        self._text: Callable[..., Any] | None = None
        if fmt == "console" and not journal:
            from structlog.dev import ConsoleRenderer  # pulls rich when installed: only here

            self._text = ConsoleRenderer(colors=False, pad_event_to=EVENT_COLUMN)

    def emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        if SEVERITY[level] < self.threshold:
            return
        exc_info = fields.pop("exc_info", None)
        entry: Entry = {"timestamp": iso_utc(time.time()), "level": level, "event": event}
        if self.run_id is not None:
            entry["run_id"] = self.run_id
        entry.update((k, v) for k, v in fields.items() if k not in _FIRST_KEYS)
        if exc_info:
            entry["exception"] = _exception_text(exc_info)
        line = json.dumps(entry, default=str, separators=(",", ":"))
        if self.journal:
            text = f"<{SYSLOG_PRIORITY[level]}>{line}"
        elif self._text is not None:
            shown = {key: value if key in _FIRST_KEYS else fold(value) for key, value in entry.items()}
            if self._run_id_shown:
                shown.pop("run_id", None)
            self._run_id_shown = self._run_id_shown or "run_id" in shown
            text = wrap(str(self._text(None, level, shown)), self.width)
        else:
            text = line
        if self.lines is not None:
            self.lines.put(text, line)
            return
        _write(self.console, text)
        if self.file is not None:
            _write(self.file, line)

    def passthrough(self, text: str) -> None:
        """A line of another program's output (the upload command's stderr) to the console."""
        if self.lines is not None:
            self.lines.put(text, None)
        else:
            _write(self.console, text)


class _Capture:
    """The test sink: every event, any level, as `{"event", "log_level", **fields}`."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.lines = None

    def emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self.entries.append({"event": event, **fields, "log_level": level})

    def passthrough(self, text: str) -> None:
        pass


_sink: _Sink | _Capture | None = None  # None: not configured yet (JSON lines on stderr, info)


def _current() -> _Sink | _Capture:
    global _sink
    if _sink is None:
        _sink = _Sink(None, "info", sys.stderr, None, "json", journal=False)
    return _sink


class Logger:
    """`log.info("event_name", field=value, ...)`; `exc_info=True` adds the traceback."""

    def debug(self, event: str, **fields: Any) -> None:
        _current().emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        _current().emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        _current().emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        _current().emit("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        _current().emit("critical", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        fields.setdefault("exc_info", True)
        _current().emit("error", event, fields)


_LOGGER = Logger()


def get_logger() -> Logger:
    """The logger; what it writes to is decided by `configure()` at the time of each call."""
    return _LOGGER


def passthrough(text: str) -> None:
    """Pass a line of another program's output on to the console, in order with the log."""
    _current().passthrough(text)


def flush(timeout_s: float = EXIT_FLUSH_S) -> bool:
    """Wait (at most `timeout_s`) until the lines queued by a background sink are written."""
    lines = _current().lines
    return True if lines is None else lines.flush(timeout_s)


def _write(stream: IO[str], text: str) -> None:
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed pipe or full disk must not take the supervisor down


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
    level: LogLevel = "info",
    fmt: LogFormat | None = None,
    log_file: str | None = None,
    stream: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
    background: bool = False,
) -> None:
    """Where the log goes from now on; `background`: written by a thread of its own (the
    supervisor: see the module docstring)."""
    global _sink
    console_stream = stream if stream is not None else sys.stderr
    journal = is_journal(console_stream, os.environ if environ is None else environ)
    if journal:
        fmt = "json"
    elif fmt is None:
        fmt = "console" if console_stream.isatty() else "json"
    file = open(log_file, "a", encoding="utf-8", buffering=1) if log_file else None  # noqa: SIM115
    width = console_width(console_stream, os.environ if environ is None else environ)
    _sink = _Sink(run_id, level, console_stream, file, fmt, journal, background, width)
    if background:
        atexit.register(flush)  # `python -m esiwrap`; the executable flushes before os._exit


def reset() -> None:
    """Back to the unconfigured default (tests)."""
    global _sink
    _sink = None


@contextmanager
def capture_logs() -> Iterator[list[Entry]]:
    """Every event logged inside the block, nothing written anywhere (for tests)."""
    global _sink
    saved, capture = _sink, _Capture()
    _sink = capture
    try:
        yield capture.entries
    finally:
        _sink = saved
