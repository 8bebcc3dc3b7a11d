"""Ask every source, keep every answer, pick the winner.

`--deadline` (the `cli` source) overrides discovery; otherwise the earliest deadline among the
sources that answered wins, because the first reclamation is the one that counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast, get_args

from esiwrap.deadline.bounds import implausible
from esiwrap.deadline.value import CapacityKind, Deadline, Source
from esiwrap.errors import SourceUnavailable

OVERRIDING_SOURCES = frozenset({"cli"})


@dataclass(frozen=True)
class Answer:
    """What one source said: a deadline, or the reason it could not say."""

    source: str
    deadline: Deadline | None = None
    reason: str = ""
    expected: bool = False  # the source does not apply here; not worth a warning
    withdrawn: bool = False  # forget what this source said (a node that left, an event cancelled)
    capacity: CapacityKind | None = None  # what the source knows of the capacity's kind
    early_warning: str = ""  # not a deadline: a risk that asks for a save now (EC2 rebalance), why
    notice_s: float | None = None  # the source can see the cloud's notice now, this long before the end


def ask(source: Source, now: float) -> Answer:
    """One source's answer, its deadline held to the plausible range (`bounds`).

    The boundary between the sources and the supervisor: nothing a source raises, and no value
    it returns, can reach the supervisor's loop other than as an `Answer`.
    """
    try:
        deadline = source.resolve(now)
    except SourceUnavailable as exc:
        return Answer(source.name, reason=_text(exc), expected=exc.expected, withdrawn=exc.withdrawn,
                      capacity=_capacity(source), early_warning=_early_warning(source),
                      notice_s=_notice_s(source))
    except Exception as exc:  # a source bug must not take training down
        return Answer(source.name, reason=f"unexpected {type(exc).__name__}: {_text(exc)}",
                      early_warning=_early_warning(source))
    if not isinstance(deadline, Deadline):
        return Answer(source.name, reason=f"unexpected answer {type(deadline).__name__}, not a Deadline")
    problem = implausible(deadline.at, now)
    if problem is not None:
        return Answer(source.name, reason=f"{deadline.raw!r} is not a plausible deadline: {problem}",
                      capacity=_capacity(source), early_warning=_early_warning(source))
    return Answer(source.name, deadline=deadline, capacity=deadline.capacity or _capacity(source),
                  early_warning=_early_warning(source), notice_s=_notice_s(source))


CAPACITY_KINDS: frozenset[str] = frozenset(get_args(CapacityKind))


def _capacity(source: Source) -> CapacityKind | None:
    """The source's `capacity` attribute if it has a valid one (a bug there must not matter)."""
    try:
        value = getattr(source, "capacity", None)
    except Exception:
        return None
    return cast("CapacityKind", value) if value in CAPACITY_KINDS else None


def _notice_s(source: Source) -> float | None:
    """The source's `watching_notice_s` attribute if it is a valid one (a bug there must not matter)."""
    try:
        value = getattr(source, "watching_notice_s", None)
    except Exception:
        return None
    return notice_or_none(value)


def notice_or_none(value: Any) -> float | None:
    """A notice in seconds, or None for anything that is not a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _early_warning(source: Source) -> str:
    """The source's `early_warning` attribute as one line of text, or "" (a bug there must not matter)."""
    try:
        value = getattr(source, "early_warning", None)
    except Exception:
        return ""
    return " ".join(value.split())[:500] if isinstance(value, str) else ""


class Released(NamedTuple):
    ok: bool
    detail: str  # what the source did, or why it could not


def release(source: Source) -> Released | None:
    """Let the source tell its platform the run is done with the capacity (`Source` docs); None
    when it has nothing to do. Never raises: a failure is a `Released(ok=False)`."""
    try:
        hook = getattr(source, "release", None)
        note = hook() if callable(hook) else None
    except SourceUnavailable as exc:
        return Released(False, _text(exc))
    except Exception as exc:  # a source bug must not turn a clean exit 75 into a crash
        return Released(False, f"unexpected {type(exc).__name__}: {_text(exc)}")
    return Released(True, " ".join(note.split())) if isinstance(note, str) and note.strip() else None


def _text(exc: BaseException) -> str:
    """An exception's message on one line, even when its __str__ misbehaves."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return " ".join(text.split()) or type(exc).__name__


def ask_all(sources: Sequence[Source], now: float) -> list[Answer]:
    return [ask(source, now) for source in sources]


def winner(answers: Iterable[Answer]) -> Deadline | None:
    """The deadline that rules: an overriding source if one answered, else the earliest."""
    known = [a.deadline for a in answers if a.deadline is not None]
    overriding = [d for d in known if d.source in OVERRIDING_SOURCES]
    pool = overriding or known
    return min(pool, key=lambda d: d.at) if pool else None
