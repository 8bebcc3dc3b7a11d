"""The run option type and the value parsers every option table uses.

An `Option` is one flag of `esiwrap [OPTIONS] -- COMMAND`: its environment variable
(`ESIWRAP_<NAME>`), default, example, its one-line help and longer description, the section it is
listed in, and the parser that turns the text into a value. A parser raises `ValueError` with the
reason (`esiwrap.optiontypes.resolve_options` turns it into one line naming the input and an example).
The sections are `--help`'s groups and the headings of the options reference
(`docs/reference/options.md`, written by `scripts/gen_reference.py` from these fields); the
platforms' settings and the `advanced` options are listed by `--help-all` only.

Deadline sources declare their own options with these (`esiwrap.sources.registry`), so this
module imports nothing of esiwrap's but the names and the duration parser: any module may import it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from esiwrap.envvars import PREFIX
from esiwrap.errors import UsageError

if TYPE_CHECKING:
    import argparse
from esiwrap.times import TimeParseError, parse_duration


@dataclass(frozen=True)
class Section:
    """A group of options: a `--help` group and a heading of the options reference."""

    key: str
    title: str  # the --help group's title, lower case: "deadline sources"
    summary: str  # one sentence under it
    page: str  # the documentation page that explains it, relative to docs/
    in_help: bool = True  # listed by `esiwrap --help`; else by `--help-all` only


SECTIONS: tuple[Section, ...] = (
    Section("deadline", "deadline sources",
            "where the deadline comes from: given, or the sources asked for it", "deadline-sources.md"),
    Section("policy", "policy", "when to save: the estimates and reserves the plan is made of", "policy.md"),
    Section("uploads", "uploads and resumes",
            "the checkpoint off the instance, and the job's memory across runs", "uploads-and-resumes.md"),
    Section("stopping", "stopping and signals",
            "the save signal, SIGTERM, and how the child is stopped", "reference/signals.md"),
    Section("observe", "logs and metrics",
            "what esiwrap writes while it runs: logs, metrics, the status file", "observe/index.md"),
    Section("platforms", "platform settings",
            "each deadline source's own: where its metadata service is, the Volcengine API, "
            "SageMaker's lead, Slurm's requeue, Azure's and GCP's notices", "deadline-sources.md",
            in_help=False),
)
SECTION_KEYS = frozenset(section.key for section in SECTIONS)


@dataclass(frozen=True)
class Option:
    flag: str  # --metadata-url
    parse: Callable[[str], Any]
    default: Any
    example: str  # a good value, shown after a bad one
    help: str  # one short line: `--help`, the job's environment file
    choices: tuple[str, ...] = ()
    show: Callable[[Any], str] | None = None  # how the default reads in --help (else str, on/off, ...)
    section: str = field(default="", kw_only=True)  # a `Section.key`
    doc: str = field(default="", kw_only=True)  # the longer description (Markdown): --help-all, the reference
    see: str = field(default="", kw_only=True)  # the docs page (and #anchor) that explains more
    value_name: str = field(default="", kw_only=True)  # the value's name in --help, if not the default's
    advanced: bool = field(default=False, kw_only=True)  # a knob the defaults fit: in --help-all only

    def __post_init__(self) -> None:
        if self.section not in SECTION_KEYS:
            msg = f"{self.flag}: section {self.section!r} is not one of {sorted(SECTION_KEYS)}"
            raise ValueError(msg)

    @property
    def dest(self) -> str:
        """The key of its value in the resolved options: metadata_url."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return PREFIX + self.dest.upper()

    @property
    def default_text(self) -> str:
        value = self.default
        if self.show is not None:
            return self.show(value)
        if value is None:
            return "none"
        if isinstance(value, list):
            return ",".join(value)
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    @property
    def metavar(self) -> str:
        if self.value_name:
            return self.value_name
        if self.choices:
            return "|".join(self.choices)
        if self.parse is seconds:
            return "SECONDS"
        return self.dest.upper()


# ---------------------------------------------------------------------------------- parsers
def seconds(text: str) -> float:
    """90, 90s, 15m, 2h, 1d."""
    try:
        return parse_duration(text)
    except TimeParseError:
        msg = "not a number of seconds"
        raise ValueError(msg) from None


def positive_int(text: str) -> int:
    value = int(text.strip())
    if value < 1:
        msg = "must be at least 1"
        raise ValueError(msg)
    return value


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    msg = "not a boolean"
    raise ValueError(msg)


def choice(allowed: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            msg = f"must be one of {', '.join(allowed)}"
            raise ValueError(msg)
        return value

    return parse


def as_given(value: str) -> str:
    """Any text, as given."""
    return value


def metadata_url(text: str) -> str:
    """A cloud's instance metadata service: plain HTTP, e.g. http://169.254.169.254."""
    url = text.strip().rstrip("/")
    if not url.startswith("http://") or len(url) <= len("http://"):
        msg = "the metadata service is plain HTTP; use http://HOST[:PORT]"
        raise ValueError(msg)
    return url


def host_or_url(text: str) -> str:
    """An API endpoint: a host name or a URL."""
    url = text.strip().rstrip("/")
    if not url or " " in url:
        msg = "not a host or URL"
        raise ValueError(msg)
    return url


def port(text: str) -> int:
    value = int(text.strip())
    if not 0 <= value <= 65535:
        msg = "must be 0..65535 (0: any free port)"
        raise ValueError(msg)
    return value


def file_in_existing_dir(text: str, *, name_a_file: str = "give a file path",
                         create: str = "create it or choose another path") -> str:
    """An absolute path whose directory exists (the file need not); the hints end the errors."""
    path = os.path.abspath(os.path.expanduser(text.strip()))
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        msg = f"is a directory; {name_a_file}"
        raise ValueError(msg)
    if not os.path.isdir(directory):
        msg = f"directory {directory} does not exist; {create}"
        raise ValueError(msg)
    return path


# ---------------------------------------------------------------------------------- resolution
def resolve_options(
    ns: argparse.Namespace, options: Sequence[Option], environ: Mapping[str, str]
) -> dict[str, Any]:
    """Flag, else ESIWRAP_<NAME>, else default, by `Option.dest`; each parsed, a bad one raising
    `UsageError` with the line to show (`esiwrap.cli` exits 2 with it; a Ray node's watch
    reports it)."""
    values: dict[str, Any] = {}
    for opt in options:
        raw = getattr(ns, opt.dest, None)
        label = opt.flag
        if raw is None and environ.get(opt.env, "").strip():
            raw, label = environ[opt.env], opt.env
        if raw is None:
            values[opt.dest] = opt.default
            continue
        try:
            values[opt.dest] = opt.parse(raw)
        except (ValueError, KeyError) as exc:
            reason = _reason(exc)
            shown = "e.g." in reason or opt.example.split()[0] in reason
            example = "" if shown else f"; e.g. {opt.flag} {opt.example}"
            msg = f"{label} {raw!r}: {reason}{example}"
            raise UsageError(msg) from None
    return values


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if "invalid literal" in text or "could not convert" in text:
        return "not a number"
    if isinstance(exc, KeyError):
        return "unknown name"
    return text or type(exc).__name__
