"""Property tests (hypothesis, bounded to a few seconds each) for everything that reads text or
bytes from outside: the deadline parser, the trainer channel's decoder, the report's log reader
and the command-line splitter. The invariant everywhere: a documented value or a one-line error,
never an exception."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import string

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from esiwrap.cli import split_run_argv
from esiwrap.cli.options import RUN_OPTIONS, build_run_parser
from esiwrap.errors import UsageError
from esiwrap.optiontypes import resolve_options
from esiwrap.shell.channel import MAX_DATAGRAM
from esiwrap.sources.registry import SOURCE_OPTIONS
from esiwrap.times import (
    MAX_DURATION_S,
    TimeParseError,
    implausible,
    iso_epoch,
    iso_utc,
    parse_duration,
    parse_epoch,
    parse_iso,
    parse_when,
)
from esiwrap.tools.report import event_of, read_events, render_text, report, to_json
from esiwrap.trainer import wire

# FUZZ_EXAMPLES=4000 for a deeper run by hand; the default keeps each test to a few seconds.
BOUNDED = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "400")), deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])
NOW = st.floats(min_value=946_684_800.0, max_value=4_000_000_000.0)

# Text that looks like what people and clouds write for a time, and any text at all.
TIME_ALPHABET = string.digits + "+-.:TZtzeE smhdSMHD" + "\u0663\u00a0"
TIMEISH = st.one_of(
    st.text(alphabet=TIME_ALPHABET, max_size=40),
    st.text(max_size=60),
    st.builds(lambda x: repr(x), st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(str, st.integers()),
    st.builds(lambda n, unit: f"+{n}{unit}", st.integers(min_value=0), st.sampled_from(list(" smhd"))),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
)


# ---------------------------------------------------------------------- deadline parser
@BOUNDED
@given(text=TIMEISH, now=NOW)
@example(text="99999999999999999999", now=1.79e9)
@example(text="9999-12-31T23:59:59-12:00", now=1.79e9)
@example(text="0001-01-01T00:00:00+01:00", now=1.79e9)
@example(text="+" + "9" * 400 + "d", now=1.79e9)
def test_parse_when_returns_a_plausible_time_or_a_one_line_error(text: str, now: float) -> None:
    """Any text: a deadline within the plausible range, or a TimeParseError with one line."""
    try:
        at = parse_when(text, now)
    except TimeParseError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert implausible(at, now) is None
    assert not iso_utc(at).startswith("epoch")


@BOUNDED
@given(text=TIMEISH)
def test_the_other_parsers_return_a_number_or_a_parse_error(text: str) -> None:
    """parse_epoch, parse_iso, parse_duration: a finite float (a duration within 10 years) or a
    TimeParseError, for any text."""
    for parser in (parse_epoch, parse_iso, parse_duration):
        try:
            value = parser(text)
        except TimeParseError as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        assert isinstance(value, float) and math.isfinite(value)
    with contextlib.suppress(TimeParseError):
        assert 0 <= parse_duration(text) <= MAX_DURATION_S


@BOUNDED
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30)))
def test_iso_utc_never_raises(value: float) -> None:
    """Any number is written: ISO-8601 in years 1..9999, `epoch <value>` outside."""
    text = iso_utc(value)
    assert text.endswith("Z") or text.startswith("epoch ")


@BOUNDED
@given(value=st.floats(min_value=0.0, max_value=2.0**32))
def test_iso_utc_reads_back_to_the_millisecond(value: float) -> None:
    """What `iso_utc` writes (logs, reports), `iso_epoch` reads back: the same millisecond.
    (Until 2106: beyond 2**32 s a float's step exceeds half a microsecond, and a read-back
    x.812 may become x.811996.)"""
    text = iso_utc(value)
    assert iso_utc(iso_epoch(text)) == text
    assert abs(iso_epoch(text) - value) < 0.002


# ---------------------------------------------------------------------- channel decoder
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
MESSAGE_LIKE = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(sorted(wire.CLASSES)), JSON_VALUES),
     "pid": st.one_of(st.integers(), JSON_VALUES)},
    optional={"step": JSON_VALUES, "duration_s": JSON_VALUES, "ok": JSON_VALUES, "path": JSON_VALUES,
              "saves": JSON_VALUES, "signal": JSON_VALUES, "stop_signal": JSON_VALUES, "rank": JSON_VALUES},
)


def _datagrams() -> st.SearchStrategy[bytes]:
    as_json = MESSAGE_LIKE.map(lambda m: json.dumps(m, allow_nan=True).encode())
    return st.one_of(
        st.binary(max_size=512),
        as_json,
        as_json.flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),  # truncated
        st.integers(1, 40_000).map(lambda n: b"[" * n),  # nested past the recursion limit
        st.just(b'{"type": "step", "pid": 1, "step": ' + b"9" * 5000 + b"}"),  # int beyond str limit
        st.just(b'{"type": "hello", "pid": ' + str(2**64).encode() + b"}"),
        st.just(b" " * MAX_DATAGRAM),
    )


@BOUNDED
@given(data=_datagrams())
@example(data=b'{"type": [], "pid": 1}')  # an unhashable type crashed the supervisor's loop
@example(data=b"[" * 40_000)  # RecursionError
@example(data=b'{"type": "step", "pid": 7, "step": 1, "duration_s": NaN}')  # NaN would poison estimates
@example(data=b'{"type": "save_end", "pid": 7, "duration_s": 1e999}')
def test_decode_any_datagram(data: bytes) -> None:
    """Any bytes as a datagram: never an exception; a message of a known type from a possible pid
    whose fields have their class's types (finite numbers only), which encodes back to a datagram
    that decodes to the same message; or the reason it is not one."""
    decoded = wire.decode(data)
    if isinstance(decoded, wire.Malformed):
        assert decoded.reason
        return
    message = decoded.message
    assert type(message) in wire.CLASSES.values() and 0 < decoded.pid <= wire.MAX_PID
    for name, value in message._asdict().items():
        if isinstance(value, float):
            assert math.isfinite(value), (name, value)
        assert not (isinstance(value, bool) and name in ("step", "rank", "world_size", "nodes"))
    sent = wire.encode(message, decoded.pid, decoded.sent_mono)
    again = wire.decode(sent)  # (compared as bytes: an extra field may hold NaN, unequal to itself)
    assert isinstance(again, wire.Envelope) and wire.encode(again.message, again.pid, again.sent_mono) == sent


HOSTILE_DATAGRAMS = [
    b'{"type": [], "pid": 1}', b'{"type": {}, "pid": 1}', b"[" * 60_000, b"\xff\xfe", b"",
    b'{"type": "hello", "pid": 1}', b'{"type": "hello", "pid": 4194304, "signal": true}',
    b'{"type": "hello", "pid": ' + str(2**70).encode() + b"}",
    b'{"type": "step", "pid": 1, "step": 1e400, "duration_s": NaN}',
    b'{"type": "save_begin", "pid": 1, "step": "x"}', b'{"type": "save_end", "pid": 1, "ok": "yes"}',
    b'{"type": "bye", "pid": -1}', b'{"type": "hello", "pid": true}',
]


def test_the_supervisor_survives_hostile_datagrams(esiwrap) -> None:
    """Garbage on the trainer socket (malformed, nested 60k deep, a hello from a process that is
    not ours, NaN numbers): the supervisor goes on, the child is not stopped, and the foreign
    hello is refused (its sender is not the pid it claims); SIGTERM afterwards still ends the run
    the usual way. (Which exit code follows an unsolicited save_end is the supervisor's decision,
    not asserted here.)"""
    import socket

    run = esiwrap("--", "sh", "-c", 'echo "socket=$ESIWRAP_SOCKET"; exec sleep 300')
    out = run.wait_stdout("socket=", 30)
    path = out.split("socket=", 1)[1].split("\n", 1)[0]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for datagram in HOSTILE_DATAGRAMS:
            with contextlib.suppress(OSError):  # a datagram over the socket's size limit is refused
                sender.sendto(datagram, path)
    refused = run.wait_event("message_refused", 30, message="hello", claimed_pid=1)
    assert refused["reason"] == "its pid field names another process" and refused["pid"] == os.getpid()
    assert run.proc.poll() is None and "supervisor_failed" not in run.names()
    run.signal(15)
    run.finish(30)
    assert run.first("child_exited")["signal"] == "SIGTERM"  # stopped by esiwrap's stop sequence
    assert "supervisor_failed" not in run.names()


# ---------------------------------------------------------------------- report's log reader
EVENT_NAMES = ["child_started", "deadline_resolved", "deadline_changed", "save_scheduled",
               "save_requested", "save_started", "save_completed", "child_stopping", "child_exited",
               "supervisor_exit", "deadline_unavailable", "step_observed", "save_missed"]
TIMESTAMPS = st.one_of(st.datetimes().map(lambda d: d.isoformat(timespec="milliseconds") + "Z"),
                       st.text(max_size=30), st.just("2026-11-30T02:53:19.811Z"))
EVENTS = st.fixed_dictionaries(
    {"event": st.one_of(st.sampled_from(EVENT_NAMES), st.text(max_size=12)),
     "timestamp": TIMESTAMPS, "run_id": st.sampled_from(["a", "b"])},
    optional={"level": JSON_VALUES, "code": JSON_VALUES, "deadline": TIMESTAMPS, "new": TIMESTAMPS,
              "old": TIMESTAMPS, "signal_at": TIMESTAMPS, "planned_at": TIMESTAMPS,
              "step": JSON_VALUES, "duration_s": JSON_VALUES, "remaining_s": JSON_VALUES,
              "kind": JSON_VALUES, "reason": JSON_VALUES, "argv": JSON_VALUES, "source": JSON_VALUES,
              "step_estimate_s": JSON_VALUES, "save_estimate_s": JSON_VALUES, "signal": JSON_VALUES},
)


def _log_lines() -> st.SearchStrategy[str]:
    event_lines = EVENTS.map(lambda e: json.dumps(e, allow_nan=True))
    return st.one_of(
        st.text(max_size=200),
        event_lines,
        event_lines.map(lambda line: "Nov 30 host esiwrap[1]: <6>" + line),  # a journal prefix
        event_lines.map(lambda line: json.dumps({"MESSAGE": line})),  # journalctl -o json
        event_lines.flatmap(lambda line: st.integers(0, len(line)).map(lambda n: line[:n])),  # cut off
        st.integers(1, 20_000).map(lambda n: "{" + '"a":[' * n),
    )


@BOUNDED
@given(line=_log_lines())
def test_event_of_any_line(line: str) -> None:
    """Any line: None, or an event with string event/timestamp/run_id."""
    event = event_of(line)
    if event is not None:
        assert all(isinstance(event[key], str) for key in ("event", "timestamp", "run_id"))


@settings(BOUNDED, max_examples=max(1, BOUNDED.max_examples // 3))  # a dozen lines per example
@given(lines=st.lists(_log_lines(), max_size=12))
def test_report_of_any_log(lines: list[str]) -> None:
    """Any log: every line is an event or counted as skipped, and the report renders as text
    and as JSON without an exception."""
    found = read_events(lines)
    assert len(found.events) + found.skipped <= len(lines)
    runs, skipped = report(lines)
    assert skipped == found.skipped
    assert isinstance(render_text(runs, skipped), str)
    json.loads(to_json(runs, skipped))


# ---------------------------------------------------------------------- command line
OPTION_WORDS = [opt.flag for opt in SOURCE_OPTIONS + RUN_OPTIONS] + [
    "--", "-", "--no-final-save", "--dead", "--help", "--version", "--log-level", "-x", "--bogus"]
ARG_WORDS = st.one_of(st.sampled_from(OPTION_WORDS), st.text(max_size=12), TIMEISH,
                      st.sampled_from(["python", "train.py", "+2h", "90", "SIGUSR2", "max", "=", "--x=1"]))


@BOUNDED
@given(argv=st.lists(ARG_WORDS, max_size=10))
def test_split_any_argv(argv: list[str]) -> None:
    """Options then the command, all words kept in order: the command is the untouched tail."""
    options, command = split_run_argv(argv)
    rest = argv[len(options):]
    assert argv[:len(options)] == options
    assert rest == command or rest == ["--", *command]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=st.lists(ARG_WORDS, max_size=8))
def test_options_of_any_argv_parse_or_exit_with_one_line(argv: list[str]) -> None:
    """What precedes the command parses into values, or ends in one line on stderr with exit 2
    (0 for --help/--version), never a traceback."""
    options, _ = split_run_argv(argv)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            ns = build_run_parser().parse_args(options)
            resolve_options(ns, SOURCE_OPTIONS + RUN_OPTIONS, {})
        except SystemExit as exit_:
            assert exit_.code in (0, 2), err.getvalue()
            if exit_.code == 2:
                assert err.getvalue().startswith("esiwrap: ") and err.getvalue().count("\n") == 1
        except UsageError as exc:  # main() prints it as one line and exits 2
            assert str(exc) and "\n" not in str(exc)
