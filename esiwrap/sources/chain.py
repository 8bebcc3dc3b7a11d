"""Ask a source, and turn whatever it does into an `Answer`: the boundary between the deadline
sources and everything else. Which answer rules is the core's (`esiwrap.core.values.winner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, cast

from esiwrap.core.values import CAPACITY_KINDS, Answer, CapacityKind, Deadline, notice_or_none
from esiwrap.errors import SourceUnavailable
from esiwrap.sources.base import Source
from esiwrap.times import implausible


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


