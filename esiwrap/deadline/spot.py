"""Sources `volcengine-spot` and `aws-spot`: a spot interruption notice is a deadline.

Both clouds publish the notice in the instance metadata and answer 404 while there is none:

* Volcengine: `/latest/spot_instance_termination_time`, a time; about 5 minutes of warning.
* AWS: `/latest/meta-data/spot/instance-action`, `{"action": "terminate", "time": "...Z"}`;
  2 minutes of warning (AWS recommends polling every 5 s).

Polled every `SPOT_POLL_S`. A notice whose time cannot be read still counts: the deadline is then
the moment the notice was first seen plus the cloud's documented warning, never later than the
time it states. When the metadata service is unreachable the period backs off (doubling up to
`--refresh`), so a machine without that cloud is not probed every 5 s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from esiwrap.deadline.metadata import MetadataClient, MetadataError, MetadataUnreachable
from esiwrap.deadline.parse import TimeParseError, parse_when
from esiwrap.deadline.value import Deadline
from esiwrap.errors import SourceUnavailable

SPOT_POLL_S = 5.0
VOLCENGINE_SPOT_PATH = "/latest/spot_instance_termination_time"
AWS_SPOT_PATH = "/latest/meta-data/spot/instance-action"
VOLCENGINE_NOTICE_S = 300.0
AWS_NOTICE_S = 120.0

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


@dataclass
class SpotNoticeSource:
    name: str
    metadata: MetadataClient
    path: str
    read_notice: NoticeReader
    notice_s: float  # the cloud's documented warning time
    max_backoff_s: float = 300.0
    poll_s: float = SPOT_POLL_S
    _first_seen: float | None = field(default=None, init=False)
    _period_s: float = field(default=SPOT_POLL_S, init=False)

    @property
    def period_s(self) -> float | None:
        return self._period_s

    def resolve(self, now: float) -> Deadline:
        try:
            body = self.metadata.get(self.path)
        except MetadataUnreachable as exc:
            self._period_s = min(self.max_backoff_s, max(self.poll_s, self._period_s * 2))
            msg = f"metadata service unreachable, not on {self.metadata.dialect.where}? ({exc})"
            raise SourceUnavailable(msg, expected=True) from None
        except MetadataError as exc:
            self._period_s = self.poll_s
            raise SourceUnavailable(f"metadata service failed: {exc}") from None
        self._period_s = self.poll_s
        if body is None or not body.strip():
            self._first_seen = None
            raise SourceUnavailable("no spot interruption notice", expected=True)
        return self._notice(body, now)

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
                            max_backoff_s)
