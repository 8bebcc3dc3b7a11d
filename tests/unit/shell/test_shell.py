"""The supervisor is the I/O shell: it feeds the runner and carries out the actions (`Effects`), and
reads nothing of the controller's state but the one view of it (`snapshot`). The runner alone calls
the controller's entry points. Read with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

from python_source import parse, parse_file

from esiwrap.core import controller, runner
from esiwrap.shell import supervisor

SUPERVISOR = Path(supervisor.__file__)
RUNNER = Path(runner.__file__)
# the controller's public methods: the runner drives it, the supervisor only reads its views
DRIVING = {"handle", "tick", "finish", "wake_at"}
VIEWS = {"snapshot"}
ENTRY_POINTS = DRIVING | VIEWS


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
    """The runner drives the controller (inputs in with `handle`, timers with `tick`, `finish`,
    `wake_at` for the loop's timeout); the supervisor reads only `snapshot` (the status line,
    metrics and status file): no attribute of the controller's state, and it calls none of the
    driving ones itself (the job's state comes decided, in `KeepState`)."""
    tree = parse_file(SUPERVISOR)
    reads = controller_reads(tree)
    assert {name for _, name in reads} == VIEWS
    assert {name for _, name in controller_reads(parse_file(RUNNER))} == DRIVING
    assert all(callable(getattr(controller.Controller, name)) for name in ENTRY_POINTS)
    modes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "Mode"]
    assert modes == []  # nor does it look at the controller's mode


def test_the_check_sees_both_spellings() -> None:
    """`self.controller.mode` and `controller.obs` are both found."""
    tree = parse("self.controller.mode\ncontroller.obs.saves\nself.config.controller\n")
    assert controller_reads(tree) == [(1, "mode"), (2, "obs")]
