"""Source `azure`: Azure Scheduled Events for this VM, and its options.

The events are read (`azure_events`) through the metadata client (`metadata`), both imported when
the source is built: this module is read by every `esiwrap` start.
"""

from __future__ import annotations

from esiwrap.optiontypes import Option, boolean, metadata_url
from esiwrap.sources.base import Source, SourceSetup

METADATA_URL_DEFAULT = "http://169.254.169.254"

NAMES: tuple[str, ...] = ("azure",)
PAGE = "platforms/azure.md"
METADATA_URL = Option(
    "--azure-metadata-url", metadata_url, METADATA_URL_DEFAULT, METADATA_URL_DEFAULT,
    "Azure instance metadata service", section="platforms", see=PAGE, value_name="URL",
    doc="Where `azure` reads this VM's name and priority and polls its Scheduled Events, with the "
        "header `Metadata: true`. Plain HTTP.")
ACK = Option(
    "--azure-ack", boolean, False, "true", "approve Azure events after a checkpoint",
    section="platforms", see=PAGE + "#azure-ack",
    doc="Once the run stopped with a complete checkpoint (exit 75, the child's tree gone), approve "
        "this VM's pending scheduled events (`StartRequests`), so a reboot or redeploy starts "
        "without waiting for `NotBefore`; logged as `capacity_released`. An event that also names "
        "other VMs is left alone.")
OPTIONS: tuple[Option, ...] = (METADATA_URL, ACK)


def build(name: str, setup: SourceSetup) -> list[Source]:
    from esiwrap.sources.azure_events import AzureSource
    from esiwrap.sources.metadata import AZURE, MetadataClient

    client = MetadataClient(setup.values[METADATA_URL.dest], AZURE)
    return [AzureSource(client, ack=setup.values[ACK.dest], max_backoff_s=setup.refresh_s)]
