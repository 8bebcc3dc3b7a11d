"""A tiny HTTP/1.x server that lives in the caller's selector loop: the metrics endpoint.

No thread and no blocking call: a non-blocking listening socket and one small state machine per
connection (reading the request, writing the answer, draining what the client still sends before
closing), each registered in the caller's selector with a callable as its data, which the loop
calls with the SelectorKey. The caller also asks `next_wake()` for the earliest connection
deadline (to bound its select timeout) and calls `expire()` on every wake, so a client that
connects and sends nothing, or reads nothing, is closed after `timeout_s`.

Requests are at most `max_request` bytes (the request line and headers; a body is never read),
every answer closes its connection, and only GET and HEAD are served.

A full table makes room: the oldest connection that has not finished its request is closed for
the new one, so idle or half-sent connections (any local process can open them, anyone on the
network with `--metrics-address 0.0.0.0`) cannot shut a scraper out. Accepts per wake are capped
at half the table, so a connection accepted in one wake is read in the next before any newer one
can push it out.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from esiwrap.errors import UsageError

MAX_REQUEST = 8192
TIMEOUT_S = 5.0  # from accept to the last byte of the answer
LINGER_S = 1.0  # after the answer, how long to read what a client still sends before closing
MAX_CONNECTIONS = 32
LISTEN_BACKLOG = 128  # a burst of connections waits in the kernel, not refused
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Page:
    content_type: str
    body: bytes
    status: int = 200


Pages = Callable[[str], "Page | None"]  # path -> the page, or None for 404


def parse_address(text: str) -> str:
    """A numeric IPv4/IPv6 address (or `localhost`) to listen on; ValueError otherwise.
    Numeric only: resolving a name could block, and would depend on the network."""
    value = text.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    if value.lower() == "localhost":
        return "127.0.0.1"
    for family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            socket.inet_pton(family, value)
            return value
    msg = "not a numeric IP address; e.g. 127.0.0.1, 0.0.0.0 (every interface) or ::1"
    raise ValueError(msg)


def listen(address: str, port: int) -> socket.socket:
    """A non-blocking listening socket, or UsageError saying why not in one line."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise UsageError(_bind_error(address, port, exc)) from None
    return sock


def _bind_error(address: str, port: int, exc: OSError) -> str:
    where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"--metrics-port {port}: {where} is already in use; pick another port (0: any free one)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--metrics-address {address}: not an address of this machine; e.g. 127.0.0.1 or 0.0.0.0"
    if exc.errno == errno.EACCES:
        return f"--metrics-port {port}: not allowed to listen on {where} (ports below 1024 need root)"
    return f"--metrics-port {port}: cannot listen on {where}: {exc.strerror or exc}"


class HttpEndpoint:
    """Serves `pages` on `address:port` from the caller's selector (port 0: any free port)."""

    def __init__(self, selector: selectors.BaseSelector, address: str, port: int, pages: Pages, *,
                 timeout_s: float = TIMEOUT_S, max_request: int = MAX_REQUEST,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.selector = selector
        self._pages = pages
        self.timeout_s = timeout_s
        self.max_request = max_request
        self.max_connections = max_connections
        self._listener = listen(address, port)
        self._connections: set[_Connection] = set()
        self._opened = itertools.count()  # the age of a connection, for making room
        selector.register(self._listener, selectors.EVENT_READ, self._on_accept)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def next_wake(self) -> float | None:
        """The monotonic time the earliest open connection times out, or None."""
        return min((c.deadline for c in self._connections), default=None)

    def expire(self, mono: float) -> None:
        """Close every connection whose time is up."""
        for conn in [c for c in self._connections if c.deadline <= mono]:
            conn.close()

    def close(self) -> None:
        for conn in list(self._connections):
            conn.close()
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self._listener)
        self._listener.close()

    def _on_accept(self, _key: selectors.SelectorKey) -> None:
        for _ in range(max(1, self.max_connections // 2)):
            try:
                sock, _peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE, ECONNABORTED: try again at the next wake
                return
            if len(self._connections) >= self.max_connections and not self._make_room():
                sock.close()  # every slot is answering a request: refuse the newcomer
                continue
            sock.setblocking(False)
            self._connections.add(_Connection(self, sock, time.monotonic() + self.timeout_s,
                                              next(self._opened)))

    def _make_room(self) -> bool:
        """Close the oldest connection still sending its request; False when there is none."""
        asking = [c for c in self._connections if c.state == "reading"]
        if not asking:
            return False
        min(asking, key=lambda c: c.serial).close()
        return True

    def _answer(self, request: bytes) -> bytes:
        """The whole response to one request's head."""
        line = request.split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _response(400, "text/plain; charset=utf-8", b"bad request\n")
        method, target, _version = parts
        page = self._pages(target.split("?", 1)[0])
        if page is None:
            return _response(404, "text/plain; charset=utf-8", b"not found; try /metrics or /status\n",
                             head=method == "HEAD")
        if method not in ("GET", "HEAD"):
            return _response(405, "text/plain; charset=utf-8", b"only GET and HEAD\n",
                             extra="Allow: GET, HEAD\r\n")
        return _response(page.status, page.content_type, page.body, head=method == "HEAD")


def _response(status: int, content_type: str, body: bytes, *, head: bool = False, extra: str = "") -> bytes:
    head_text = (f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\n"
                 f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                 f"Cache-Control: no-store\r\nConnection: close\r\n{extra}\r\n")
    return head_text.encode("latin-1") + (b"" if head else body)


class _Connection:
    """One client: read the request head, write the answer, drain, close."""

    def __init__(self, server: HttpEndpoint, sock: socket.socket, deadline: float, serial: int) -> None:
        self.server = server
        self.sock = sock
        self.deadline = deadline
        self.serial = serial
        self.state = "reading"  # reading -> writing -> draining -> closed
        self._inbox = b""
        self._outbox = b""
        server.selector.register(sock, selectors.EVENT_READ, self._on_event)

    def _on_event(self, _: selectors.SelectorKey) -> None:
        try:
            if self.state == "reading":
                self._read()
            elif self.state == "writing":
                self._write()
            elif self.state == "draining":
                self._drain()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the peer, broken pipe: nothing more to say
            self.close()

    def _read(self) -> None:
        data = self.sock.recv(4096)
        if not data:
            self.close()  # gone before the request was complete
            return
        self._inbox += data
        end = self._inbox.find(b"\r\n\r\n")
        if end < 0:
            end = self._inbox.find(b"\n\n")
        if end >= 0 and end <= self.server.max_request:
            self._respond(self.server._answer(self._inbox[:end]))
        elif len(self._inbox) > self.server.max_request:
            self._respond(_response(431, "text/plain; charset=utf-8", b"request too large\n"))

    def _respond(self, response: bytes) -> None:
        self._outbox = response
        self.state = "writing"
        self._write()

    def _write(self) -> None:
        sent = self.sock.send(self._outbox)
        self._outbox = self._outbox[sent:]
        if self._outbox:
            self.server.selector.modify(self.sock, selectors.EVENT_WRITE, self._on_event)
            return
        # All sent. Closing with unread bytes from the client would reset the connection and
        # could destroy the answer in flight: half-close, read what is left, then close.
        self.sock.shutdown(socket.SHUT_WR)
        self.state = "draining"
        self.deadline = min(self.deadline, time.monotonic() + LINGER_S)
        self.server.selector.modify(self.sock, selectors.EVENT_READ, self._on_event)

    def _drain(self) -> None:
        if not self.sock.recv(4096):
            self.close()

    def close(self) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        self.server._connections.discard(self)
        with contextlib.suppress(KeyError, ValueError):
            self.server.selector.unregister(self.sock)
        self.sock.close()
