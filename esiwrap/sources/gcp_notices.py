"""Preemption and host-maintenance notices from the Compute Engine metadata server: the `gcp` source.

    GET /computeMetadata/v1/instance/preempted          FALSE | TRUE
    GET /computeMetadata/v1/instance/maintenance-event  NONE | MIGRATE_ON_HOST_MAINTENANCE
                                                        | TERMINATE_ON_HOST_MAINTENANCE
    GET /computeMetadata/v1/instance/scheduling/provisioning-model  SPOT | STANDARD (capacity, once;
        else scheduling/preemptible TRUE | FALSE)

Every request carries `Metadata-Flavor: Google`. `preempted` turns TRUE when a Spot or
preemptible VM is preempted: the VM is stopped 30 s later, so the deadline is when TRUE was first
seen + 30 s. `maintenance-event` turns TERMINATE_ON_HOST_MAINTENANCE ahead of a host maintenance
that stops the VM (Google: 60 s ahead, an hour for GPU VMs): first seen + `--gcp-maintenance-notice`
(60 s). MIGRATE_ON_HOST_MAINTENANCE is a live migration: training goes on, no deadline. A value
that goes back (FALSE, NONE) withdraws the deadline.

`preempted` is read with the server's hanging GET (`?wait_for_change=true&last_etag=…&timeout_sec=2`):
the answer comes the moment the value changes, and every 2 s otherwise, when `maintenance-event`
is read too. A server that does not hang answers at once and is asked again after a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NoReturn

from esiwrap.core.values import CapacityKind, Deadline
from esiwrap.errors import SourceUnavailable
from esiwrap.sources.metadata import MetadataClient, MetadataError, MetadataUnreachable, Reply, Timeouts

INSTANCE = "/computeMetadata/v1/instance/"
PREEMPTED_PATH = INSTANCE + "preempted"
MAINTENANCE_PATH = INSTANCE + "maintenance-event"
PROVISIONING_MODEL_PATH = INSTANCE + "scheduling/provisioning-model"
PREEMPTIBLE_PATH = INSTANCE + "scheduling/preemptible"
PREEMPTION_NOTICE_S = 30.0
MAINTENANCE_NOTICE_S = 60.0
HANG_S = 2  # timeout_sec of the hanging GET: how late a maintenance notice can be read
MIN_ROUND_S = 1.0  # one round of requests at most this often (a server that answers at once)
CAPACITY_ATTEMPTS = 3  # the capacity is worth a few tries, not two more requests every round
TERMINATING = "TERMINATE_ON_HOST_MAINTENANCE"
MAINTENANCE_VALUES = frozenset({"NONE", "MIGRATE_ON_HOST_MAINTENANCE", TERMINATING})
# Before a first value was read, these answers mean another service sits at the address.
NOT_GCP_STATUSES = frozenset({401, 403, 404})


@dataclass(frozen=True)
class Notice:
    item: str  # preempted | maintenance-event
    value: str
    notice_s: float


class GcpSource:
    name = "gcp"

    def __init__(self, metadata: MetadataClient, *, maintenance_notice_s: float = MAINTENANCE_NOTICE_S,
                 max_backoff_s: float = 300.0, hang_s: int = HANG_S) -> None:
        self.metadata = metadata
        self.maintenance_notice_s = maintenance_notice_s
        self.capacity: CapacityKind | None = None
        self._max_backoff_s = max_backoff_s
        self._hang_s = hang_s
        self._period_s = MIN_ROUND_S
        self._backoff_s = MIN_ROUND_S  # grows while nothing (or not a GCE server) answers
        self._etag = ""  # of `preempted`, for the next hanging GET
        self._answered = False  # a value was read: this is a GCE metadata server
        self._first_seen: dict[str, float] = {}  # item -> when its notice was first seen
        self._withdrawal_due = False  # a notice went away and that was not said yet
        self._capacity_tries = 0

    @property
    def period_s(self) -> float | None:
        return self._period_s

    def resolve(self, now: float) -> Deadline:
        started = time.monotonic()
        self._period_s = MIN_ROUND_S  # after a failed answer: the next round in a second
        try:
            preempted = self._preempted()
            maintenance = self._value(MAINTENANCE_PATH)
            self._learn_capacity()
        except MetadataUnreachable as exc:
            self._back_off()
            msg = f"metadata service unreachable, not on {self.metadata.dialect.where}? ({exc})"
            raise SourceUnavailable(msg, expected=True) from None
        elapsed = time.monotonic() - started
        self._period_s = max(0.05, MIN_ROUND_S - elapsed)  # a hang that waited is renewed at once
        self._backoff_s = MIN_ROUND_S
        self._answered = True
        # The values are as of the end of this round (a hanging GET returns when one changes).
        return self._deadline(preempted, maintenance, now + elapsed)

    # ------------------------------------------------------------------ reading
    def _preempted(self) -> str:
        path = PREEMPTED_PATH
        timeouts = None
        if self._etag:
            path += f"?wait_for_change=true&last_etag={self._etag}&timeout_sec={self._hang_s}"
            timeouts = self.metadata.timeouts.reading_for(self._hang_s + 3.0)
        reply = self._read(path, "preempted", timeouts)
        self._etag = reply.headers.get("etag", "").strip()
        return reply.body.strip()

    def _value(self, path: str) -> str:
        return self._read(path, path.removeprefix(INSTANCE), None).body.strip()

    def _read(self, path: str, item: str, timeouts: Timeouts | None) -> Reply:
        try:
            reply = self.metadata.read(path, timeouts)
        except MetadataError as exc:
            self._etag = ""  # the next round reads plainly
            what = str(exc).replace(path, path.partition("?")[0])  # the reason must not vary with the ETag
            if not self._answered and exc.status in NOT_GCP_STATUSES:
                self._not_gcp(what)
            raise SourceUnavailable(f"instance/{item} failed: {what}") from None
        if reply is None:
            if not self._answered:
                self._not_gcp(f"{self.metadata.base_url}{path} answered HTTP 404")
            raise SourceUnavailable(f"instance/{item} does not exist (HTTP 404)")
        return reply

    def _back_off(self) -> None:
        self._backoff_s = min(self._max_backoff_s, self._backoff_s * 2)
        self._period_s = self._backoff_s

    def _not_gcp(self, what: str) -> NoReturn:
        self._back_off()
        msg = f"not a Compute Engine metadata server, not on {self.metadata.dialect.where}? ({what})"
        raise SourceUnavailable(msg, expected=True)

    def _learn_capacity(self) -> None:
        """SPOT/preemptible or STANDARD, from the scheduling items (asked until one answers)."""
        if self.capacity is not None or self._capacity_tries >= CAPACITY_ATTEMPTS:
            return
        self._capacity_tries += 1
        try:
            model = (self.metadata.get(PROVISIONING_MODEL_PATH) or "").strip().upper()
            if model in ("SPOT", "STANDARD"):
                self.capacity = "spot" if model == "SPOT" else "on-demand"
                return
            preemptible = (self.metadata.get(PREEMPTIBLE_PATH) or "").strip().upper()
        except MetadataError:
            return
        if preemptible in ("TRUE", "FALSE"):
            self.capacity = "spot" if preemptible == "TRUE" else "on-demand"

    # ------------------------------------------------------------------ deciding
    def _deadline(self, preempted: str, maintenance: str, seen: float) -> Deadline:
        problems: list[str] = []
        notices: list[Notice] = []
        if preempted == "TRUE":
            notices.append(Notice("preempted", preempted, PREEMPTION_NOTICE_S))
        elif preempted != "FALSE":
            problems.append(f"instance/preempted answered {preempted[:60]!r}, not TRUE or FALSE")
        if maintenance == TERMINATING:
            notices.append(Notice("maintenance-event", maintenance, self.maintenance_notice_s))
        elif maintenance not in MAINTENANCE_VALUES:
            problems.append(f"instance/maintenance-event answered {maintenance[:60]!r}, not one of "
                            f"{', '.join(sorted(MAINTENANCE_VALUES))}")
        readable = {"preempted"} if preempted in ("TRUE", "FALSE") else set()
        readable |= {"maintenance-event"} if maintenance in MAINTENANCE_VALUES else set()
        gone = (set(self._first_seen) & readable) - {n.item for n in notices}
        for item in gone:  # answered: no notice any more
            del self._first_seen[item]
        self._withdrawal_due |= bool(gone)
        if notices:
            self._withdrawal_due = False  # the deadline that remains replaces the one withdrawn
            return min((self._notice_deadline(n, seen, problems) for n in notices), key=lambda d: d.at)
        if problems:  # unreadable: the last known deadline stands
            raise SourceUnavailable("; ".join(problems))
        if self._withdrawal_due:
            self._withdrawal_due = False
            msg = f"the notice is withdrawn: preempted={preempted}, maintenance-event={maintenance}"
            raise SourceUnavailable(msg, expected=True, withdrawn=True)
        if maintenance == "MIGRATE_ON_HOST_MAINTENANCE":
            raise SourceUnavailable("live migration announced (MIGRATE_ON_HOST_MAINTENANCE): training goes "
                                    "on, no deadline", expected=True)
        raise SourceUnavailable("no preemption or maintenance notice", expected=True)

    def _notice_deadline(self, notice: Notice, seen: float, problems: list[str]) -> Deadline:
        first = self._first_seen.setdefault(notice.item, seen)
        detail = {"notice": f"instance/{notice.item}={notice.value}",
                  "assumed": f"first seen + {notice.notice_s:g}s"}
        if problems:
            detail["also"] = "; ".join(problems)
        capacity: CapacityKind | None = "spot" if notice.item == "preempted" else self.capacity
        return Deadline(at=first + notice.notice_s, source=self.name, raw=f"{notice.item}={notice.value}",
                        detail=detail, capacity=capacity)
