"""Source `aws-spot`: an EC2 spot interruption notice in the instance metadata, and its option.

The notice is polled like Volcengine's (`spot`), through AWS's IMDSv2 (`metadata`), both imported
when the source is built: this module is read by every `esiwrap` start.
"""

from __future__ import annotations

from esiwrap.optiontypes import Option, metadata_url
from esiwrap.sources.base import Source, SourceSetup

METADATA_URL_DEFAULT = "http://169.254.169.254"

NAMES: tuple[str, ...] = ("aws-spot",)
METADATA_URL = Option(
    "--aws-metadata-url", metadata_url, METADATA_URL_DEFAULT, METADATA_URL_DEFAULT,
    "AWS instance metadata service", section="platforms", see="platforms/aws.md", value_name="URL",
    doc="Where `aws-spot` polls the spot interruption notice and the rebalance recommendation and "
        "reads the instance's life cycle, with AWS's IMDSv2 tokens. Plain HTTP.")
OPTIONS: tuple[Option, ...] = (METADATA_URL,)


def build(name: str, setup: SourceSetup) -> list[Source]:
    from esiwrap.sources.metadata import AWS, MetadataClient
    from esiwrap.sources.spot import aws_spot

    return [aws_spot(MetadataClient(setup.values[METADATA_URL.dest], AWS), setup.refresh_s)]
