"""A fake Compute Engine metadata server (`/computeMetadata/v1/`), as Google documents it
(cloud.google.com/compute/docs/metadata/querying-metadata, .../instances/spot, .../gpus/gpu-host-maintenance):

* every request needs `Metadata-Flavor: Google` and no `X-Forwarded-For`, else 403;
* every answer carries `Metadata-Flavor: Google` and the value's `ETag`;
* `?wait_for_change=true` hangs until the value's ETag differs from `last_etag` (or, without
  one, from the ETag when the request came), or `timeout_sec` passes; then it answers the current
  value. A `last_etag` that is already stale answers at once;
* items: `instance/preempted` (FALSE | TRUE), `instance/maintenance-event` (NONE |
  MIGRATE_ON_HOST_MAINTENANCE | TERMINATE_ON_HOST_MAINTENANCE), `instance/scheduling/preemptible`,
  `instance/scheduling/provisioning-model`, `instance/name`; anything else is 404.

`set(item, value)` changes a value (waking the hanging GETs); `answer_next(status, body)` replaces
the next answers; `hang_supported = False` makes the server ignore wait_for_change.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fakes._server import QuietHandler, Running

PREFIX = "/computeMetadata/v1/"
MAX_HANG_S = 60.0  # the fake's own bound on a hanging GET without timeout_sec


@dataclass
class Request:
    path: str
    query: dict[str, list[str]]
    flavor_ok: bool
    at: float
    answered_at: float = 0.0
    woke_on_change: bool = False  # a hanging GET that returned because the value changed, not its timeout

    @property
    def hanging(self) -> bool:
        return (self.query.get("wait_for_change") or [""])[0] == "true"


def etag_of(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class FakeGcpMetadata(Running):
    def __init__(self, preemptible: bool = True) -> None:
        self.items = {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/scheduling/preemptible": "TRUE" if preemptible else "FALSE",
            "instance/scheduling/provisioning-model": "SPOT" if preemptible else "STANDARD",
            "instance/name": "trainer-0",
        }
        self.requests: list[Request] = []
        self.hang_supported = True
        self._changed = threading.Condition()
        self._next_answers: list[tuple[int, bytes]] = []
        super().__init__(_GcpHandler)

    def set(self, item: str, value: str | None) -> None:
        with self._changed:
            if value is None:
                self.items.pop(item, None)
            else:
                self.items[item] = value
            self._changed.notify_all()

    def answer_next(self, status: int, body: bytes, times: int = 1) -> None:
        with self._changed:
            self._next_answers.extend([(status, body)] * times)

    def of(self, item: str) -> list[Request]:
        return [r for r in self.requests if r.path == PREFIX + item]

    def close(self) -> None:
        with self._changed:
            self.items["__closing__"] = "1"  # wake hanging GETs so shutdown does not wait on them
            self._changed.notify_all()
        super().close()

    def _wait(self, item: str, last_etag: str | None, timeout_s: float) -> bool:
        """Hang until the value's ETag differs from the one given: True, or False at the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            start = etag_of(self.items.get(item, "")) if last_etag is None else last_etag
            while etag_of(self.items.get(item, "")) == start and "__closing__" not in self.items:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return "__closing__" not in self.items


class _GcpHandler(QuietHandler):
    server: Any

    @property
    def fake(self) -> FakeGcpMetadata:
        return self.server.owner  # type: ignore[no-any-return]

    def do_GET(self) -> None:
        fake = self.fake
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        flavor_ok = self.headers.get("Metadata-Flavor") == "Google" \
            and self.headers.get("X-Forwarded-For") is None
        request = Request(parts.path, query, flavor_ok, time.time())
        fake.requests.append(request)
        if not flavor_ok:
            self._answer(403, b"Missing Metadata-Flavor:Google header.", "")
            return
        item = parts.path.removeprefix(PREFIX)
        if not parts.path.startswith(PREFIX) or item not in fake.items:
            self._answer(404, b"Not Found", "")
            return
        if request.hanging and fake.hang_supported:
            timeout = float((query.get("timeout_sec") or [str(MAX_HANG_S)])[0])
            request.woke_on_change = fake._wait(item, (query.get("last_etag") or [None])[0],
                                                min(timeout, MAX_HANG_S))
        with fake._changed:
            injected = fake._next_answers.pop(0) if fake._next_answers else None
            value = fake.items.get(item, "")
        request.answered_at = time.time()
        if injected is not None:
            self._answer(injected[0], injected[1], "")
            return
        self._answer(200, value.encode(), etag_of(value))

    def _answer(self, status: int, body: bytes, etag: str) -> None:
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
