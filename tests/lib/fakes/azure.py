"""A fake Azure Instance Metadata Service: Scheduled Events and the compute name/priority items.

As Microsoft documents it (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events,
.../instance-metadata-service):

    GET  /metadata/scheduledevents?api-version=2020-07-01   {"DocumentIncarnation": n, "Events": [...]}
    POST /metadata/scheduledevents?api-version=2020-07-01   {"StartRequests": [{"EventId": "..."}]}
    GET  /metadata/instance/compute/name?api-version=2021-02-01&format=text      the VM's name
    GET  /metadata/instance/compute/priority?api-version=2021-02-01&format=text  Spot | Regular | ""

* every request needs `Metadata: true` and no `X-Forwarded-For`, else 400 with a JSON error;
  a missing or unknown api-version is 400 too, as is a leaf item asked without `format=text`;
* `DocumentIncarnation` grows whenever the events change; an event has EventId, EventType,
  ResourceType, Resources, EventStatus (Scheduled | Started), NotBefore (RFC 1123, "" once
  started), Description, EventSource, DurationInSeconds;
* the first GET of the document "enables the service" and answers after `enable_delay_s`, or
  once the test sets `enable_gate`;
* an approval (POST) of a known EventId answers 200 and starts the event (EventStatus Started,
  NotBefore ""); a malformed body or an unknown EventId is 400;
* more than 5 requests in a second are throttled with 429 (`rate_limit`).

Faults: `answer_next(status, body)` replaces the next answers to the document GET, and
`approval_hook` is called (with the EventIds) when an approval arrives, before it is answered.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fakes._server import QuietHandler, Running

SCHEDULED_EVENTS_VERSIONS = frozenset({"2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01",
                                       "2019-08-01", "2020-07-01"})
INSTANCE_VERSIONS = frozenset({"2020-12-01", "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01"})
EVENTS_PATH = "/metadata/scheduledevents"
COMPUTE_PATH = "/metadata/instance/compute/"
DEFAULT_VM = "trainer-vm-0"
MAX_ENABLE_S = 60.0  # the fake's own bound on a first call held by `enable_gate`
BAD_VERSION = "Bad request. api-version is invalid or was not specified in the request."


def rfc1123(epoch_s: float) -> str:
    """`Mon, 11 Apr 2022 22:26:58 GMT`, as Scheduled Events writes NotBefore."""
    return formatdate(epoch_s, usegmt=True)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: str
    at: float


@dataclass
class Approval:
    event_ids: list[str]
    at: float
    hook_result: Any = None


@dataclass
class FakeEvent:
    event_type: str
    not_before: str
    resources: list[str]
    status: str = "Scheduled"
    description: str = ""
    source: str = "Platform"
    duration_s: int = -1
    event_id: str = field(default_factory=lambda: str(uuid.uuid4()).upper())

    def document(self) -> dict[str, Any]:
        return {"EventId": self.event_id, "EventStatus": self.status, "EventType": self.event_type,
                "ResourceType": "VirtualMachine", "Resources": list(self.resources),
                "NotBefore": self.not_before, "Description": self.description,
                "EventSource": self.source, "DurationInSeconds": self.duration_s}


class FakeAzureMetadata(Running):
    def __init__(self, vm_name: str = DEFAULT_VM, priority: str = "Regular", enable_delay_s: float = 0.0,
                 rate_limit: int | None = 5, enable_gate: threading.Event | None = None) -> None:
        self.vm_name = vm_name
        self.priority = priority
        self.enable_delay_s = enable_delay_s
        self.enable_gate = enable_gate
        self.rate_limit = rate_limit
        self.events: dict[str, FakeEvent] = {}
        self.incarnation = 1
        self.enabled = False
        self.requests: list[Request] = []
        self.approvals: list[Approval] = []
        self.approval_hook: Callable[[list[str]], Any] | None = None
        self._next_answers: list[tuple[int, bytes]] = []
        self._recent: list[float] = []
        super().__init__(_AzureHandler)

    # ------------------------------------------------------------------ the test's controls
    def schedule(self, event_type: str, in_s: float | None, resources: list[str] | None = None,
                 **fields: Any) -> str:
        """A new event `in_s` seconds from now (None: NotBefore empty, already started)."""
        not_before = "" if in_s is None else rfc1123(time.time() + in_s)
        event = FakeEvent(event_type, not_before, resources if resources is not None else [self.vm_name],
                          status="Started" if in_s is None else "Scheduled", **fields)
        with self.lock:
            self.events[event.event_id] = event
            self.incarnation += 1
        return event.event_id

    def move(self, event_id: str, in_s: float) -> None:
        with self.lock:
            self.events[event_id].not_before = rfc1123(time.time() + in_s)
            self.incarnation += 1

    def set_not_before(self, event_id: str, text: str) -> None:
        with self.lock:
            self.events[event_id].not_before = text
            self.incarnation += 1

    def remove(self, event_id: str) -> None:
        """Cancelled by Azure, or over: gone from the document."""
        with self.lock:
            self.events.pop(event_id, None)
            self.incarnation += 1

    def answer_next(self, status: int, body: bytes, times: int = 1) -> None:
        with self.lock:
            self._next_answers.extend([(status, body)] * times)

    def document_gets(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path == EVENTS_PATH]

    def approvals_of(self, event_id: str) -> list[Approval]:
        return [a for a in self.approvals if event_id in a.event_ids]

    # ------------------------------------------------------------------ serving
    def _document(self) -> bytes:
        with self.lock:
            events = [e.document() for e in self.events.values()]
            incarnation = self.incarnation
        return json.dumps({"DocumentIncarnation": incarnation, "Events": events}).encode()

    def _throttled(self, now: float) -> bool:
        if self.rate_limit is None:
            return False
        with self.lock:
            self._recent = [t for t in self._recent if now - t < 1.0] + [now]
            return len(self._recent) > self.rate_limit


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class _AzureHandler(QuietHandler):
    server: Any

    @property
    def fake(self) -> FakeAzureMetadata:
        return self.server.owner  # type: ignore[no-any-return]

    def _request(self, method: str) -> Request | None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        request = Request(method, parts.path, parse_qs(parts.query), dict(self.headers.items()), body,
                          time.time())
        fake = self.fake
        fake.requests.append(request)
        if self.headers.get("Metadata") != "true" or self.headers.get("X-Forwarded-For") is not None:
            self.reply(400, _error("Bad request. Required metadata header not specified"))
            return None
        if fake._throttled(request.at):
            self.reply(429, _error("Too many requests"))
            return None
        return request

    def do_GET(self) -> None:
        request = self._request("GET")
        if request is None:
            return
        version = (request.query.get("api-version") or [""])[0]
        if request.path == EVENTS_PATH:
            self._events(version)
        elif request.path.startswith(COMPUTE_PATH):
            self._compute_item(request.path.removeprefix(COMPUTE_PATH), version, request.query)
        else:
            self.reply(404, _error("Not found"))

    def _events(self, version: str) -> None:
        fake = self.fake
        if version not in SCHEDULED_EVENTS_VERSIONS:
            self.reply(400, _error(BAD_VERSION))
            return
        if not fake.enabled:
            fake.enabled = True
            if fake.enable_delay_s:
                time.sleep(fake.enable_delay_s)  # "a delayed response in your first call"
            if fake.enable_gate is not None:
                fake.enable_gate.wait(MAX_ENABLE_S)  # as long as the test says
        with fake.lock:
            injected = fake._next_answers.pop(0) if fake._next_answers else None
        if injected is not None:
            self.reply(injected[0], injected[1])
            return
        self.reply(200, fake._document())

    def _compute_item(self, item: str, version: str, query: dict[str, list[str]]) -> None:
        fake = self.fake
        if version not in INSTANCE_VERSIONS:
            self.reply(400, _error(BAD_VERSION))
            return
        values = {"name": fake.vm_name, "priority": fake.priority}
        if item not in values:
            self.reply(404, _error("Not found"))
            return
        if (query.get("format") or [""])[0] != "text":  # a leaf needs format=text
            self.reply(400, _error("Bad request. Leaf nodes require format=text"))
            return
        self.reply(200, values[item].encode(), "text/plain; charset=utf-8")

    def do_POST(self) -> None:
        request = self._request("POST")
        if request is None:
            return
        fake = self.fake
        version = (request.query.get("api-version") or [""])[0]
        if request.path != EVENTS_PATH or version not in SCHEDULED_EVENTS_VERSIONS:
            self.reply(400, _error("Bad request."))
            return
        ids = _start_requests(request.body)
        with fake.lock:
            known = ids is not None and bool(ids) and all(i in fake.events for i in ids)
        if not known or ids is None:
            self.reply(400, _error("Bad request. Invalid StartRequests"))
            return
        approval = Approval(ids, request.at)
        if fake.approval_hook is not None:
            approval.hook_result = fake.approval_hook(ids)
        with fake.lock:
            fake.approvals.append(approval)
            for event_id in ids:  # approved: it starts
                fake.events[event_id].status, fake.events[event_id].not_before = "Started", ""
            fake.incarnation += 1
        self.reply(200, b"")


def _start_requests(body: str) -> list[str] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    requests = data.get("StartRequests") if isinstance(data, dict) else None
    if not isinstance(requests, list):
        return None
    ids = [r.get("EventId") for r in requests if isinstance(r, dict)]
    return [i for i in ids if isinstance(i, str)] if len(ids) == len(requests) else None

