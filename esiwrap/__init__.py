"""esiwrap: checkpoint a training run at the last safe moment before its capacity is reclaimed."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
