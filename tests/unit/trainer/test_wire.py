"""The trainer channel's wire format (`esiwrap.trainer.wire`): every message round-trips, a field of
the wrong type makes the datagram `Malformed` with a reason, what older trainers sent still
decodes, and no bytes make `decode` raise."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esiwrap.trainer import wire

EXAMPLES: list[wire.Message] = [
    wire.Hello(),
    wire.Hello(rank=3, world_size=8, saves=False, signal=False, integration="lightning", stop_signal="SIGINT",
               sigterm="save", checkpoint_bytes=1.4e11, checkpoint_dir="/ckpt", resumed_from="/ckpt/7",
               nodes=2, relay=True,
               extra={"role": "ray-driver", "relayed_from": {"pid": 7, "node": "10.0.0.2"}}),
    wire.Step(step=7, duration_s=1.25),
    wire.Checkpoint(bytes=4096.0),
    wire.SaveBegin(step=7, peer=True),
    wire.SaveSnapshot(step=7, duration_s=0.4),
    wire.SaveEnd(step=7, ok=False, path="/ckpt/7", duration_s=4.5, error="OSError('disk full')", peer=True),
    wire.Start(step=0, extra={"resume_mode": "auto", "default_local_dir": "/ckpt", "resume_from_path": None}),
    wire.Deadline(source="node:1a2b3c4d/env:MLP", at=1_764_470_111.0, raw="2025-11-30", lead_s=0.0,
                  detail={"node_id": "1a2b", "address": "10.0.0.2"}, capacity="spot", notice_s=120.0),
    wire.Deadline(source="node:1a2b3c4d/volcengine", reason="gone", withdrawn=True),
    wire.Bye(),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: wire.Message) -> None:
    """What a trainer encodes, esiwrap decodes to the same message, pid and send time."""
    assert wire.decode(wire.encode(message, 4242, 12.5)) == wire.Envelope(message, 4242, 12.5)
    assert wire.decode(wire.encode(message, 1)) == wire.Envelope(message, 1, None)


def test_every_class_is_in_the_table_under_its_name() -> None:
    """One table names each message; each class's fields have a type the codec checks."""
    assert set(wire.CLASSES) == wire.ALL == {
        "hello", "step", "checkpoint", "save_begin", "save_snapshot", "save_end", "start", "deadline", "bye"}
    assert {type(m) for m in EXAMPLES} == set(wire.CLASSES.values())
    for message in EXAMPLES:
        assert wire.CLASSES[wire.type_of(message)] is type(message)


def test_the_json_is_what_trainers_have_always_sent() -> None:
    """Same names as before the typed classes (an older library, a newer esiwrap and the other way
    round): a field whose default is None or False is written only when it says something."""
    sent = json.loads(wire.encode(wire.SaveEnd(step=3, path="/c", duration_s=1.0), 9, 5.0))
    assert sent == {"type": "save_end", "pid": 9, "step": 3, "ok": True, "path": "/c", "duration_s": 1.0,
                    "sent_mono": 5.0}
    hello = json.loads(wire.encode(wire.Hello(integration="plain", extra={"version": "1"}), 9))
    assert hello == {"type": "hello", "pid": 9, "version": "1", "rank": 0, "world_size": 1, "saves": True,
                     "signal": True, "integration": "plain"}


OLD_LIBRARY = [  # datagrams as esiwrap's trainer library wrote them before the typed classes
    b'{"type": "hello", "pid": 5, "rank": 0, "world_size": 1, "saves": true, "integration": "plain", '
    b'"signal": true, "checkpoint_bytes": 1000.0, "sent_mono": 1.0}',
    b'{"type": "save_end", "pid": 5, "step": 7, "ok": true, "path": null, "duration_s": 0.5, '
    b'"sent_mono": 2.0}',
    b'{"type": "start", "pid": 5, "step": 3, "integration": "verl", "resume_mode": "auto", '
    b'"resume_from_path": null}',
    b'{"type": "hello", "pid": 5, "rank": 0, "world_size": 1, "signal": true, "integration": "verl", '
    b'"role": "ray-driver", "ray_version": "2.40.0", "saves": false}',
]


@pytest.mark.parametrize("data", OLD_LIBRARY)
def test_what_an_older_trainer_library_sent_still_decodes(data: bytes) -> None:
    decoded = wire.decode(data)
    assert isinstance(decoded, wire.Envelope) and decoded.pid == 5


def test_extra_fields_are_kept_for_hello_and_start_and_ignored_elsewhere() -> None:
    """A hello's fields beyond the known ones are kept (logged), never the envelope's or the log
    line's own keys; another message's unknown fields are ignored (a newer trainer's additions)."""
    hello = wire.decode(b'{"type": "hello", "pid": 5, "loop": "v1", "event": "x", "run_id": "y", '
                        b'"sent_mono": 1}')
    assert isinstance(hello, wire.Envelope) and hello.message == wire.Hello(extra={"loop": "v1"})
    step = wire.decode(b'{"type": "step", "pid": 5, "step": 1, "tokens": 4096}')
    assert isinstance(step, wire.Envelope) and step.message == wire.Step(step=1)


MALFORMED = [
    (b"not json", "not JSON", "", None),
    (b"\xff\xfe", "not UTF-8", "", None),
    (b"[1, 2]", "not a JSON object", "", None),
    (b'{"pid": 5}', "no known type", "", None),
    (b'{"type": "hullo", "pid": 5}', "unknown type 'hullo'", "", None),
    (b'{"type": [], "pid": 5}', "unknown type []", "", None),
    (b'{"type": "step", "pid": "5", "step": 1}', "pid '5' cannot be a process", "step", None),
    (b'{"type": "step", "pid": true, "step": 1}', "pid True cannot be a process", "step", None),
    (b'{"type": "step", "pid": 4194305, "step": 1}', "pid 4194305 cannot be a process", "step", None),
    (b'{"type": "step", "pid": 5}', "step is missing", "step", 5),
    (b'{"type": "step", "pid": 5, "step": "x"}', "step must be a 64-bit integer, not 'x'", "step", 5),
    (b'{"type": "step", "pid": 5, "step": 1.0}', "step must be a 64-bit integer, not 1.0", "step", 5),
    (b'{"type": "step", "pid": 5, "step": true}', "step must be a 64-bit integer, not True", "step", 5),
    (b'{"type": "step", "pid": 5, "step": 1, "duration_s": NaN}',
     "duration_s must be a finite number, not nan", "step", 5),
    (b'{"type": "step", "pid": 5, "step": 1, "duration_s": -1}', "duration_s must be a duration >= 0, not -1",
     "step", 5),
    (b'{"type": "checkpoint", "pid": 5, "bytes": 0}', "bytes must be a size > 0, not 0", "checkpoint", 5),
    (b'{"type": "save_end", "pid": 5, "step": 1, "ok": "yes"}', "ok must be true or false, not 'yes'",
     "save_end", 5),
    (b'{"type": "save_end", "pid": 5, "step": 1, "path": 7}', "path must be a string, not 7", "save_end", 5),
    (b'{"type": "deadline", "pid": 5, "source": "node:x", "detail": []}',
     "detail must be a JSON object, not []", "deadline", 5),
    (b'{"type": "hello", "pid": 5, "sent_mono": "now"}', "sent_mono must be a finite number", "hello", 5),
    (b'{"type": "step", "pid": 5, "step": ' + str(2**64).encode() + b"}",
     "step must be a 64-bit integer, not 18446744073709551616", "step", 5),
]


@pytest.mark.parametrize(("data", "reason", "kind", "pid"), MALFORMED)
def test_a_field_of_the_wrong_type_is_refused_with_a_reason(data: bytes, reason: str, kind: str,
                                                            pid: int | None) -> None:
    """Nothing of a datagram with one bad field is believed; the reason names the field, and what
    the datagram claims (its type, its pid) is kept where it could be read, for the log line."""
    assert wire.decode(data) == wire.Malformed(reason, kind, pid)


def test_encode_refuses_what_decode_would_refuse() -> None:
    """A sender cannot write a message esiwrap would refuse: ValueError, which `ChannelClient.send`
    turns into False (it never raises into training)."""
    bad: list[wire.Message] = [
        wire.Step(step="7"),  # type: ignore[arg-type]
        wire.Checkpoint(bytes=math.inf), wire.SaveEnd(step=1, duration_s=-0.5),
        wire.Hello(extra={"model": object()}), wire.Step(step=None),  # type: ignore[arg-type]
    ]
    for message in bad:
        with pytest.raises(ValueError, match=wire.type_of(message)):
            wire.encode(message, 5)


@given(st.binary(max_size=2048))
def test_decode_never_raises_on_any_bytes(data: bytes) -> None:
    assert isinstance(wire.decode(data), (wire.Envelope, wire.Malformed))


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


@given(kind=st.sampled_from(sorted(wire.CLASSES)), pid=st.integers(-3, 2**23),
       fields=st.dictionaries(st.sampled_from(["step", "duration_s", "ok", "path", "bytes", "rank", "saves",
                                               "signal", "source", "at", "detail", "peer", "relay", "x"]),
                              JSON, max_size=6))
def test_decode_of_any_message_shape_is_a_typed_message_or_a_reason(kind: str, pid: int,
                                                                     fields: dict[str, Any]) -> None:
    """Messages of every type with fields of any JSON value: a typed message whose fields have their
    class's types, or a reason, never an exception."""
    data = json.dumps({"type": kind, "pid": pid, **fields}).encode()
    decoded = wire.decode(data)
    if isinstance(decoded, wire.Malformed):
        assert decoded.reason and decoded.type == kind
        return
    assert isinstance(decoded.message, wire.CLASSES[kind]) and 0 < decoded.pid <= wire.MAX_PID
    again = wire.decode(wire.encode(decoded.message, decoded.pid))
    assert isinstance(again, wire.Envelope) and type(again.message) is type(decoded.message)
