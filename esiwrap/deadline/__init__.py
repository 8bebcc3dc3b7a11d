"""Where the deadline comes from: parsing, sources, and the chain that picks one."""

from __future__ import annotations

from esiwrap.deadline import remote
from esiwrap.deadline.chain import Answer, ask, ask_all, winner
from esiwrap.deadline.local import MLP_VAR, SAGEMAKER_VAR, CliSource, EnvSource, env_sources
from esiwrap.deadline.parse import TimeParseError, parse_duration, parse_epoch, parse_iso, parse_when
from esiwrap.deadline.value import Deadline, Source, iso_utc

__all__ = [
    "MLP_VAR",
    "SAGEMAKER_VAR",
    "Answer",
    "CliSource",
    "Deadline",
    "EnvSource",
    "Source",
    "TimeParseError",
    "ask",
    "ask_all",
    "env_sources",
    "iso_utc",
    "parse_duration",
    "parse_epoch",
    "parse_iso",
    "parse_when",
    "remote",
    "winner",
]
