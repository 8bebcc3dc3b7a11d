"""The trainer's end of the channel: datagrams to the Unix socket named by `ESIWRAP_SOCKET`.

Datagrams keep message boundaries, need no connection, and a full or missing receiver makes
`send` fail at once instead of blocking a training step. What a message holds, and how it is
written, is `esiwrap.trainer.wire`; esiwrap's end of the socket is `esiwrap.shell.channel`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque

from esiwrap.envvars import SIGNAL_ENV, SOCKET_ENV
from esiwrap.trainer import wire

__all__ = ["SIGNAL_ENV", "SOCKET_ENV", "ChannelClient"]


# A full receiver (esiwrap's loop held up: a Unix datagram socket queues only
# net.unix.max_dgram_qlen, 10 by default) refuses a datagram at once. These are kept and sent again
# before anything else, at the next send or `flush`: a lost save_end is a checkpoint esiwrap never
# hears of (exit 76 with the checkpoint on disk). A step report is not kept: the next one says more.
KEPT_WHEN_REFUSED: frozenset[type[wire.Message]] = frozenset({
    wire.Hello, wire.SaveBegin, wire.SaveSnapshot, wire.SaveEnd, wire.Bye, wire.Checkpoint, wire.Start,
    wire.Deadline,
})
MAX_KEPT = 256  # bounded: a receiver gone for good costs a trainer no more than this
RESEND_EVERY_S = 0.05  # kept messages are tried again this often, without waiting for a next send


class ChannelClient:
    """The trainer's end. `send` never blocks and never raises: training comes first. A message
    that matters and is refused (the receiver's queue is full) is kept and sent again, in order,
    before the next one, and every RESEND_EVERY_S by a timer thread meanwhile: a save_end must not
    wait for the next step report, which can be a long step away."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._kept: deque[bytes] = deque()  # refused, to be sent again (oldest first)
        self._lock = threading.Lock()  # the caller's thread and the resend timer share the socket
        self._resend: threading.Timer | None = None

    @classmethod
    def from_env(cls) -> ChannelClient:
        return cls(os.environ.get(SOCKET_ENV) or None)

    def send(self, message: wire.Message) -> bool:
        """Send `message` as this process; False when it did not go (now, or at all)."""
        if self.path is None:
            return False
        # sent_mono: this machine's monotonic clock, so the receiver knows how late a report came
        # (a relay stamps what it forwards anew: only its own hop is measured)
        try:
            data = wire.encode(message, os.getpid(), round(time.monotonic(), 6))
        except ValueError:
            return False
        with self._lock:
            if not self._flush():  # what was refused goes first; this one waits behind it
                return self._keep(message, data)
            try:
                self._datagram(data)
            except (BlockingIOError, InterruptedError):
                return self._keep(message, data)
            except OSError:
                return False
            return True

    def flush(self) -> bool:
        """Send again what the receiver refused, oldest first; True when nothing is left."""
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        while self._kept:
            try:
                self._datagram(self._kept[0])
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:  # no receiver any more: nobody will read them
                self._kept.clear()
                return True
            self._kept.popleft()
        return True

    def _resend_kept(self) -> None:
        """The timer: try the kept messages again; again later while some are left."""
        with self._lock:
            self._resend = None
            if not self._flush():
                self._schedule_resend()

    def _schedule_resend(self) -> None:
        if self._resend is None and self._kept:
            self._resend = threading.Timer(RESEND_EVERY_S, self._resend_kept)
            self._resend.daemon = True
            self._resend.start()

    @property
    def pending(self) -> int:
        """Messages refused and kept to be sent again. Read under the lock: a message the resend
        timer is sending (the receiver may have it already) counts until it is off the queue."""
        with self._lock:
            return len(self._kept)

    def _keep(self, message: wire.Message, data: bytes) -> bool:
        if type(message) in KEPT_WHEN_REFUSED and len(self._kept) < MAX_KEPT:
            self._kept.append(data)
            self._schedule_resend()
        return False

    def _datagram(self, data: bytes) -> None:
        assert self.path is not None
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        self._sock.sendto(data, self.path)

    def close(self) -> None:
        with self._lock:
            if self._resend is not None:
                self._resend.cancel()
                self._resend = None
            if self._sock is not None:
                self._sock.close()
                self._sock = None
