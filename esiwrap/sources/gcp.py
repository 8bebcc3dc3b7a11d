"""Source `gcp`: Compute Engine preemption and host-maintenance notices, and its options.

The notices are read (`gcp_notices`) through the metadata client (`metadata`), both imported when
the source is built: this module is read by every `esiwrap` start.
"""

from __future__ import annotations

from esiwrap.optiontypes import Option, metadata_url, seconds
from esiwrap.sources.base import Source, SourceSetup

METADATA_URL_DEFAULT = "http://metadata.google.internal"
MAINTENANCE_NOTICE_S = 60.0  # Google: 60 s for ordinary VMs (an hour for GPU VMs)

NAMES: tuple[str, ...] = ("gcp",)
PAGE = "platforms/gcp.md"
METADATA_URL = Option(
    "--gcp-metadata-url", metadata_url, METADATA_URL_DEFAULT, METADATA_URL_DEFAULT,
    "Compute Engine metadata server", section="platforms", see=PAGE, value_name="URL",
    doc="Where `gcp` watches `instance/preempted` and `instance/maintenance-event`, with the header "
        "`Metadata-Flavor: Google`. Plain HTTP.")
MAINTENANCE_NOTICE = Option(
    "--gcp-maintenance-notice", seconds, MAINTENANCE_NOTICE_S, "60", "notice before GCP host maintenance",
    section="platforms", see=PAGE,
    doc="Seconds from a `TERMINATE_ON_HOST_MAINTENANCE` notice to the stop. Google gives ordinary "
        "VMs 60 s and GPU VMs an hour: on a GPU VM, `3600` trains on until the last safe moment.")
OPTIONS: tuple[Option, ...] = (METADATA_URL, MAINTENANCE_NOTICE)


def build(name: str, setup: SourceSetup) -> list[Source]:
    from esiwrap.sources.gcp_notices import GcpSource
    from esiwrap.sources.metadata import GCP, MetadataClient

    client = MetadataClient(setup.values[METADATA_URL.dest], GCP)
    return [GcpSource(client, maintenance_notice_s=setup.values[MAINTENANCE_NOTICE.dest],
                      max_backoff_s=setup.refresh_s)]
