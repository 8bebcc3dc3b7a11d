"""Where the deadline comes from: parsing, plausibility, sources, and the chain that picks one.

The sources themselves are in their modules (`local`, `volcengine`, `aws`, gathered by
`registry`), imported by name: this package's import stays light.
"""

from __future__ import annotations

from esiwrap.deadline import remote
from esiwrap.deadline.chain import Answer, ask, ask_all, winner
from esiwrap.deadline.parse import TimeParseError, parse_duration, parse_epoch, parse_iso, parse_when
from esiwrap.deadline.value import Deadline, Source, iso_utc

__all__ = [
    "Answer",
    "Deadline",
    "Source",
    "TimeParseError",
    "ask",
    "ask_all",
    "iso_utc",
    "parse_duration",
    "parse_epoch",
    "parse_iso",
    "parse_when",
    "remote",
    "winner",
]
