"""Azure Scheduled Events for this VM, from the instance metadata service (IMDS): the `azure` source.

    GET  /metadata/instance/compute/name?api-version=2021-02-01&format=text      this VM's name (once)
    GET  /metadata/instance/compute/priority?api-version=2021-02-01&format=text  Spot | Regular (once)
    GET  /metadata/scheduledevents?api-version=2020-07-01                         the events, ~once a second
    POST /metadata/scheduledevents?api-version=2020-07-01                         approve (`--azure-ack`)

Every request carries `Metadata: true`. The document lists the events of every VM in the same
availability set or placement group, so only those whose `Resources` name this VM count; of
those, `Preempt` (Spot eviction, at least 30 s), `Terminate`, `Reboot`, `Redeploy` and `Freeze`
all interrupt training, and the earliest `NotBefore` (RFC 1123) is the deadline. An event with
an empty `NotBefore` has started: its deadline is when it was first seen so. An event that leaves
the document was cancelled by Azure or is over: the deadline is withdrawn.

The first request enables the service and may take up to two minutes to answer: it runs on this
source's own watcher thread with a long read timeout, so it holds up nothing else. After that
Microsoft recommends a poll once a second. Off Azure, 169.254.169.254 is unroutable (or is
another cloud's service): the poll backs off, doubling up to `--refresh`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn

from esiwrap.core.values import CapacityKind, Deadline
from esiwrap.errors import SourceUnavailable
from esiwrap.sources.metadata import MetadataClient, MetadataError, MetadataUnreachable

SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
VM_NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
PRIORITY_PATH = "/metadata/instance/compute/priority?api-version=2021-02-01&format=text"
POLL_S = 1.0
FIRST_CALL_READ_S = 130.0  # "expect a delayed response in your first call of up to two minutes"
# Microsoft's minimum notice per EventType: the deadline of an event whose NotBefore is unreadable
# is when it was first seen plus this (Terminate's notice is set per scale set: 5 to 15 minutes).
MINIMUM_NOTICE_S = {"Preempt": 30.0, "Terminate": 300.0, "Redeploy": 600.0, "Reboot": 900.0,
                    "Freeze": 900.0}
INTERRUPTING = frozenset(MINIMUM_NOTICE_S)
PRIORITY_ATTEMPTS = 3  # the capacity is worth a few tries, not one more request every second
PRIORITY_CAPACITY: dict[str, CapacityKind] = {"spot": "spot", "low": "spot", "regular": "on-demand"}
# Before a first document was read, these answers mean another service sits at the address
# (AWS's IMDS answers 401 or 404, GCP's 403 or 404): this is not an Azure VM.
NOT_AZURE_STATUSES = frozenset({401, 403, 404})


@dataclass(frozen=True)
class ScheduledEvent:
    event_id: str
    event_type: str
    status: str  # Scheduled | Started
    not_before: str  # RFC 1123, "" once started
    resources: tuple[str, ...]
    description: str = ""
    source: str = ""  # Platform | User
    duration_s: str = ""  # -1: unknown


class AzureSource:
    """Polled about once a second; re-reads nothing it already knows (the VM's name, priority)."""

    name = "azure"

    def __init__(self, metadata: MetadataClient, *, ack: bool = False, max_backoff_s: float = 300.0,
                 poll_s: float = POLL_S, first_call_read_s: float = FIRST_CALL_READ_S) -> None:
        self.metadata = metadata
        self.ack = ack
        self.capacity: CapacityKind | None = None
        self._max_backoff_s = max_backoff_s
        self._poll_s = poll_s
        self._first_call_read_s = first_call_read_s
        self._period_s = poll_s
        self._backoff_s = poll_s  # grows while nothing (or not Azure) answers
        self._enabled = False  # a document was read: the service answers at once from now on
        self._vm: str | None = None
        self._vm_trouble = ""  # why the name is unknown (then every event counts)
        self._priority_tries = 0
        self._started_at: dict[str, float] = {}  # event id -> first seen started (or unreadable)
        self._ours: tuple[ScheduledEvent, ...] = ()  # the interrupting events for this VM, last read
        self._incarnation = ""

    @property
    def period_s(self) -> float | None:
        return self._period_s

    def resolve(self, now: float) -> Deadline:
        self._period_s = self._poll_s  # after an answer, even a failed one: the next poll in a second
        try:
            self._learn_vm()
            body = self._document()
        except MetadataUnreachable as exc:
            self._back_off()
            msg = f"metadata service unreachable, not on {self.metadata.dialect.where}? ({exc})"
            raise SourceUnavailable(msg, expected=True) from None
        self._backoff_s = self._poll_s
        return self._deadline(self._events(body), now)

    # ------------------------------------------------------------------ reading
    def _learn_vm(self) -> None:
        """This VM's name (to pick its events) and priority (the capacity), once each. A name
        that cannot be read makes every event count: a wrong deadline costs an early save, a
        missed one the run."""
        if self._vm is None:
            try:
                name = self.metadata.get(VM_NAME_PATH)
            except MetadataError as exc:
                self._vm_trouble = str(exc)
                return
            if name is None or not name.strip():
                self._vm_trouble = f"{self.metadata.base_url} has no compute/name"
                return
            self._vm, self._vm_trouble = name.strip(), ""
        if self._priority_tries < PRIORITY_ATTEMPTS:
            self._priority_tries += 1
            try:
                priority = self.metadata.get(PRIORITY_PATH)
            except MetadataError:
                return  # asked again at the next poll, a few times
            self._priority_tries = PRIORITY_ATTEMPTS
            self.capacity = PRIORITY_CAPACITY.get((priority or "").strip().lower())

    def _document(self) -> str:
        """The Scheduled Events document's text; the first call may take its two minutes."""
        timeouts = None if self._enabled else self.metadata.timeouts.reading_for(self._first_call_read_s)
        try:
            reply = self.metadata.read(SCHEDULED_EVENTS_PATH, timeouts)
        except MetadataError as exc:
            if not self._enabled and exc.status in NOT_AZURE_STATUSES:
                self._not_azure(f"{exc}")
            raise SourceUnavailable(f"Scheduled Events failed: {exc}; asked again in a second") from None
        if reply is None:
            self._not_azure(f"{self.metadata.base_url}: no Scheduled Events (HTTP 404)")
        self._enabled = True
        return reply.body

    def _not_azure(self, what: str) -> NoReturn:
        self._back_off()
        msg = f"not an Azure metadata service, not on {self.metadata.dialect.where}? ({what})"
        raise SourceUnavailable(msg, expected=True)

    def _back_off(self) -> None:
        self._backoff_s = min(self._max_backoff_s, self._backoff_s * 2)
        self._period_s = self._backoff_s

    def _events(self, body: str) -> list[ScheduledEvent]:
        try:
            data = json.loads(body)
        except ValueError:
            raise SourceUnavailable(f"Scheduled Events answered unparsable JSON ({_excerpt(body)})") from None
        raw_events = data.get("Events") if isinstance(data, dict) else None
        if not isinstance(raw_events, list):
            msg = f"Scheduled Events answered a document without an Events list ({_excerpt(body)})"
            raise SourceUnavailable(msg)
        self._incarnation = str(data.get("DocumentIncarnation", ""))
        events = [_event(item) for item in raw_events]
        if None in events:
            msg = f"Scheduled Events answered an event without EventId or EventType ({_excerpt(body)})"
            raise SourceUnavailable(msg)
        return [e for e in events if e is not None]

    # ------------------------------------------------------------------ deciding
    def _deadline(self, events: list[ScheduledEvent], now: float) -> Deadline:
        ours = tuple(e for e in events if e.event_type in INTERRUPTING and self._affects_this_vm(e))
        gone = [e.event_id for e in self._ours if e.event_id not in {o.event_id for o in ours}]
        self._ours = ours
        self._started_at = {k: v for k, v in self._started_at.items() if k in {e.event_id for e in ours}}
        if not ours:
            if gone:
                msg = f"scheduled event {', '.join(gone)} is gone from the document: cancelled, or over"
                raise SourceUnavailable(msg, expected=True, withdrawn=True)
            where = f"this VM ({self._vm})" if self._vm else "any VM"
            raise SourceUnavailable(f"no scheduled event for {where}", expected=True)
        return min((self._deadline_of(e, now) for e in ours), key=lambda d: d.at)

    def _affects_this_vm(self, event: ScheduledEvent) -> bool:
        if self._vm is None:
            return True  # the name is unknown: every event might be ours
        return any(_same_vm(resource, self._vm) for resource in event.resources)

    def _deadline_of(self, event: ScheduledEvent, now: float) -> Deadline:
        detail = {"event_id": event.event_id, "event_type": event.event_type,
                  "event_status": event.status, "resources": ",".join(event.resources),
                  "description": event.description, "event_source": event.source,
                  "duration_s": event.duration_s, "incarnation": self._incarnation,
                  "vm": self._vm or f"unknown ({self._vm_trouble})"}
        capacity: CapacityKind | None = "spot" if event.event_type == "Preempt" else self.capacity
        if not event.not_before.strip() or event.status == "Started":
            at = self._started_at.setdefault(event.event_id, now)
            detail["assumed"] = "started: the deadline is when it was first seen started"
            return Deadline(at=at, source=self.name, raw=event.not_before or event.status, detail=detail,
                            capacity=capacity)
        at_or_none = _rfc1123(event.not_before)
        if at_or_none is None:
            notice = MINIMUM_NOTICE_S[event.event_type]
            at = self._started_at.setdefault(event.event_id, now) + notice
            detail["assumed"] = f"first seen + {notice:g}s, the minimum notice of {event.event_type} " \
                                "(NotBefore is unreadable)"
        else:
            at = at_or_none
        return Deadline(at=at, source=self.name, raw=event.not_before, detail=detail, capacity=capacity)

    # ------------------------------------------------------------------ --azure-ack
    def release(self) -> str | None:
        """`--azure-ack`, once the run is over with a complete checkpoint: approve this VM's
        scheduled events so a reboot or redeploy starts now instead of at NotBefore. An event
        that also names other VMs is left alone: approving it would start it for them too."""
        if not self.ack:
            return None
        pending = [e for e in self._ours if e.status != "Started" and e.not_before.strip()]
        mine = [e for e in pending if self._vm is not None
                and all(_same_vm(resource, self._vm) for resource in e.resources)]
        shared = [e.event_id for e in pending if e not in mine]
        left = f"; left alone (other VMs' too, or this VM unknown): {', '.join(shared)}" if shared else ""
        if not mine:
            return f"nothing approved{left}" if shared else None
        ids = [e.event_id for e in mine]
        body = json.dumps({"StartRequests": [{"EventId": event_id} for event_id in ids]})
        try:
            self.metadata.post(SCHEDULED_EVENTS_PATH, body)
        except (MetadataError, MetadataUnreachable) as exc:
            raise SourceUnavailable(f"approving scheduled event {', '.join(ids)}: {exc}") from None
        kinds = ", ".join(f"{e.event_id} ({e.event_type})" for e in mine)
        return f"approved scheduled event {kinds}{left}"


def _event(item: Any) -> ScheduledEvent | None:
    """One entry of Events, or None when it is not an event at all."""
    if not isinstance(item, dict):
        return None
    event_id, event_type = item.get("EventId"), item.get("EventType")
    if not isinstance(event_id, str) or not event_id or not isinstance(event_type, str):
        return None
    resources = item.get("Resources")
    names = tuple(r for r in resources if isinstance(r, str)) if isinstance(resources, list) else ()
    return ScheduledEvent(
        event_id=event_id, event_type=event_type, status=_text(item.get("EventStatus")),
        not_before=_text(item.get("NotBefore")), resources=names, description=_text(item.get("Description")),
        source=_text(item.get("EventSource")), duration_s=_text(item.get("DurationInSeconds")),
    )


def _same_vm(resource: str, vm: str) -> bool:
    """Resource names are VM names (before api-version 2017-08-01 with a leading underscore)."""
    return resource.strip().lstrip("_").lower() == vm.strip().lower()


def _rfc1123(text: str) -> float | None:
    """`Mon, 11 Apr 2022 22:26:58 GMT` as epoch seconds, or None."""
    try:
        moment = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # "-0000" parses naive: RFC 5322 says that is UTC
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _text(value: Any) -> str:
    return "" if value is None else str(value)[:500]


def _excerpt(body: str) -> str:
    text = " ".join(body.split())
    return repr(text[:60] + ("..." if len(text) > 60 else ""))

