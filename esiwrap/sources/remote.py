"""Answers from other machines: a Ray cluster's nodes, each asking its own sources.

An answer travels as plain fields (a Ray call's result, then a channel datagram from the driver
to esiwrap), so it is checked again where it arrives: the source must name a node (`node:` —
no remote answer may pose as `--deadline`, which overrides the others), the time must be
plausible where it arrives (`bounds`, as for every source), the detail plain strings. What does
not pass is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

from esiwrap.core.values import CAPACITY_KINDS, NODE_PREFIX, Answer, CapacityKind, Deadline, notice_or_none
from esiwrap.times import implausible

SHORT_ID_CHARS = 8  # of Ray's 56 hex digits: enough to tell a cluster's nodes apart in a log


def node_source(node_id: str, source: str = "") -> str:
    """`node:<short id>/<source>`, or `node:<short id>` for the node as a whole."""
    name = f"{NODE_PREFIX}{node_id[:SHORT_ID_CHARS]}"
    return f"{name}/{source}" if source else name


def to_fields(answer: Answer) -> dict[str, Any]:
    fields: dict[str, Any] = {"source": answer.source, "reason": answer.reason,
                              "expected": answer.expected, "withdrawn": answer.withdrawn,
                              "capacity": answer.capacity, "early_warning": answer.early_warning,
                              "notice_s": answer.notice_s}
    d = answer.deadline
    if d is not None:
        fields.update(at=d.at, raw=d.raw, lead_s=d.lead_s, detail=dict(d.detail))
    return fields


def from_fields(fields: Mapping[str, Any], now: float) -> Answer | None:
    """The answer the fields describe, or None when they are not a valid node's answer (at
    wall time `now`)."""
    source = fields.get("source")
    if not isinstance(source, str) or not source.startswith(NODE_PREFIX) or len(source) > 200:
        return None
    reason = _text(fields.get("reason"))
    if fields.get("withdrawn") is True:
        return Answer(source, reason=reason, withdrawn=True)
    capacity = _capacity(fields.get("capacity"))
    warning = _text(fields.get("early_warning"))  # a node at risk (EC2 rebalance): a save for the job
    notice = notice_or_none(fields.get("notice_s"))  # a node that does not say has no notice watched
    at = fields.get("at")
    if at is None:
        return Answer(source, reason=reason or "no answer", expected=fields.get("expected") is True,
                      capacity=capacity, early_warning=warning, notice_s=notice)
    if implausible(at, now) is not None:
        return None
    lead = fields.get("lead_s", 0.0)
    detail = fields.get("detail")
    deadline = Deadline(
        at=float(at), source=source, raw=_text(fields.get("raw")),
        lead_s=float(lead) if isinstance(lead, (int, float)) and math.isfinite(lead) else 0.0,
        detail={str(k): str(v)[:500] for k, v in detail.items()} if isinstance(detail, dict) else {},
    )
    return Answer(source, deadline=deadline, capacity=capacity, early_warning=warning, notice_s=notice)


def _capacity(value: Any) -> CapacityKind | None:
    return cast("CapacityKind", value) if isinstance(value, str) and value in CAPACITY_KINDS else None


def _text(value: Any) -> str:
    return value[:500] if isinstance(value, str) else ""
