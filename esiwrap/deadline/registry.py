"""The deadline sources by name: the modules that provide them, their options, and the ordered
list `--sources` names.

A source module (`local`, `slurm`, `volcengine`, `aws`, `azure`, `gcp`) declares, beside its sources:

    NAMES    the words of `--sources` it provides, e.g. ("aws-spot",)
    OPTIONS  its own run options (`esiwrap.optiontypes.Option`), e.g. `--aws-metadata-url`; read
             by the command line, `--help`, `ESIWRAP_<NAME>`, the systemd job file
    build(name, setup) -> [Source]   its sources for one name, from `SourceSetup` (the resolved
             options by `Option.dest`, the environment, the launch time)

A new platform is one such module and one entry in `SOURCE_MODULES`. Every `esiwrap` start reads
every module's `OPTIONS`, so a source module imports what is heavy (an SDK, `http.client`, the
metadata client) inside `build` or later, never at its top.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from esiwrap.deadline import aws, azure, gcp, local, slurm, volcengine
from esiwrap.deadline.local import CliSource
from esiwrap.deadline.value import Source, SourceSetup
from esiwrap.errors import UsageError
from esiwrap.optiontypes import Option


class SourceModule(Protocol):
    NAMES: tuple[str, ...]
    OPTIONS: tuple[Option, ...]

    def build(self, name: str, setup: SourceSetup) -> list[Source]: ...


SOURCE_MODULES: tuple[SourceModule, ...] = (local, slurm, volcengine, aws, azure, gcp)
BY_NAME: dict[str, SourceModule] = {name: module for module in SOURCE_MODULES for name in module.NAMES}
KNOWN_SOURCES = tuple(BY_NAME)
OPTIONS: tuple[Option, ...] = tuple(opt for module in SOURCE_MODULES for opt in module.OPTIONS)
# volcengine-spot is on by default: it asks the same metadata service as `volcengine`, so it adds
# no new address, and a spot notice is the shortest warning there is. aws-spot and azure are
# opt-in: on by default they would probe 169.254.169.254 from every machine of another cloud or
# none, every few minutes; gcp too: it would look up metadata.google.internal everywhere. slurm
# is on by default and costs nothing outside a Slurm job: it is only started where SLURM_JOB_ID
# is set.
DEFAULT_SOURCES = ("cli", "env", "slurm", "volcengine", "volcengine-spot")


def parse_source_names(text: str) -> list[str]:
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in BY_NAME]
    if unknown or not names:
        bad = ",".join(unknown) or repr(text)
        msg = f"--sources {bad}: unknown source; choose from {','.join(KNOWN_SOURCES)}, e.g. cli,env"
        raise UsageError(msg)
    return names


def build_sources(
    names: Sequence[str], values: Mapping[str, Any], environ: Mapping[str, str], anchor: float,
    *, explain: bool = False,
) -> list[Source]:
    """Sources in the order given, from the resolved source options (`esiwrap.options`:
    `deadline` and `refresh` and each module's own, by `Option.dest`). `--deadline` overrides
    discovery: then it is the only one. A module's sources are built, and its heavy parts
    imported, only when named: a run with local sources only starts without them. A module may
    build nothing where it cannot apply (slurm outside a Slurm job) unless `explain`
    (`esiwrap deadline`: every source named says why it has no answer)."""
    deadline = values["deadline"]
    if deadline is not None and "cli" in names:
        return [CliSource(deadline, anchor)]
    setup = SourceSetup(values, environ, anchor, deadline, values["refresh"], shared={}, explain=explain)
    return [source for name in names for source in BY_NAME[name].build(name, setup)]
