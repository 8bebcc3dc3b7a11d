"""One home per concept: names that must agree across the package are defined once, and the few
copies that cannot import them (the start-up hook runs before esiwrap is importable) are held
equal to the home here. The source is read with `ast`, as written."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from esiwrap import choices, envvars
from esiwrap.cli import ALL_RUN_OPTIONS
from esiwrap.controller import Mode
from esiwrap.snapshot import PHASES

PACKAGE = Path(envvars.__file__).resolve().parent
SITECUSTOMIZE = PACKAGE / "_bootstrap" / "sitecustomize.py"
ENV_NAME = re.compile(r"ESIWRAP_[A-Z0-9_]*")


def package_sources(*leave_out: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path not in leave_out:
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def literal_words(node: ast.AST) -> frozenset[str] | None:
    """The words of a `Literal["a", "b"]` annotation; None for any other node."""
    if not isinstance(node, ast.Subscript) or not isinstance(node.value, ast.Name):
        return None
    if node.value.id != "Literal":
        return None
    words = ast.literal_eval(node.slice)
    return frozenset(words if isinstance(words, tuple) else (words,))


def test_every_esiwrap_variable_name_is_spelled_in_envvars_only() -> None:
    """No module but `envvars` writes an `ESIWRAP_…` name as a string of its own: each one is a
    constant imported from there (help texts and messages may mention names in prose)."""
    spelled = [f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}"
               for path, tree in package_sources(PACKAGE / "envvars.py", SITECUSTOMIZE)
               for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and ENV_NAME.fullmatch(node.value)]
    assert spelled == []


def test_the_start_up_hook_spells_the_same_names() -> None:
    """sitecustomize.py cannot import esiwrap before it knows esiwrap is wanted: its literals are
    exactly the socket, relay and hook-switch names of `envvars`."""
    used = set(ENV_NAME.findall(SITECUSTOMIZE.read_text(encoding="utf-8")))
    assert used == {envvars.SOCKET_ENV, envvars.RELAY_ENV, envvars.HOOK_SWITCH_ENV}


def test_options_read_from_the_environment_use_the_same_prefix_and_names() -> None:
    """`--log-file` and `--status-file` read the variables `envvars` names; every option's
    variable is ESIWRAP_<OPTION>."""
    by_flag = {opt.flag: opt.env for opt in ALL_RUN_OPTIONS}
    assert by_flag["--log-file"] == envvars.LOG_FILE_ENV
    assert by_flag["--status-file"] == envvars.STATUS_FILE_ENV
    assert all(env.startswith(envvars.PREFIX) for env in by_flag.values())


def test_the_verl_hook_watches_the_modules_the_patcher_knows() -> None:
    """The post-import hook's list and the patcher's dispatch are one list: every watched module
    is patched by one of verl's two loops, and nothing else."""
    from esiwrap.integrations import VERL_LEGACY_MODULES, VERL_TRAINER_MODULES, VERL_V1_MODULE

    assert set(VERL_TRAINER_MODULES) == {*VERL_LEGACY_MODULES, VERL_V1_MODULE}
    assert len(VERL_TRAINER_MODULES) == len(set(VERL_TRAINER_MODULES)) == 4
    spelled = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
                     for path, tree in package_sources()
                     for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and node.value == VERL_V1_MODULE]
    assert len(spelled) == 1, spelled


def test_each_cli_choice_is_one_literal_in_choices() -> None:
    """The words an option offers are its `Literal` type in `esiwrap.choices`; no other `Literal`
    in the package spells the same words again."""
    by_flag = {opt.flag: opt.choices for opt in ALL_RUN_OPTIONS}
    assert by_flag["--after-save"] == choices.AFTER_SAVE == get_args(choices.AfterSave)
    assert by_flag["--on-sigterm"] == choices.ON_SIGTERM == get_args(choices.OnSigterm)
    assert by_flag["--log-format"] == choices.LOG_FORMATS == get_args(choices.LogFormat)
    assert by_flag["--log-level"] == choices.LOG_LEVELS == get_args(choices.LogLevel)
    offered = {frozenset(words) for words in by_flag.values() if words}
    again = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
             for path, tree in package_sources(PACKAGE / "choices.py")
             for node in ast.walk(tree)
             if literal_words(node) in offered]
    assert again == []


def test_the_phases_shown_are_the_controllers_modes() -> None:
    """Metrics and `esiwrap status` list the phases the snapshot names: the controller's modes."""
    assert tuple(mode.value for mode in Mode) == PHASES
