"""Build the ordered source list named by `--sources`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from esiwrap.deadline.local import CliSource, env_sources
from esiwrap.deadline.metadata import AWS_METADATA_URL, VOLCENGINE_METADATA_URL
from esiwrap.deadline.value import Source
from esiwrap.errors import UsageError

if TYPE_CHECKING:
    from esiwrap.deadline.metadata import MetadataClient
    from esiwrap.deadline.volcengine import VolcengineSettings

# volcengine-spot is on by default: it asks the same metadata service as `volcengine`, so it adds
# no new address, and a spot notice is the shortest warning there is. aws-spot is opt-in: on by
# default it would probe 169.254.169.254 from every non-AWS machine every few minutes.
DEFAULT_SOURCES = ("cli", "env", "volcengine", "volcengine-spot")
KNOWN_SOURCES = ("cli", "env", "volcengine", "volcengine-spot", "aws-spot")
REGION_ENV = "VOLCENGINE_REGION"


@dataclass(frozen=True)
class SourceSettings:
    """What the sources need from the command line; time enters as `anchor` (launch time)."""

    deadline: str | None = None
    sagemaker_lead_s: float = 1800.0
    refresh_s: float = 300.0
    volcengine_endpoint: str | None = None
    volcengine_region: str | None = None
    volcengine_timeout_s: float = 5.0
    metadata_url: str = VOLCENGINE_METADATA_URL
    aws_metadata_url: str = AWS_METADATA_URL


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
    """Sources in the order given. `--deadline` overrides discovery: then it is the only one.

    The cloud sources' modules are imported only when named: a run with local sources only
    starts without them."""
    if settings.deadline is not None and "cli" in names:
        return [CliSource(settings.deadline, anchor)]
    if any(name not in ("cli", "env") for name in names):
        from esiwrap.deadline.metadata import AWS, VOLCENGINE, MetadataClient
        from esiwrap.deadline.spot import aws_spot, volcengine_spot
        from esiwrap.deadline.volcengine import VolcengineSource
    volcengine_imds: MetadataClient | None = None  # one client: the two sources share its token
    sources: list[Source] = []
    for name in names:
        if name == "env":
            sources.extend(env_sources(environ, settings.sagemaker_lead_s))
        elif name in ("volcengine", "volcengine-spot"):
            if volcengine_imds is None:
                volcengine_imds = MetadataClient(settings.metadata_url, VOLCENGINE)
            if name == "volcengine":
                sources.append(VolcengineSource(volcengine_imds, volcengine_settings(settings, environ)))
            else:
                sources.append(volcengine_spot(volcengine_imds, settings.refresh_s))
        elif name == "aws-spot":
            sources.append(aws_spot(MetadataClient(settings.aws_metadata_url, AWS), settings.refresh_s))
    return sources


def volcengine_settings(settings: SourceSettings, environ: Mapping[str, str]) -> VolcengineSettings:
    from esiwrap.deadline.volcengine import VolcengineSettings

    region = settings.volcengine_region or environ.get(REGION_ENV, "").strip() or None
    return VolcengineSettings(
        endpoint=settings.volcengine_endpoint,
        region=region,
        timeout_s=settings.volcengine_timeout_s,
        refresh_s=settings.refresh_s,
    )
