"""Sources `volcengine-spot` and `aws-spot`: a spot interruption notice is a deadline.

Both clouds publish the notice in the instance metadata and answer 404 while there is none:

* Volcengine: `/latest/spot_instance_termination_time`, a time; about 5 minutes of warning.
* AWS: `/latest/meta-data/spot/instance-action`, `{"action": "terminate", "time": "...Z"}`;
  2 minutes of warning (AWS recommends polling every 5 s).

Polled every `SPOT_POLL_S`. A notice whose time cannot be read still counts: the deadline is then
the moment the notice was first seen plus the cloud's documented warning, never later than the
time it states. When the metadata service is unreachable the period backs off (doubling up to
`--refresh`), so a machine without that cloud is not probed every 5 s.

`aws-spot` also reads, on every poll, the rebalance recommendation
(`/latest/meta-data/events/recommendations/rebalance`, `{"noticeTime": "...Z"}`, 404 while there
is none): the instance is at elevated risk of interruption. It is no deadline; it is this source's
`early_warning`, which asks for a save now. And once, `/latest/meta-data/instance-life-cycle`
(spot, on-demand, scheduled, capacity-block): the capacity's kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from esiwrap.core.values import CapacityKind, Deadline
from esiwrap.errors import SourceUnavailable
from esiwrap.sources.metadata import MetadataClient, MetadataError, MetadataUnreachable
from esiwrap.times import TimeParseError, parse_when

SPOT_POLL_S = 5.0
VOLCENGINE_SPOT_PATH = "/latest/spot_instance_termination_time"
AWS_SPOT_PATH = "/latest/meta-data/spot/instance-action"
VOLCENGINE_NOTICE_S = 300.0
AWS_NOTICE_S = 120.0
AWS_REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
AWS_LIFE_CYCLE_PATH = "/latest/meta-data/instance-life-cycle"
AWS_LIFE_CYCLES: dict[str, CapacityKind] = {"spot": "spot", "on-demand": "on-demand",
                                            "scheduled": "reserved", "capacity-block": "reserved"}
CAPACITY_ATTEMPTS = 3  # the capacity is worth a few tries, not one more request every poll

# (body) -> (time text or "", extra detail); raises ValueError when the body is not a notice at all
NoticeReader = Callable[[str], tuple[str, dict[str, str]]]


def read_volcengine_notice(body: str) -> tuple[str, dict[str, str]]:
    return body.strip(), {}


def read_aws_notice(body: str) -> tuple[str, dict[str, str]]:
    try:
        data = json.loads(body)
    except ValueError:
        return "", {}
    if not isinstance(data, dict):
        return "", {}
    return str(data.get("time") or ""), {"action": str(data.get("action") or "")}


def read_aws_rebalance(body: str) -> str:
    """The early warning a rebalance recommendation gives, in words that change with its noticeTime."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    notice_time = data.get("noticeTime") if isinstance(data, dict) else None
    said = f"noticeTime {notice_time.strip()[:40]}" if isinstance(notice_time, str) and notice_time.strip() \
        else repr(" ".join(body.split())[:80])
    return f"EC2 rebalance recommendation ({said}): elevated risk of a spot interruption"


@dataclass(frozen=True)
class SpotExtras:
    """What a cloud's metadata says beside the notice: an early warning (EC2's rebalance
    recommendation) read on every poll, and the capacity's kind (instance-life-cycle), read once."""

    warning_path: str | None = None
    read_warning: Callable[[str], str] | None = None
    capacity_path: str | None = None
    capacities: dict[str, CapacityKind] = field(default_factory=dict)


AWS_EXTRAS = SpotExtras(AWS_REBALANCE_PATH, read_aws_rebalance, AWS_LIFE_CYCLE_PATH, AWS_LIFE_CYCLES)


@dataclass
class SpotNoticeSource:
    name: str
    metadata: MetadataClient
    path: str
    read_notice: NoticeReader
    notice_s: float  # the cloud's documented warning time
    max_backoff_s: float = 300.0
    poll_s: float = SPOT_POLL_S
    extras: SpotExtras = field(default_factory=SpotExtras)
    capacity: CapacityKind | None = field(default=None, init=False)
    early_warning: str = field(default="", init=False)
    _first_seen: float | None = field(default=None, init=False)
    _period_s: float = field(default=SPOT_POLL_S, init=False)
    _capacity_tries: int = field(default=0, init=False)
    _watching: bool = field(default=False, init=False)  # the last poll reached the metadata service

    @property
    def period_s(self) -> float | None:
        return self._period_s

    @property
    def watching_notice_s(self) -> float | None:
        """The warning this source gives while it can see a notice: the cloud's, less one poll
        period (the notice may come just after a poll); None while the metadata is unreachable."""
        return max(0.0, self.notice_s - self.poll_s) if self._watching else None

    def resolve(self, now: float) -> Deadline:
        try:
            body = self.metadata.get(self.path)
        except MetadataUnreachable as exc:
            self._watching = False
            self._period_s = min(self.max_backoff_s, max(self.poll_s, self._period_s * 2))
            msg = f"metadata service unreachable, not on {self.metadata.dialect.where}? ({exc})"
            raise SourceUnavailable(msg, expected=True) from None
        except MetadataError as exc:
            self._watching = False
            self._period_s = self.poll_s
            raise SourceUnavailable(f"metadata service failed: {exc}") from None
        self._period_s = self.poll_s
        self._watching = True
        self._read_extras()
        if body is None or not body.strip():
            self._first_seen = None
            raise SourceUnavailable("no spot interruption notice", expected=True)
        return self._notice(body, now)

    def _read_extras(self) -> None:
        """The early warning and the capacity; their failures cost nothing but their news (the
        notice, read just before, is what matters, and its failures are the ones reported)."""
        extras = self.extras
        try:
            if extras.capacity_path and self.capacity is None and self._capacity_tries < CAPACITY_ATTEMPTS:
                self._capacity_tries += 1
                kind = self.metadata.get(extras.capacity_path)
                self.capacity = extras.capacities.get((kind or "").strip().lower())
            if extras.warning_path and extras.read_warning is not None:
                warning = self.metadata.get(extras.warning_path)
                self.early_warning = extras.read_warning(warning) if warning and warning.strip() else ""
        except (MetadataError, MetadataUnreachable):
            return  # asked again at the next poll; a warning already seen stands until then

    def _notice(self, body: str, now: float) -> Deadline:
        if self._first_seen is None:
            self._first_seen = now
        latest = self._first_seen + self.notice_s
        text, detail = self.read_notice(body)
        detail["notice"] = body.strip()[:200]
        try:
            stated = parse_when(text, now) if text else None
        except TimeParseError as exc:
            stated, detail["time_error"] = None, str(exc)
        if self.early_warning:
            detail["early_warning"] = self.early_warning
        if stated is None:
            detail["assumed"] = f"first seen + {self.notice_s:g}s (the notice's time is unreadable)"
            return Deadline(at=latest, source=self.name, raw=text or body.strip()[:200], detail=detail,
                            capacity="spot")
        return Deadline(at=min(stated, latest), source=self.name, raw=text, detail=detail, capacity="spot")


def volcengine_spot(metadata: MetadataClient, max_backoff_s: float) -> SpotNoticeSource:
    return SpotNoticeSource("volcengine-spot", metadata, VOLCENGINE_SPOT_PATH, read_volcengine_notice,
                            VOLCENGINE_NOTICE_S, max_backoff_s)


def aws_spot(metadata: MetadataClient, max_backoff_s: float) -> SpotNoticeSource:
    return SpotNoticeSource("aws-spot", metadata, AWS_SPOT_PATH, read_aws_notice, AWS_NOTICE_S,
                            max_backoff_s, extras=AWS_EXTRAS)
