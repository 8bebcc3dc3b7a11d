"""A threaded HTTP server on an ephemeral 127.0.0.1 port, started and stopped by a test."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler sleeping past a client timeout must not hold up the test

    def __init__(self, handler: type[BaseHTTPRequestHandler], owner: Any) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.owner = owner

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Running:
    """Start `serve_forever` on a thread; `close()` stops it."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = LoopbackServer(handler, self)
        self.url = self.server.url
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        self.lock = threading.Lock()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
