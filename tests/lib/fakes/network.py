"""Loopback addresses that fail the way an absent cloud does, without a packet leaving the host.

* `closed_port_url()`: nothing listens; the connection is refused at once.
* `Blackhole`: a listening socket whose accept queue is full, so the kernel drops new SYNs and a
  connect hangs until its timeout, like an unroutable metadata address off a cloud VM.
* `Silent`: connections are accepted by the kernel but never answered: a read timeout.
"""

from __future__ import annotations

import contextlib
import socket


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class Blackhole:
    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        port = self._listener.getsockname()[1]
        self._filler = socket.create_connection(("127.0.0.1", port), timeout=2)  # fills the queue
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        for sock in (self._filler, self._listener):
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Silent:
    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
