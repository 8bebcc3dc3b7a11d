"""A trainer's messages when esiwrap's loop is held up and its socket's queue is full: the ones that
matter are kept and arrive later, in order; nothing blocks the trainer."""

from __future__ import annotations

import selectors

from esiwrap.trainer import wire as messages
from esiwrap.trainer.channel import ChannelClient, ChannelServer


def fill(client: ChannelClient) -> int:
    """Step reports until the receiver refuses one (its queue is full); how many went."""
    sent = 0
    while client.send(messages.STEP, step=sent, duration_s=1.0):
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
        assert not client.send(messages.SAVE_END, step=7, ok=True, path="/ckpt", duration_s=2.0)
        assert not client.send(messages.STEP, step=8, duration_s=1.0)
        assert client.pending == 1  # the save_end kept, the step report dropped
        first = server.receive()
        assert len(first) == queued and all(m.type == messages.STEP for m in first)
        assert client.send(messages.STEP, step=9, duration_s=1.0)
        later = server.receive()
        assert [(m.type, m.get_int("step")) for m in later] == [(messages.SAVE_END, 7), (messages.STEP, 9)]
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
        client.send(messages.SAVE_BEGIN, step=3)
        client.send(messages.SAVE_END, step=3, ok=True)
        assert client.pending == 2
        server.receive()
        assert client.flush() and client.pending == 0
        assert [m.type for m in server.receive()] == [messages.SAVE_BEGIN, messages.SAVE_END]
        client.close()
    finally:
        server.close()


def test_a_receiver_gone_for_good_leaves_nothing_kept() -> None:
    """esiwrap exited: its socket is gone; what was kept is dropped, sends fail at once."""
    server = ChannelServer()
    client = ChannelClient(server.path)
    fill(client)
    client.send(messages.SAVE_END, step=1, ok=True)
    assert client.pending == 1
    server.close()
    assert not client.send(messages.STEP, step=2, duration_s=1.0)
    assert client.pending == 0 and client.flush()
    client.close()


def test_a_kept_save_end_goes_without_waiting_for_another_send() -> None:
    """The trainer sends nothing after its save_end (a long step follows): once esiwrap reads
    again, the kept save_end arrives by itself (the client's resend timer), not at the next step."""
    server = ChannelServer()
    try:
        client = ChannelClient(server.path)
        fill(client)
        client.send(messages.SAVE_END, step=5, ok=True)
        assert client.pending == 1
        got = server.receive()  # esiwrap's loop runs again; the trainer sends nothing more
        with selectors.DefaultSelector() as selector:
            selector.register(server.fileno(), selectors.EVENT_READ)
            while messages.SAVE_END not in [m.type for m in got]:
                assert selector.select(timeout=60), "the kept save_end never came"
                got += server.receive()
        others = [(m.type, m.get_int("step")) for m in got if m.type != messages.STEP]
        assert others == [(messages.SAVE_END, 5)]
        assert got[-1].type == messages.SAVE_END  # after every step report sent before it
        assert client.pending == 0
        client.close()
    finally:
        server.close()
