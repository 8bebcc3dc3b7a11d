"""Sources `cli` and `env`, which need no network: the `--deadline` flag and the platforms'
environment variables (Volcengine's ML platform, SageMaker capacity blocks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from esiwrap.core.values import Deadline
from esiwrap.errors import SourceUnavailable
from esiwrap.optiontypes import Option, seconds
from esiwrap.sources.base import Source, SourceSetup
from esiwrap.times import TimeParseError, implausible, parse_epoch, parse_when

MLP_VAR = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
SAGEMAKER_VAR = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"

MLP_SOURCE = "env:MLP"
SAGEMAKER_SOURCE = "env:SAGEMAKER"
# `env` is both variables; each is also a name of its own, the one its answers carry
NAMES: tuple[str, ...] = ("cli", "env", MLP_SOURCE, SAGEMAKER_SOURCE)
SAGEMAKER_LEAD = Option(
    "--sagemaker-lead", seconds, 1800.0, "1800", "subtracted from a SageMaker block's end",
    section="platforms", see="platforms/sagemaker.md",
    doc=f"SageMaker and EC2 capacity blocks begin terminating 30 minutes before the end time in "
        f"`{SAGEMAKER_VAR}`: this much is subtracted from it (source `env:SAGEMAKER`) and logged as "
        f"`lead_s`.")
OPTIONS: tuple[Option, ...] = (SAGEMAKER_LEAD,)  # `--deadline` is the registry's: it overrides every source


def build(name: str, setup: SourceSetup) -> list[Source]:
    if name == "cli":
        return [CliSource(setup.deadline, setup.anchor)] if setup.deadline is not None else []
    sources = env_sources(setup.environ, setup.values[SAGEMAKER_LEAD.dest])
    return [source for source in sources if name in ("env", source.name)]


@dataclass
class CliSource:
    """`--deadline WHEN`. Parsed once at start-up so `+2h` means two hours from launch."""

    text: str
    anchor: float
    name: str = "cli"

    @property
    def period_s(self) -> float | None:
        return None

    def resolve(self, now: float) -> Deadline:
        try:
            at = parse_when(self.text, self.anchor)
        except TimeParseError as exc:
            raise SourceUnavailable(str(exc)) from None
        return Deadline(at=at, source=self.name, raw=self.text, capacity="reserved")


@dataclass
class EnvSource:
    """An epoch timestamp in an environment variable, minus the platform's lead time."""

    var: str
    environ: Mapping[str, str]
    name: str
    lead_s: float = 0.0

    @property
    def period_s(self) -> float | None:
        return None  # our own environment cannot change under us

    def resolve(self, now: float) -> Deadline:
        raw = self.environ.get(self.var)
        if raw is None or not raw.strip():
            msg = f"{self.var} is not set"
            raise SourceUnavailable(msg, expected=True)
        try:
            end = parse_epoch(raw)
        except TimeParseError as exc:
            msg = f"{self.var}={raw!r} is unusable: {exc}"
            raise SourceUnavailable(msg) from None
        problem = implausible(end, now)
        if problem is not None:
            msg = f"{self.var}={raw!r} is unusable: read as epoch seconds or milliseconds, {problem}"
            raise SourceUnavailable(msg)
        return Deadline(at=end - self.lead_s, source=self.name, raw=raw.strip(), lead_s=self.lead_s,
                        capacity="reserved")  # a capacity block's (or time slot's) known end


def env_sources(environ: Mapping[str, str], sagemaker_lead_s: float) -> list[EnvSource]:
    """The `env` entry of `--sources`: Volcengine ML platform, then SageMaker capacity blocks
    (`env:MLP` and `env:SAGEMAKER` name one each)."""
    return [
        EnvSource(MLP_VAR, environ, MLP_SOURCE),
        EnvSource(SAGEMAKER_VAR, environ, SAGEMAKER_SOURCE, lead_s=sagemaker_lead_s),
    ]
