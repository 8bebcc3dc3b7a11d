"""The trainer channel's wire format: one typed class per message, encoded and decoded here only.

The trainer's side (`esiwrap.trainer`, its framework callbacks, the verl hook, the Ray relay)
builds one of the message classes below and `encode`s it; esiwrap's side `decode`s each datagram
into an `Envelope` holding one, or into `Malformed` with the reason it is not one. This module is
loaded in every trainer process, Ray workers too: it imports json, math and typing, nothing heavier.

A datagram is one JSON object in UTF-8:

    {"type": "<name>", "pid": <the sender's pid>, <the message's fields>, "sent_mono": <seconds>}

`type` is one of `CLASSES`' names; `pid` is the process the message speaks for (esiwrap believes
it only when the kernel says the datagram came from that process: see "Who may speak on the
channel" in docs/trainer.md); `sent_mono`, optional, is the sender's `time.monotonic()`, from
which esiwrap learns how late reports reach it. The fields of each message are the fields of its
class, under the same names, each with its type written as the class annotates it:

    int, bool, str     a JSON integer within 64 bits (not a boolean), a boolean, a string
    float              a finite number (JSON's NaN and Infinity are not one)
    Seconds            a finite number >= 0 (a duration)
    Bytes              a finite number > 0 (a size)
    Fields             a JSON object
    X | None           X, or absent

A field that is absent, or `null`, takes its class's default; a field without a default is
required. A field that is there with another type makes the whole datagram `Malformed`: nothing
of it is believed. Fields a class does not name are ignored, so a newer trainer's extra field
does not break an older esiwrap, except in the classes with an `extra` field (`Hello`, `Start`),
which keep them (they are logged). `encode` writes a field whose default is None or False only
when it differs from it, and checks every field the way `decode` does (what is sent decodes).
These are the names and types trainers have always sent: an older trainer library works with a
newer esiwrap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = [
    "CLASSES",
    "MAX_PID",
    "Bye",
    "Checkpoint",
    "Deadline",
    "Envelope",
    "Hello",
    "Malformed",
    "Message",
    "SaveBegin",
    "SaveEnd",
    "SaveSnapshot",
    "Start",
    "Step",
    "decode",
    "encode",
    "fields_of",
    "type_of",
]

HELLO = "hello"
STEP = "step"
SAVE_BEGIN = "save_begin"
SAVE_SNAPSHOT = "save_snapshot"
SAVE_END = "save_end"
BYE = "bye"
DEADLINE = "deadline"
CHECKPOINT = "checkpoint"
START = "start"

MAX_PID = 2**22  # the kernel's PID_MAX_LIMIT: larger is no process
# Never an extra field: the envelope's own, and the log line's (they would overwrite its keys).
RESERVED = frozenset({"type", "pid", "sent_mono", "event", "level", "timestamp", "run_id"})

Seconds = float  # a duration: finite, >= 0
Bytes = float  # a size: finite, > 0
Fields = Mapping[str, Any]  # a JSON object
NO_FIELDS: Fields = MappingProxyType({})


class Hello(NamedTuple):
    """A process attaches to esiwrap (`esiwrap.trainer.install()`, a framework callback, the verl
    hook, the Ray driver); a later hello of the same process adds to an earlier one."""

    rank: int = 0
    world_size: int = 1
    saves: bool = True  # false: it writes no part of a checkpoint; esiwrap does not wait for it
    signal: bool = True  # false: do not signal it (a Ray driver that cannot take the signal)
    integration: str | None = None  # plain, lightning, transformers, verl
    stop_signal: str | None = None  # stop it with this signal instead of --stop-signal
    sigterm: str | None = None  # "save": it takes SIGTERM as a save request (inside a Slurm job)
    checkpoint_bytes: Bytes | None = None  # what it writes of a checkpoint
    checkpoint_dir: str | None = None  # where its checkpoints go
    resumed_from: str | None = None  # the checkpoint this run started from
    nodes: int | None = None  # the nodes its job spans (torchrun: world size / local world size)
    relay: bool = False  # it also forwards other processes' messages (the Ray driver, `ray_relay`)
    cannot_save: str | None = None  # with saves=False: why it cannot save on request, and what to do
    extra: Fields = NO_FIELDS  # any other field, kept as sent (logged with `trainer_attached`)


class Step(NamedTuple):
    """A step boundary, and the wall time since the previous one."""

    step: int
    duration_s: Seconds = 0.0


class Checkpoint(NamedTuple):
    """What this process writes of a checkpoint, once known or when it changed."""

    bytes: Bytes


class SaveBegin(NamedTuple):
    """A checkpoint save begins at a step boundary."""

    step: int
    peer: bool = False  # another node's esiwrap asked for this save (multi-node torchrun)


class SaveSnapshot(NamedTuple):
    """An asynchronous save's blocking part is done: training resumes, the write goes on."""

    step: int
    duration_s: Seconds = 0.0
    peer: bool = False


class SaveEnd(NamedTuple):
    """The save begun at `step` is complete on disk (`ok`), or failed (`error`)."""

    step: int
    ok: bool = True
    path: str | None = None
    duration_s: Seconds = 0.0
    error: str | None = None
    peer: bool = False


class Start(NamedTuple):
    """Where training starts: the step the trainer's state is at (the checkpoint it loaded, 0 from
    scratch), sent by the verl hook once verl has loaded."""

    step: int
    extra: Fields = NO_FIELDS  # resume_mode, default_local_dir, resume_from_path, integration


class Deadline(NamedTuple):
    """Another node's deadline answer, relayed by a Ray driver (`esiwrap.integrations.ray_nodes`):
    the fields of `esiwrap.sources.remote.to_fields`, held to plausibility where it arrives."""

    source: str  # node:<short id>/<source>
    reason: str = ""
    expected: bool = False
    withdrawn: bool = False
    capacity: str | None = None
    early_warning: str = ""
    notice_s: float | None = None
    at: float | None = None  # epoch seconds
    raw: str = ""
    lead_s: float = 0.0
    detail: Fields = NO_FIELDS


class Bye(NamedTuple):
    """The trainer leaves (its process may live on): no longer signal it or wait for it."""


Message = Hello | Step | Checkpoint | SaveBegin | SaveSnapshot | SaveEnd | Start | Deadline | Bye

CLASSES: Mapping[str, type[Message]] = MappingProxyType({
    HELLO: Hello, STEP: Step, CHECKPOINT: Checkpoint, SAVE_BEGIN: SaveBegin, SAVE_SNAPSHOT: SaveSnapshot,
    SAVE_END: SaveEnd, START: Start, DEADLINE: Deadline, BYE: Bye,
})
"""Each message's wire name and class: the one table both sides read."""
ALL = frozenset(CLASSES)
_NAMES: Mapping[type[Message], str] = {cls: name for name, cls in CLASSES.items()}


def type_of(message: Message) -> str:
    """The wire name of a message (`hello`, `save_end`, ...)."""
    return _NAMES[type(message)]


class Envelope(NamedTuple):
    """A decoded datagram: the message, the pid it speaks for, and when it was sent."""

    message: Message
    pid: int
    sent_mono: float | None = None  # the sender's time.monotonic(), when it said


class Malformed(NamedTuple):
    """A datagram that is not a message, and why; what it claims, where it could be read."""

    reason: str
    type: str = ""  # the known type it names
    pid: int | None = None  # the pid it claims, when that could be a process


# ---------------------------------------------------------------------------------- field types
class _Invalid(ValueError):
    pass


def _int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    raise _Invalid("a 64-bit integer")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _Invalid("true or false")


def _str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Invalid("a string")


def _number(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            number = math.inf
        if math.isfinite(number):
            return number
    raise _Invalid("a finite number")


def _seconds(value: Any) -> float:
    number = _number(value)
    if number >= 0:
        return number
    raise _Invalid("a duration >= 0")


def _bytes(value: Any) -> float:
    number = _number(value)
    if number > 0:
        return number
    raise _Invalid("a size > 0")


def _fields(value: Any) -> Fields:
    if isinstance(value, Mapping):
        return dict(value)
    raise _Invalid("a JSON object")


_CHECKS: Mapping[str, Callable[[Any], Any]] = {
    "int": _int, "bool": _bool, "str": _str, "float": _number, "Seconds": _seconds, "Bytes": _bytes,
    "Fields": _fields,
}
_REQUIRED = object()


class _Field(NamedTuple):
    name: str
    check: Callable[[Any], Any]
    default: Any  # _REQUIRED: none


def _schema(cls: type[Message]) -> tuple[_Field, ...]:
    """A class's fields, each with its check (from its annotation) and default."""
    fields = []
    for name in cls._fields:
        if name == "extra":
            continue
        written = cls.__annotations__[name]  # a ForwardRef: NamedTuple wraps the string annotation
        annotation = str(getattr(written, "__forward_arg__", written)).removesuffix(" | None")
        fields.append(_Field(name, _CHECKS[annotation], cls._field_defaults.get(name, _REQUIRED)))
    return tuple(fields)


_SCHEMAS: Mapping[type[Message], tuple[_Field, ...]] = {cls: _schema(cls) for cls in CLASSES.values()}


# ---------------------------------------------------------------------------------- the codec
def encode(message: Message, pid: int, sent_mono: float | None = None) -> bytes:
    """The datagram for `message` sent by `pid`. Raises ValueError for a field of the wrong type
    (what `decode` would refuse) or an extra field that is not JSON; the sender decides what to do
    (`ChannelClient.send` drops the message and returns False)."""
    payload: dict[str, Any] = {"type": type_of(message), "pid": pid, **fields_of(message)}
    if sent_mono is not None:
        payload["sent_mono"] = sent_mono
    try:
        return json.dumps(payload).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # an extra field that is not JSON
        msg = f"{type_of(message)}: not JSON: {exc}"
        raise ValueError(msg) from None


def fields_of(message: Message) -> dict[str, Any]:
    """A message's fields as the datagram carries them (extra ones first), without the envelope.
    Raises ValueError for a field of the wrong type."""
    fields: dict[str, Any] = {}
    extra = getattr(message, "extra", NO_FIELDS)
    fields.update((key, value) for key, value in extra.items() if key not in RESERVED)
    for field in _SCHEMAS[type(message)]:
        value = getattr(message, field.name)
        if value is None or (value is False and field.default is False):
            if field.default is _REQUIRED:
                msg = f"{type_of(message)}: {field.name} is required"
                raise ValueError(msg)
            continue
        try:
            fields[field.name] = field.check(value)
        except _Invalid as exc:
            msg = f"{type_of(message)}: {field.name} must be {exc}, not {_short(value)}"
            raise ValueError(msg) from None
    return fields


def decode(data: bytes) -> Envelope | Malformed:
    """The message in a datagram, or why it is not one. Never raises, whatever the bytes."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return Malformed("not UTF-8")
    except (ValueError, RecursionError):  # RecursionError: `[[[[...` 64 KiB deep
        return Malformed("not JSON")
    if not isinstance(obj, dict):
        return Malformed("not a JSON object")
    name = obj.get("type")
    cls = CLASSES.get(name) if isinstance(name, str) else None  # (a list as "type" is not hashable)
    if cls is None:
        return Malformed("no known type" if name is None else f"unknown type {_short(name)}")
    name = str(name)
    pid = obj.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= MAX_PID:
        return Malformed(f"pid {_short(pid)} cannot be a process", name)
    try:
        sent = obj.get("sent_mono")
        sent_mono = None if sent is None else _number(sent)
    except _Invalid as exc:
        return Malformed(f"sent_mono must be {exc}", name, pid)
    values: dict[str, Any] = {}
    for field in _SCHEMAS[cls]:
        value = obj.get(field.name)
        if value is None:
            if field.default is _REQUIRED:
                return Malformed(f"{field.name} is missing", name, pid)
            continue
        try:
            values[field.name] = field.check(value)
        except _Invalid as exc:
            return Malformed(f"{field.name} must be {exc}, not {_short(value)}", name, pid)
    if "extra" in cls._fields:
        known = {field.name for field in _SCHEMAS[cls]} | RESERVED
        values["extra"] = {key: value for key, value in obj.items() if key not in known}
    return Envelope(cls(**values), pid, sent_mono)


def _short(value: Any, limit: int = 40) -> str:
    """A value as a reason quotes it: its repr, cut short (a datagram may be 64 KiB of it)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested deep; an integer of thousands of digits
        text = f"a {type(value).__name__} too large to show"
    return text if len(text) <= limit else text[:limit] + "…"
