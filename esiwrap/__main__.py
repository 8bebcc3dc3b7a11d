from __future__ import annotations

from esiwrap._console import console

console()
