"""The values the decision core reasons with: a deadline, the answer a source gave, the
capacity's kind. The deadline sources (`esiwrap.sources`) make them; the core, the shell and the
tools read them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeGuard, get_args

from esiwrap.times import iso_utc

# What kind of capacity the run is on, as far as a source can tell; it sets how often an
# interruption with no warning is expected (`policy.interruption_rate`):
#   spot       preemptible: taken back whenever the cloud needs it (a notice of seconds to minutes)
#   reserved   a reservation with a known end: a time slot, a capacity block, a batch job's limit
#   on-demand  an ordinary instance: no end, no preemption
CapacityKind = Literal["spot", "reserved", "on-demand"]



@dataclass(frozen=True)
class Deadline:
    """When the capacity goes away, as wall-clock epoch seconds (UTC).

    `at` already includes any per-source lead (SageMaker capacity blocks start terminating
    30 minutes before their end time); `raw` is what the source said, for the log.
    """

    at: float
    source: str
    raw: str = ""
    lead_s: float = 0.0
    detail: dict[str, str] = field(default_factory=dict, compare=False)
    capacity: CapacityKind | None = None  # the kind of capacity this end belongs to, if known

    def iso(self) -> str:
        return iso_utc(self.at)


OVERRIDING_SOURCES = frozenset({"cli"})


@dataclass(frozen=True)
class Answer:
    """What one source said: a deadline, or the reason it could not say."""

    source: str
    deadline: Deadline | None = None
    reason: str = ""
    expected: bool = False  # the source does not apply here; not worth a warning
    withdrawn: bool = False  # forget what this source said (a node that left, an event cancelled)
    capacity: CapacityKind | None = None  # what the source knows of the capacity's kind
    early_warning: str = ""  # not a deadline: a risk that asks for a save now (EC2 rebalance), why
    notice_s: float | None = None  # the source can see the cloud's notice now, this long before the end


CAPACITY_KINDS: frozenset[str] = frozenset(get_args(CapacityKind))


NODE_PREFIX = "node:"  # the source of a Ray node's answer: node:<short id>/<source>


def notice_or_none(value: Any) -> float | None:
    """A notice in seconds, or None for anything that is not a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return float(value)



def winner(answers: Iterable[Answer]) -> Deadline | None:
    """The deadline that rules: an overriding source if one answered, else the earliest."""
    known = [a.deadline for a in answers if a.deadline is not None]
    overriding = [d for d in known if d.source in OVERRIDING_SOURCES]
    pool = overriding or known
    return min(pool, key=lambda d: d.at) if pool else None


class Checkpoint(NamedTuple):
    """A completed save: the step it holds, the wall time it completed (acknowledged), and where
    the trainer wrote it ("" when it named no path). (The boundary it was taken at, from which
    work is at risk, is `Observations.checkpoint_at`.)"""

    step: int
    completed_at: float
    path: str = ""


def finite_number(value: object) -> TypeGuard[float]:
    """A real, finite number (not a bool, not NaN or infinity): what a time or a duration read
    from JSON (a state file, a manifest) must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
