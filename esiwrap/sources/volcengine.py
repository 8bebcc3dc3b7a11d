"""Sources `volcengine` and `volcengine-spot`: a Volcengine ECS instance's end, and its options.

* `volcengine`: an elastic scheduled instance's `auto_release_at`, from the ECS OpenAPI
  (`volcengine_api`; the SDK is the `esiwrap[volcengine]` extra);
* `volcengine-spot`: a spot interruption notice in the instance metadata (`spot`).

Both ask one metadata service (`--metadata-url`) through one client, which keeps one token. What
they need is imported when they are built: this module is read by every `esiwrap` start.
"""

from __future__ import annotations

from esiwrap.optiontypes import Option, as_given, host_or_url, metadata_url, seconds
from esiwrap.sources.base import Source, SourceSetup

METADATA_URL_DEFAULT = "http://100.96.0.96"
REGION_ENV = "VOLCENGINE_REGION"

NAMES: tuple[str, ...] = ("volcengine", "volcengine-spot")
PAGE = "platforms/volcengine.md"
ENDPOINT = Option(
    "--volcengine-endpoint", host_or_url, None, "https://ecs.cn-beijing.volcengineapi.com",
    "ECS OpenAPI endpoint (host or URL)", section="platforms", see=PAGE, value_name="URL",
    doc="Where `volcengine` asks `DescribeInstances` and `DescribeScheduledInstances`: a host name "
        "or an `http(s)://` URL. Default: the SDK's endpoint for the region.")
REGION = Option(
    "--volcengine-region", as_given, None, "cn-beijing", "ECS region", section="platforms", see=PAGE,
    value_name="REGION",
    doc=f"The region of the ECS OpenAPI. Default: `{REGION_ENV}`, else the metadata service's "
        f"`region_id`.")
TIMEOUT = Option(
    "--volcengine-timeout", seconds, 5.0, "5", "ECS OpenAPI read timeout per attempt",
    section="platforms", see=PAGE,
    doc="Each ECS OpenAPI call is tried up to three times (two retries with backoff), each attempt "
        "with this read timeout; a failure is one `deadline_unavailable` line, and the next "
        "`--refresh` tries again.")
METADATA_URL = Option(
    "--metadata-url", metadata_url, METADATA_URL_DEFAULT, METADATA_URL_DEFAULT,
    "Volcengine instance metadata service", section="platforms", see=PAGE, value_name="URL",
    doc="Where `volcengine` reads the instance id and region and `volcengine-spot` polls the spot "
        "interruption notice, with IMDSv2 tokens. Plain HTTP.")
OPTIONS: tuple[Option, ...] = (ENDPOINT, REGION, TIMEOUT, METADATA_URL)


def build(name: str, setup: SourceSetup) -> list[Source]:
    from esiwrap.sources.metadata import VOLCENGINE, MetadataClient

    imds = setup.shared.get(METADATA_URL.dest)
    if imds is None:  # one client for both sources: they share its token
        imds = setup.shared[METADATA_URL.dest] = MetadataClient(setup.values[METADATA_URL.dest], VOLCENGINE)
    if name == "volcengine-spot":
        from esiwrap.sources.spot import volcengine_spot

        return [volcengine_spot(imds, setup.refresh_s)]
    from esiwrap.sources.volcengine_api import VolcengineSettings, VolcengineSource

    values = setup.values
    region = values[REGION.dest] or setup.environ.get(REGION_ENV, "").strip() or None
    settings = VolcengineSettings(endpoint=values[ENDPOINT.dest], region=region,
                                  timeout_s=values[TIMEOUT.dest], refresh_s=setup.refresh_s)
    return [VolcengineSource(imds, settings)]
