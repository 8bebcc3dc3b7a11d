"""Build the ordered source list named by `--sources`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from esiwrap.deadline.local import CliSource, env_sources
from esiwrap.deadline.value import Source
from esiwrap.errors import UsageError

DEFAULT_SOURCES = ("cli", "env")
KNOWN_SOURCES = ("cli", "env")


@dataclass(frozen=True)
class SourceSettings:
    """What the sources need from the command line; time enters as `anchor` (launch time)."""

    deadline: str | None = None
    sagemaker_lead_s: float = 1800.0
    refresh_s: float = 300.0


def parse_source_names(text: str) -> list[str]:
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in KNOWN_SOURCES]
    if unknown or not names:
        bad = ",".join(unknown) or repr(text)
        msg = f"--sources {bad}: unknown source; choose from {','.join(KNOWN_SOURCES)}, e.g. cli,env"
        raise UsageError(msg)
    return names


def build_sources(
    names: Sequence[str], settings: SourceSettings, environ: Mapping[str, str], anchor: float
) -> list[Source]:
    """Sources in the order given. `--deadline` overrides discovery: then it is the only one."""
    if settings.deadline is not None and "cli" in names:
        return [CliSource(settings.deadline, anchor)]
    sources: list[Source] = []
    for name in names:
        if name == "env":
            sources.extend(env_sources(environ, settings.sagemaker_lead_s))
    return sources
