"""esiwrap's end of the trainer channel (`esiwrap.shell.channel`), in this process: the sender of a
datagram is the kernel's answer, who may speak, and how refusals are logged. This process plays
esiwrap (its own pid is the tree's root), so what it sends comes from inside the tree."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from esiwrap import events as ev
from esiwrap.core import controller as core
from esiwrap.shell import channel as shell_channel
from esiwrap.shell.channel import ChannelServer, Refusals, TrainerChannel
from esiwrap.shell.log import capture_logs, get_logger
from esiwrap.trainer import wire

pytestmark = pytest.mark.skipif(not shell_channel.HAS_CREDENTIALS, reason="SO_PASSCRED is Linux's")

WALL = 1_800_000_000.0


@pytest.fixture
def logged() -> Iterator[list[dict[str, Any]]]:
    with capture_logs() as entries:
        yield entries


@pytest.fixture
def channel(logged: list[dict[str, Any]]) -> Iterator[TrainerChannel]:
    trainers: set[int] = set()
    opened = TrainerChannel(get_logger(), lambda: WALL, trainers.__contains__)
    yield opened
    opened.close()


def send(to: str, /, **fields: Any) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(json.dumps(fields).encode(), to)


def refusals(logged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logged if e["event"] == ev.MESSAGE_REFUSED]


def test_the_sender_is_the_kernels_answer() -> None:
    """Each datagram comes with its sender's pid from SCM_CREDENTIALS, whatever its pid field says."""
    server = ChannelServer()
    try:
        assert server.credentials
        send(server.path, type="step", pid=1, step=3)
        (datagram,) = server.receive()
        assert datagram.sender == os.getpid()
        assert datagram.decoded == wire.Envelope(wire.Step(step=3), 1)
    finally:
        server.close()


def test_a_message_from_its_own_process_becomes_an_input(channel: TrainerChannel,
                                                         logged: list[dict[str, Any]]) -> None:
    me = os.getpid()
    send(channel.path, type="hello", pid=me, rank=0, saves=True, loop="v1", sent_mono=1.0)
    send(channel.path, type="save_end", pid=me, step=7, ok=True, path="/c/7", duration_s=2.0)
    hello, end = channel.receive(2.0)
    assert isinstance(hello, core.Hello) and hello.pid == me and hello.descendant
    assert dict(hello.fields) == {"loop": "v1", "rank": 0, "world_size": 1, "saves": True, "signal": True}
    assert end == core.SaveEnd(me, 7, ok=True, duration_s=2.0, path="/c/7")
    assert refusals(logged) == []


def test_a_pid_field_that_is_not_its_sender_is_refused(channel: TrainerChannel,
                                                       logged: list[dict[str, Any]]) -> None:
    """A process of esiwrap's tree speaking for another pid (a trainer's, or nobody's) is not
    believed: one warning that names the sender, its command line and the pid it claimed."""
    send(channel.path, type="save_end", pid=424242, step=5, ok=True)
    assert channel.receive(1.0) == []
    (refused,) = refusals(logged)
    assert refused["pid"] == os.getpid() and refused["claimed_pid"] == 424242
    assert refused["message"] == "save_end" and refused["reason"] == shell_channel.NOT_ITS_PID
    assert refused["cmdline"] and "python" in refused["cmdline"].lower()


def test_a_relay_speaks_for_others_as_itself(channel: TrainerChannel, logged: list[dict[str, Any]]) -> None:
    """A process that said hello as a relay (the Ray driver) may forward messages that name another
    process: they count as its own, for the types a relay forwards; its bye is its own."""
    me = os.getpid()
    send(channel.path, type="hello", pid=me, relay=True, saves=False)
    send(channel.path, type="step", pid=31337, step=4, duration_s=1.0)
    send(channel.path, type="bye", pid=31337)
    hello, step = channel.receive(1.0)
    assert isinstance(hello, core.Hello) and step == core.Step(me, 4, 1.0, None)
    assert [r["message"] for r in refusals(logged)] == ["bye"]
    channel.forget(me)  # its process left: it relays no more
    send(channel.path, type="step", pid=31337, step=5, duration_s=1.0)
    assert channel.receive(1.0) == []


def test_a_process_outside_the_tree_is_refused_a_hello_only_by_the_controller(
        channel: TrainerChannel, logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen from a tree this process is not in (a root no process descends from): its hello goes
    to the controller marked `descendant=False` (the controller refuses it), anything else is
    refused here, a deadline answer too."""
    monkeypatch.setattr(channel, "_own_pid", wire.MAX_PID + 1)
    me = os.getpid()
    send(channel.path, type="hello", pid=me, signal=False, saves=True)
    send(channel.path, type="save_end", pid=me, step=1)
    send(channel.path, type="deadline", pid=me, source="node:1a2b3c4d/cli", at=WALL + 60)
    (hello,) = channel.receive(1.0)
    assert isinstance(hello, core.Hello) and not hello.descendant
    assert [(r["message"], r["reason"]) for r in refusals(logged)] == [
        ("save_end", core.NOT_IN_TREE), ("deadline", core.NOT_IN_TREE)]


def test_what_is_not_a_message_is_refused_with_its_reason(channel: TrainerChannel,
                                                          logged: list[dict[str, Any]]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(b'{"type": "step", "pid": 5, "step": "x"}', channel.path)
        sender.sendto(b"\x00garbage", channel.path)
    assert channel.receive(1.0) == []
    assert [(r["message"], r["claimed_pid"], r["reason"]) for r in refusals(logged)] == [
        ("step", 5, "not a message: step must be a 64-bit integer, not 'x'"),
        (None, None, "not a message: not JSON"),
    ]


def test_the_controllers_refusal_is_logged_as_the_channels(channel: TrainerChannel,
                                                           logged: list[dict[str, Any]]) -> None:
    """`RefuseMessage` from the controller: the same warning, named by the message it came as."""
    end = core.SaveEnd(os.getpid(), 424242, duration_s=0.2)
    channel.refuse(core.RefuseMessage(end, core.NEVER_BEGUN))
    (refused,) = refusals(logged)
    assert (refused["pid"], refused["message"], refused["claimed_pid"], refused["reason"]) == (
        os.getpid(), "save_end", os.getpid(), core.NEVER_BEGUN)


def test_repeats_are_kept_down_and_counted(logged: list[dict[str, Any]]) -> None:
    """A sender's refusals for one reason: the first three lines, then one a minute that says how
    many were not logged since; as esiwrap exits, one line for those not told yet. Another reason, or
    another sender, has lines of its own."""
    clock = [0.0]
    told = Refusals(get_logger(), clock=lambda: clock[0])
    for second in range(200):
        clock[0] = float(second)
        told.refused(7, "save_end", 9, "its pid field names another process")
    told.refused(7, "hello", 7, "not in esiwrap's process tree")
    told.refused(8, "save_end", 9, "its pid field names another process")
    lines = refusals(logged)
    by_seven = [r for r in lines if r["pid"] == 7 and r["message"] == "save_end"]
    # seconds 0, 1, 2; then 62 (59 untold: 3..61), 122 (59), 182 (59)
    assert [r.get("suppressed", 0) for r in by_seven] == [0, 0, 0, 59, 59, 59]
    assert len(lines) == len(by_seven) + 2
    told.tell_untold()
    last = refusals(logged)[-1]
    assert (last["pid"], last["suppressed"]) == (7, 17)  # 183..199


def test_without_credentials_the_pid_field_is_believed_after_one_warning(
        monkeypatch: pytest.MonkeyPatch, logged: list[dict[str, Any]]) -> None:
    """Where the system cannot name a datagram's sender (not Linux): `channel_unverified` once, and
    the pid field is taken as the sender, still held to esiwrap's tree."""
    monkeypatch.setattr(shell_channel, "HAS_CREDENTIALS", False)
    opened = TrainerChannel(get_logger(), lambda: WALL, lambda pid: False)
    try:
        assert [e["event"] for e in logged] == [ev.CHANNEL_UNVERIFIED]
        send(opened.path, type="step", pid=os.getpid(), step=1)
        send(opened.path, type="step", pid=1, step=1)  # init: not below this process
        assert opened.receive(1.0) == [core.Step(os.getpid(), 1, 0.0, None)]
        assert [(r["claimed_pid"], r["reason"]) for r in refusals(logged)] == [(1, core.NOT_IN_TREE)]
    finally:
        opened.close()
