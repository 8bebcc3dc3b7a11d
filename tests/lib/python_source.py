"""`ast.parse` for the tests that read the package's source.

CPython 3.11 keeps the AST builder's recursion count per interpreter, not per thread
(python/cpython#106905, fixed in 3.12): a parse that overlaps another thread's raises
`SystemError: AST constructor recursion depth mismatch` although the source is fine (the fast
lane met it twice in about fifteen runs, in one worker). A parse that hits it is done again; a
real syntax error is raised as always."""

from __future__ import annotations

import ast
from pathlib import Path

ATTEMPTS = 5


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for _ in range(ATTEMPTS - 1):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(source, filename=filename)


def parse_file(path: Path) -> ast.Module:
    return parse(path.read_text(encoding="utf-8"), filename=str(path))
