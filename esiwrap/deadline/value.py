"""The `Deadline` value, the `Source` protocol every deadline source implements, and the
`SourceSetup` every source is built from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

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


def iso_utc(epoch_s: float, timespec: Literal["milliseconds", "seconds"] = "milliseconds") -> str:
    """Epoch seconds as ISO-8601 UTC, e.g. 2026-11-30T02:15:11.123Z (`timespec="seconds"`:
    2026-11-30T02:15:11Z): the one way esiwrap writes a moment (logs, reports, systemd status).

    Never raises: a value with no calendar date between the years 1 and 9999 (or not a number)
    is written as `epoch <value>`.
    """
    moment = utc_datetime(epoch_s)
    if moment is None:
        return f"epoch {epoch_s!r}"
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def iso_epoch(timestamp: str) -> float:
    """Epoch seconds of an ISO-8601 timestamp, as `iso_utc` writes it (a log read back); a naive
    time is UTC. ValueError for anything else. (A deadline a person typed is `parse.parse_iso`:
    stricter, with messages that say how to fix it.)"""
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    except (OverflowError, TypeError, AttributeError) as exc:
        raise ValueError(str(exc)) from None


def utc_datetime(epoch_s: float) -> datetime | None:
    """The UTC moment, or None where `datetime` (years 1..9999) or the platform cannot hold it."""
    try:
        return datetime.fromtimestamp(epoch_s, tz=timezone.utc)
    except (OverflowError, OSError, ValueError, TypeError):
        return None


@runtime_checkable
class Source(Protocol):
    """A place that may know the deadline.

    `resolve` either returns a `Deadline` or raises `SourceUnavailable` with a reason a person
    can act on. It may block on I/O (the supervisor calls it off its loop), and it must bound
    its own time. `period_s` is how often it is worth asking again (None: its answer cannot
    change during this run, e.g. a command-line flag or our own environment).

    A source may also have a `capacity` attribute (a `CapacityKind` or None): what it learned
    about the kind of capacity, also when it has no deadline to give (a spot instance with no
    notice yet). `chain.ask` reads it after every `resolve`. Likewise an `early_warning` attribute
    (a str, "" for none): a risk that is not a deadline but asks for a save now, in words that
    change when the warning is a new one (EC2's rebalance recommendation with its noticeTime).

    And a `release()` method: called once, when esiwrap exits after a completed checkpoint with
    the child's tree gone, so the source may let its platform proceed (Azure: approve the
    scheduled event). It returns what it did for the log (None: nothing), bounds its own time
    and raises `SourceUnavailable` when it failed.
    """

    name: str

    @property
    def period_s(self) -> float | None: ...

    def resolve(self, now: float) -> Deadline: ...


class SourceSetup(NamedTuple):
    """What a source module's `build` gets (`esiwrap.deadline.registry`).

    `values` holds every resolved source option by its `Option.dest` (a module reads its own, e.g.
    `setup.values[METADATA_URL.dest]`); `deadline` and `refresh_s` are the general ones
    (`--deadline`, `--refresh`); `anchor` is the launch time (`+2h` counts from it); `shared` is
    one dict for the whole `--sources` list, for what a module's sources share (one metadata
    client for `volcengine` and `volcengine-spot`: one token). `explain`: build a source also
    where it cannot apply, to say why (`esiwrap deadline`); a run leaves such a source out.
    """

    values: Mapping[str, Any]
    environ: Mapping[str, str]
    anchor: float
    deadline: str | None
    refresh_s: float
    shared: dict[str, Any]
    explain: bool = False
