"""sd_notify with the standard library: READY, STATUS, STOPPING, EXTEND_TIMEOUT_USEC, WATCHDOG.

The protocol (sd_notify(3)) is one datagram of `KEY=VALUE` lines to the AF_UNIX socket named by
`$NOTIFY_SOCKET`; a leading `@` names a socket in the abstract namespace. Outside systemd the
variable is not set and every call here does nothing. Sending never blocks the loop and never
raises into it: a lost notification is logged once and the supervisor carries on.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping

from esiwrap import events as ev
from esiwrap.shell.log import get_logger

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"
# Meant for esiwrap alone: a trainer that found them would notify or feed the watchdog for us.
CHILD_UNSET = (NOTIFY_SOCKET_ENV, WATCHDOG_USEC_ENV, WATCHDOG_PID_ENV)
STATUS_REFRESH_S = 10.0  # time left and the last step change all the time: at most this often
MAX_STATUS_CHARS = 400  # `systemctl status` shows one line; keep the datagram small


def socket_address(value: str) -> str | None:
    """The address to send to: a path, or `@name` as an abstract socket; None if unusable."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # e.g. vsock: addresses (VMs), which esiwrap does not speak


def send(address: str, message: str) -> None:
    """One datagram; raises OSError if nobody listens (the caller decides what that means)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.setblocking(False)
        sock.sendto(message.encode("utf-8"), address)


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """Half of `WATCHDOG_USEC` when the watchdog is meant for `pid`, else None."""
    raw = environ.get(WATCHDOG_USEC_ENV, "").strip()
    owner = environ.get(WATCHDOG_PID_ENV, "").strip()
    if not raw.isdigit() or int(raw) == 0:
        return None
    if owner and owner != str(pid):
        return None  # the variable leaked from a parent; the watchdog is someone else's
    return int(raw) / 1e6 / 2


class Notifier:
    """The supervisor's line to systemd: what to say, and when it is worth saying it."""

    def __init__(self, address: str | None, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s if address is not None else None
        self._next_ping: float | None = None
        self._status: tuple[str, str] | None = None
        self._status_sent_at = -math.inf
        self._stopping = False
        self._failed = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], pid: int | None = None) -> Notifier:
        address = socket_address(environ.get(NOTIFY_SOCKET_ENV, ""))
        if environ.get(NOTIFY_SOCKET_ENV) and address is None:
            get_logger().warning(ev.SYSTEMD_NOTIFY_UNSUPPORTED, socket=environ[NOTIFY_SOCKET_ENV])
        watchdog = watchdog_interval_s(environ, os.getpid() if pid is None else pid)
        return cls(address, watchdog)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def _send(self, *lines: str) -> None:
        if self.address is None:
            return
        try:
            send(self.address, "\n".join(lines))
        except OSError as exc:
            if not self._failed:  # once: a gone socket would otherwise log on every status
                self._failed = True
                get_logger().warning(ev.SYSTEMD_NOTIFY_FAILED, error=f"{type(exc).__name__}: {exc}")

    def ready(self, stable: str, volatile: str, mono: float) -> None:
        """The child runs: READY=1 with the first status line."""
        self._status, self._status_sent_at = (stable, volatile), mono
        self._send("READY=1", "STATUS=" + _status_text(stable, volatile))
        if self.watchdog_s is not None:
            self._next_ping = mono + self.watchdog_s

    def status(self, stable: str, volatile: str, mono: float) -> None:
        """STATUS= when the stable part changed, or the volatile part after STATUS_REFRESH_S."""
        previous = self._status
        if previous == (stable, volatile):
            return
        if previous is not None and previous[0] == stable and mono - self._status_sent_at < STATUS_REFRESH_S:
            return
        self._status, self._status_sent_at = (stable, volatile), mono
        self._send("STATUS=" + _status_text(stable, volatile))

    def stopping(self) -> None:
        """STOPPING=1, once: esiwrap is on its way out (a stop was asked for, or it decided)."""
        if not self._stopping:
            self._stopping = True
            self._send("STOPPING=1")

    def extend_stop(self, seconds: float) -> None:
        """During a stop, ask systemd for `seconds` more before it escalates to SIGKILL."""
        if self._stopping and seconds > 0:
            self._send(f"EXTEND_TIMEOUT_USEC={math.ceil(seconds * 1e6)}")

    def ping_in(self, mono: float) -> float:
        """Seconds until the watchdog wants a ping (inf without a watchdog): a loop timer."""
        return math.inf if self._next_ping is None else max(0.0, self._next_ping - mono)

    def ping_if_due(self, mono: float) -> None:
        if self._next_ping is not None and mono >= self._next_ping and self.watchdog_s is not None:
            self._send("WATCHDOG=1")
            self._next_ping = mono + self.watchdog_s


def _status_text(stable: str, volatile: str) -> str:
    text = f"{stable}; {volatile}" if stable and volatile else stable or volatile
    return " ".join(text.split())[:MAX_STATUS_CHARS]  # one line, whatever went into it
