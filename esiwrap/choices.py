"""The options that choose among a few words: one home for their types and the words the CLI offers."""

from __future__ import annotations

from typing import Literal, get_args

AfterSave = Literal["stop", "linger", "continue"]
OnSigterm = Literal["checkpoint", "forward"]
LogFormat = Literal["json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]  # what --log-level offers, and what esiwrap logs at
VerifyBuiltin = Literal["auto", "none"]  # esiwrap's own check of each checkpoint: by its format, or off

AFTER_SAVE: tuple[str, ...] = get_args(AfterSave)
ON_SIGTERM: tuple[str, ...] = get_args(OnSigterm)
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
VERIFY_BUILTIN: tuple[str, ...] = get_args(VerifyBuiltin)
