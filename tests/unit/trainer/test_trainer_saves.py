"""The trainer library's save reports, read from a real channel socket in this process."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

import esiwrap.trainer as esi
from esiwrap.shell.channel import ChannelServer
from esiwrap.trainer import wire
from esiwrap.trainer.channel import SOCKET_ENV


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChannelServer]:
    channel = ChannelServer()
    monkeypatch.setenv(SOCKET_ENV, channel.path)
    before = signal.getsignal(signal.SIGUSR1)
    yield channel
    esi.uninstall()  # under "esiwrap" this leaves the signal ignored: no later test inherits it
    signal.signal(signal.SIGUSR1, before)
    channel.close()


def test_split_save_reports_begin_and_end_and_a_failure_keeps_the_request(server: ChannelServer) -> None:
    """`save_started`/`save_finished` (a save spanning two framework hooks) report like `saving()`;
    a failed one is reported with its error and leaves the request set for the next boundary."""
    esi.install()
    esi.request_save()
    esi.save_started(7)
    esi.save_finished(7, "/ckpt/7", error="disk full")
    assert esi.save_requested()
    esi.save_started(8)
    esi.save_finished(8, "/ckpt/8")
    assert not esi.save_requested()
    messages = [d.decoded.message for d in server.receive()
                if isinstance(d.decoded, wire.Envelope) and not isinstance(d.decoded.message, wire.Hello)]
    assert messages == [
        wire.SaveBegin(7), wire.SaveEnd(7, ok=False, path="/ckpt/7", duration_s=messages[1].duration_s,
                                        error="disk full"),
        wire.SaveBegin(8), wire.SaveEnd(8, ok=True, path="/ckpt/8", duration_s=messages[3].duration_s),
    ]
