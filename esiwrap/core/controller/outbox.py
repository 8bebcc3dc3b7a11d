"""Where the parts put what they decide: the actions, in the order they were decided."""

from __future__ import annotations

import math
from typing import Any

from esiwrap.choices import LogLevel
from esiwrap.core.controller.protocol import Action, Log


class Outbox:
    """The actions of the input being handled; `take` hands them over and starts afresh."""

    def __init__(self) -> None:
        self._actions: list[Action] = []

    def act(self, action: Action) -> None:
        self._actions.append(action)

    def log(self, level: LogLevel, event: str, **fields: Any) -> None:
        self._actions.append(Log(level, event, fields))

    def take(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions


def rounded(value: float) -> float | None:
    """Three decimals for the log; None instead of a value JSON cannot carry (NaN, inf)."""
    return round(value, 3) if math.isfinite(value) else None


def rounded_opt(value: float | None) -> float | None:
    return None if value is None else rounded(value)
