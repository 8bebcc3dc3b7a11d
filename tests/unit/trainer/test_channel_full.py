"""A trainer's messages when esiwrap's loop is held up and its socket's queue is full: the ones that
matter are kept and arrive later, in order; nothing blocks the trainer."""

from __future__ import annotations

import selectors

from esiwrap.shell.channel import ChannelServer
from esiwrap.trainer import wire
from esiwrap.trainer.channel import ChannelClient


def received(server: ChannelServer) -> list[wire.Message]:
    """The messages waiting at the socket, in order."""
    return [d.decoded.message for d in server.receive() if isinstance(d.decoded, wire.Envelope)]


def fill(client: ChannelClient) -> int:
    """Step reports until the receiver refuses one (its queue is full); how many went."""
    sent = 0
    while client.send(wire.Step(step=sent, duration_s=1.0)):
        sent += 1
        assert sent < 10_000, "the receiver never refused a datagram"
    return sent


def test_a_save_end_refused_by_a_full_queue_arrives_later_in_order() -> None:
    """save_end sent while the queue is full is refused without blocking, kept, and delivered
    before the next message once esiwrap reads again; a refused step report is not kept."""
    server = ChannelServer()
    try:
        client = ChannelClient(server.path)
        queued = fill(client)
        # a blocking send would wait here for good: nobody reads until these return
        assert not client.send(wire.SaveEnd(step=7, ok=True, path="/ckpt", duration_s=2.0))
        assert not client.send(wire.Step(step=8, duration_s=1.0))
        assert client.pending == 1  # the save_end kept, the step report dropped
        first = received(server)
        assert len(first) == queued and all(isinstance(m, wire.Step) for m in first)
        assert client.send(wire.Step(step=9, duration_s=1.0))
        later = received(server)
        assert [(type(m), m.step) for m in later] == [(wire.SaveEnd, 7), (wire.Step, 9)]  # type: ignore[union-attr]
        assert client.pending == 0
        client.close()
    finally:
        server.close()


def test_kept_messages_keep_their_order_and_wait_for_each_other() -> None:
    """While older kept messages cannot go, a newer one that matters waits behind them."""
    server = ChannelServer()
    try:
        client = ChannelClient(server.path)
        fill(client)
        client.send(wire.SaveBegin(step=3))
        client.send(wire.SaveEnd(step=3, ok=True))
        assert client.pending == 2
        server.receive()
        assert client.flush() and client.pending == 0
        assert [type(m) for m in received(server)] == [wire.SaveBegin, wire.SaveEnd]
        client.close()
    finally:
        server.close()


def test_a_receiver_gone_for_good_leaves_nothing_kept() -> None:
    """esiwrap exited: its socket is gone; what was kept is dropped, sends fail at once."""
    server = ChannelServer()
    client = ChannelClient(server.path)
    fill(client)
    client.send(wire.SaveEnd(step=1, ok=True))
    assert client.pending == 1
    server.close()
    assert not client.send(wire.Step(step=2, duration_s=1.0))
    assert client.pending == 0 and client.flush()
    client.close()


def test_a_kept_save_end_goes_without_waiting_for_another_send() -> None:
    """The trainer sends nothing after its save_end (a long step follows): once esiwrap reads
    again, the kept save_end arrives by itself (the client's resend timer), not at the next step."""
    server = ChannelServer()
    try:
        client = ChannelClient(server.path)
        fill(client)
        client.send(wire.SaveEnd(step=5, ok=True))
        assert client.pending == 1
        got = received(server)  # esiwrap's loop runs again; the trainer sends nothing more
        with selectors.DefaultSelector() as selector:
            selector.register(server.fileno(), selectors.EVENT_READ)
            while not any(isinstance(m, wire.SaveEnd) for m in got):
                assert selector.select(timeout=60), "the kept save_end never came"
                got += received(server)
        others = [m for m in got if not isinstance(m, wire.Step)]
        assert others == [wire.SaveEnd(step=5, ok=True)]
        assert isinstance(got[-1], wire.SaveEnd)  # after every step report sent before it
        assert client.pending == 0
        client.close()
    finally:
        server.close()
