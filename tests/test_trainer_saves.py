"""The trainer library's save reports, read from a real channel socket in this process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import esiwrap.trainer as esi
from esiwrap.trainer.channel import SOCKET_ENV, ChannelServer


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChannelServer]:
    channel = ChannelServer()
    monkeypatch.setenv(SOCKET_ENV, channel.path)
    yield channel
    esi.uninstall()
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
    messages = [m for m in server.receive() if m.type != "hello"]
    assert [(m.type, m.get_int("step"), m.fields.get("ok")) for m in messages] == [
        ("save_begin", 7, None), ("save_end", 7, False), ("save_begin", 8, None), ("save_end", 8, True),
    ]
    assert messages[1].get_str("error") == "disk full" and messages[3].get_str("path") == "/ckpt/8"
