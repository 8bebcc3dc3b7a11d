"""The supervisor is the I/O shell: it feeds the controller and carries out its actions, and reads
nothing of the controller's state but the one view of it (`snapshot`). Read with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

from esiwrap.core import controller
from esiwrap.shell import supervisor

SUPERVISOR = Path(supervisor.__file__)
# the controller's public methods
ENTRY_POINTS = {"handle", "tick", "finish", "wake_at", "snapshot", "capacity"}


def controller_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """Every `self.controller.X` and `controller.X` in the module."""
    reads = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        named = isinstance(base, ast.Name) and base.id == "controller"
        on_self = isinstance(base, ast.Attribute) and base.attr == "controller" \
            and isinstance(base.value, ast.Name) and base.value.id == "self"
        if named or on_self:
            reads.append((node.lineno, node.attr))
    return reads


def test_the_supervisor_uses_only_the_controllers_entry_points() -> None:
    """Inputs in (`handle`, `tick`, `finish`), actions out, `wake_at` for the loop's timeout and
    `snapshot` for the status line, metrics and status file, `capacity` for the run's record in the
    job's history: no attribute of the controller's state."""
    tree = ast.parse(SUPERVISOR.read_text(encoding="utf-8"))
    reads = controller_reads(tree)
    assert {name for _, name in reads} == ENTRY_POINTS
    assert all(callable(getattr(controller.Controller, name)) for name in ENTRY_POINTS)
    modes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "Mode"]
    assert modes == []  # nor does it look at the controller's mode


def test_the_check_sees_both_spellings() -> None:
    """`self.controller.mode` and `controller.obs` are both found."""
    tree = ast.parse("self.controller.mode\ncontroller.obs.saves\nself.config.controller\n")
    assert controller_reads(tree) == [(1, "mode"), (2, "obs")]
