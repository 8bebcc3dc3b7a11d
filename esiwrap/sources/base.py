"""The `Source` protocol every deadline source implements, and the `SourceSetup` each is built from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

from esiwrap.core.values import Deadline


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
    """What a source module's `build` gets (`esiwrap.sources.registry`).

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
