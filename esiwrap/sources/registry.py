"""The deadline sources by name: the modules that provide them, their options, and the ordered
list `--sources` names.

A source module (`local`, `slurm`, `volcengine`, `aws`, `azure`, `gcp`) declares, beside its sources:

    NAMES    the words of `--sources` it provides, e.g. ("aws-spot",): every name its sources
             report themselves as (`Answer.source`, what every output shows) is one of them
    OPTIONS  its own run options (`esiwrap.optiontypes.Option`), e.g. `--aws-metadata-url`; read
             by the command line, `--help`, `ESIWRAP_<NAME>`, the systemd job file
    build(name, setup) -> [Source]   its sources for one name, from `SourceSetup` (the resolved
             options by `Option.dest`, the environment, the launch time)

A new platform is one such module and one entry in `SOURCE_MODULES`. Every `esiwrap` start reads
every module's `OPTIONS`, so a source module imports what is heavy (an SDK, `http.client`, the
metadata client) inside `build` or later, never at its top.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from esiwrap.errors import UsageError
from esiwrap.optiontypes import Option, seconds
from esiwrap.sources import aws, azure, gcp, local, slurm, volcengine
from esiwrap.sources.base import Source, SourceSetup
from esiwrap.sources.local import CliSource
from esiwrap.times import parse_when


class SourceModule(Protocol):
    NAMES: tuple[str, ...]
    OPTIONS: tuple[Option, ...]

    def build(self, name: str, setup: SourceSetup) -> list[Source]: ...


SOURCE_MODULES: tuple[SourceModule, ...] = (local, slurm, volcengine, aws, azure, gcp)
BY_NAME: dict[str, SourceModule] = {name: module for module in SOURCE_MODULES for name in module.NAMES}
KNOWN_SOURCES = tuple(BY_NAME)
_SPELLED = {name.lower(): name for name in KNOWN_SOURCES}  # `--sources` is read in any case
OPTIONS: tuple[Option, ...] = tuple(opt for module in SOURCE_MODULES for opt in module.OPTIONS)
# volcengine-spot is on by default: it asks the same metadata service as `volcengine`, so it adds
# no new address, and a spot notice is the shortest warning there is. aws-spot and azure are
# opt-in: on by default they would probe 169.254.169.254 from every machine of another cloud or
# none, every few minutes; gcp too: it would look up metadata.google.internal everywhere. slurm
# is on by default and costs nothing outside a Slurm job: it is only started where SLURM_JOB_ID
# is set.
DEFAULT_SOURCES = ("cli", "env", "slurm", "volcengine", "volcengine-spot")


def parse_source_names(text: str) -> list[str]:
    """The names of a `--sources` list, each as its source reports itself (`env:mlp` is `env:MLP`),
    in order, each once."""
    given = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in given if name.lower() not in _SPELLED]
    names = list(dict.fromkeys(_SPELLED[name.lower()] for name in given if name.lower() in _SPELLED))
    if unknown or not names:
        bad = ",".join(unknown) or repr(text)
        msg = f"--sources {bad}: unknown source; choose from {','.join(KNOWN_SOURCES)}, e.g. cli,env"
        raise UsageError(msg)
    return names


def build_sources(
    names: Sequence[str], values: Mapping[str, Any], environ: Mapping[str, str], anchor: float,
    *, explain: bool = False,
) -> list[Source]:
    """Sources in the order given, from the resolved source options (`esiwrap.cli.options`:
    `deadline` and `refresh` and each module's own, by `Option.dest`). `--deadline` overrides
    discovery: then it is the only one. A module's sources are built, and its heavy parts
    imported, only when named: a run with local sources only starts without them. A module may
    build nothing where it cannot apply (slurm outside a Slurm job) unless `explain`
    (`esiwrap deadline`: every source named says why it has no answer)."""
    deadline = values["deadline"]
    if deadline is not None and "cli" in names:
        return [CliSource(deadline, anchor)]
    setup = SourceSetup(values, environ, anchor, deadline, values["refresh"], shared={}, explain=explain)
    sources: dict[str, Source] = {}  # `env,env:MLP` asks the variable once
    for name in names:
        for source in BY_NAME[name].build(name, setup):
            sources.setdefault(source.name, source)
    return list(sources.values())


# ---------------------------------------------------------------------------------- the options
def _deadline_text(text: str) -> str:
    parse_when(text, time.time())  # validate now; the source parses again at launch
    return text


def _sources(text: str) -> list[str]:
    try:
        return parse_source_names(text)
    except UsageError:
        msg = f"unknown source name; choose from {','.join(KNOWN_SOURCES)}"
        raise ValueError(msg) from None


SOURCE_OPTIONS = (
    Option("--deadline", _deadline_text, None, "+2h", "the deadline; overrides discovery",
           section="deadline", see="deadline-sources.md#which-values-count", value_name="WHEN",
           doc="Epoch seconds or milliseconds (told apart by size), ISO-8601 with an offset or `Z` "
               "(`2026-09-14T20:30:00+08:00`), or relative to now: `+90s`, `+15m`, `+2h`, `+1d`. A "
               "time without an offset is refused (which zone?). With it, no other source is asked. "
               "It must lie between 2000-01-01 and 10 years from now, else exit 2 before the "
               "command starts."),
    Option("--sources", _sources, list(DEFAULT_SOURCES), ",".join(DEFAULT_SOURCES),
           "ordered deadline sources",
           section="deadline", see="deadline-sources.md", value_name="LIST",
           doc=f"Where to look, in order (`esiwrap deadline` shows what each one says); the earliest "
               f"deadline among those that answer wins. Known: {', '.join(f'`{n}`' for n in KNOWN_SOURCES)}: "
               f"each name every output gives a source (`env` is both `env:MLP` and "
               f"`env:SAGEMAKER`; either alone asks only its variable). "
               f"`aws-spot`, `azure` and `gcp` are not on by default (they would probe a metadata "
               f"address from every machine of another cloud or none); `slurm` only starts inside a "
               f"Slurm job."),
    Option("--refresh", seconds, 300.0, "300", "seconds between deadline look-ups", section="deadline",
           see="deadline-sources.md", advanced=True,
           doc="How often the sources whose answer can change are asked again: the ECS OpenAPI's "
               "`AutoReleaseAt`, Slurm's end time (at most every 60 s there). Spot notices have a 5 s "
               "poll of their own, which backs off up to this when the service does not answer."),
    *OPTIONS,
)


def source_values(**given: Any) -> dict[str, Any]:
    """The source options' defaults, with `given` (by `Option.dest`) on top: what
    `esiwrap.sources.registry.build_sources` takes, for code that has no command line."""
    values = {opt.dest: opt.default for opt in SOURCE_OPTIONS}
    unknown = set(given) - set(values)
    if unknown:
        msg = f"not source options: {', '.join(sorted(unknown))}"
        raise KeyError(msg)
    return {**values, **given}
