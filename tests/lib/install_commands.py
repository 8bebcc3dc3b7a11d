"""Every `pip install` command README.md and docs/ give a reader, and what the suite does with each.

`tests/system/test_wheel.py` runs the ones marked RUN, as written, in fresh venvs (in a folder holding a
copy of the tree named `esiwrap`, as the docs' clone is); each of the others says why no test can
run it here. `tests/unit/test_install_docs.py` holds the pages to this table: a command a page gives
that the table does not know fails, and so does an entry no page gives any more.
"""

from __future__ import annotations

import re
from pathlib import Path

RUN = "run"
BUILD = "python -m build esiwrap"  # the wheel (and sdist) the docs build, into esiwrap/dist/
FROM_CHECKOUT = "pip install ./esiwrap"
FROM_WHEEL = "pip install esiwrap/dist/esiwrap-*.whl"
# The extra whose dependencies resolve without PyPI where the suite runs: torch 2.13.0 (a local CPU
# wheel here) and numpy. volcengine, hf, verl and docs need PyPI; lightning resolves too, but only
# after torch is pinned by hand, and brings far more.
WITH_EXTRA = "pip install './esiwrap[demo]'"
NOT_PUBLISHED = "esiwrap is not on PyPI yet: the docs give it as the future form, marked as such"

COMMANDS: dict[str, str] = {
    FROM_CHECKOUT: RUN,
    FROM_WHEEL: RUN,
    WITH_EXTRA: RUN,
    "pip install /tmp/esiwrap-0.1.0-py3-none-any.whl": "a built wheel by its path (SkyPilot's setup): "
    "what the wheel's own install does",
    "pip install './esiwrap[volcengine]'": "the Volcengine SDK comes from PyPI",
    "pip install './esiwrap-0.1.0-py3-none-any.whl[volcengine]'": "a built wheel with an extra: the "
    "Volcengine SDK comes from PyPI",
    "pip install './esiwrap[verl]'": "esiwrap alone, as the checkout install that runs here: the extra "
    "holds no package, so the verl already installed stays as it is",
    "pip install './esiwrap[hf]'": "transformers comes from PyPI",
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": "PyTorch's own "
    "index, which no test reaches",
    "pip install volcenginesdk-ecs volcenginesdk-core": "the Volcengine SDK alone (the hint when it is "
    "missing), from PyPI",
    "pip install awscli": "the aws CLI from PyPI, in a venv of its own in the verl recipe's image (the "
    "upload to TOS); the suite's `aws` is the test extra's",
    "pip install esiwrap": NOT_PUBLISHED,
    "pip install 'esiwrap[volcengine]'": NOT_PUBLISHED,
}

_FENCE = re.compile(r"^ *```[^\n]*\n(.*?)^ *```", re.DOTALL | re.MULTILINE)
_PIP = re.compile(r"(?:\S*/)?pip3? install\b")
_PIP_PATH = re.compile(r"^\S*/(pip3? install)")


def documented(text: str) -> list[str]:
    """The `pip install` commands of a Markdown page: a code block's lines (up to a `  #`
    comment) and inline code spans, each from `pip install` on, a path to pip dropped, up to
    prose that follows it (` (`, `;`, `, `), whitespace collapsed; a bare `pip install` is prose."""
    found = []
    for block in _FENCE.findall(text):
        for line in block.splitlines():
            match = _PIP.search(line)
            if match:
                found.append(line[match.start():].split("  #")[0])
    for span in re.findall(r"`([^`]+)`", _FENCE.sub("", text)):
        match = _PIP.search(span)
        if match:
            found.append(span[match.start():])
    cut = [re.split(r" \(|;|, ", _PIP_PATH.sub(r"\1", command))[0] for command in found]
    commands = [" ".join(command.split()) for command in cut]
    return [command for command in commands if command.split()[2:]]  # `pip install` alone names none


def pages(root: Path) -> list[Path]:
    """What a reader reads: README.md and every page of the documentation."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
