"""One home per concept: names that must agree across the package are defined once, and the few
copies that cannot import them (the start-up hook runs before esiwrap is importable) are held
equal to the home here. The source is read with `ast`, as written."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from python_source import parse_file

from esiwrap import choices, envvars, events
from esiwrap.cli.options import ALL_RUN_OPTIONS
from esiwrap.core.controller import Mode
from esiwrap.core.snapshot import PHASES
from esiwrap.trainer import channel, wire

PACKAGE = Path(envvars.__file__).resolve().parent
DOCS = PACKAGE.parent / "docs"
SITECUSTOMIZE = PACKAGE / "_bootstrap" / "sitecustomize.py"
ENV_NAME = re.compile(r"ESIWRAP_[A-Z0-9_]*")


def package_sources(*leave_out: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path not in leave_out:
            yield path, parse_file(path)


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


def test_the_start_up_hook_knows_the_same_verl_trainer_modules() -> None:
    """sitecustomize.py names verl's trainer modules (to speak up only in a Python that imports one
    without esiwrap): the same list as `esiwrap.integrations`."""
    from esiwrap.integrations import VERL_TRAINER_MODULES

    tree = parse_file(SITECUSTOMIZE)
    listed = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "_TRAINER_MODULES" for t in node.targets))
    names = {n.value for n in ast.walk(listed) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert names == set(VERL_TRAINER_MODULES)


def test_options_read_from_the_environment_use_the_same_prefix_and_names() -> None:
    """`--log-file` and `--status-file` read the variables `envvars` names; every option's
    variable is ESIWRAP_<OPTION>."""
    by_flag = {opt.flag: opt.env for opt in ALL_RUN_OPTIONS}
    assert by_flag["--log-file"] == envvars.LOG_FILE_ENV
    assert by_flag["--status-file"] == envvars.STATUS_FILE_ENV
    assert all(env.startswith(envvars.PREFIX) for env in by_flag.values())


def test_the_verl_hook_watches_the_modules_the_patcher_knows() -> None:
    """The post-import hook's list and the patcher's dispatch are one list: every watched module
    is patched by one of verl's loops, or is the metrics module (every loop's boundary), and
    nothing else (sitecustomize.py, which cannot import esiwrap, spells the same list: see the
    test above)."""
    from esiwrap.integrations import (
        VERL_LEGACY_MODULES,
        VERL_METRICS_MODULE,
        VERL_TRAINER_MODULES,
        VERL_V1_MODULE,
    )

    assert set(VERL_TRAINER_MODULES) == {*VERL_LEGACY_MODULES, VERL_V1_MODULE, VERL_METRICS_MODULE}
    assert len(VERL_TRAINER_MODULES) == len(set(VERL_TRAINER_MODULES)) == 6
    spelled = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
                     for path, tree in package_sources(SITECUSTOMIZE)
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


READERS = tuple(PACKAGE / "tools" / name for name in ("report.py", "timeline.py", "whatif.py"))


def event_constants_used(tree: ast.Module) -> set[str]:
    """`ev.X` / `events.X` in one module (`from esiwrap import events [as ev]`)."""
    aliases = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "esiwrap" for alias in node.names if alias.name == "events"}
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id in aliases}


def test_report_and_timeline_read_only_events_that_exist() -> None:
    """Every event `esiwrap report` (its timeline, its --what-if) reads is an `events` constant,
    and so a name in `events.ALL`; none spells an event name as a string of its own."""
    for path in READERS:
        tree = parse_file(path)
        read = event_constants_used(tree)
        assert read, path
        assert {getattr(events, name) for name in read} <= events.ALL, path
        spelled = [node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and node.value in events.ALL]
        assert spelled == [], (path, spelled)


def test_every_event_is_emitted_somewhere() -> None:
    """Each constant in `events` is logged by some module of the package (the readers do not
    count): no event is documented that nothing writes."""
    emitted = set().union(*(event_constants_used(tree)
                            for _, tree in package_sources(*READERS, PACKAGE / "events.py")))
    constants = {name for name, value in vars(events).items()
                 if name.isupper() and isinstance(value, str) and value in events.ALL}
    assert constants - emitted == set()


def test_every_event_has_its_description_and_a_row_in_the_events_reference() -> None:
    """Each event is declared with a topic, when it is logged and its fields; the events
    reference (docs/reference/events.md, generated from them) has one row for each event and
    none for an event that is not one."""
    assert set(events.DOCS) == events.ALL
    for doc in events.DOCS.values():
        assert doc.topic in events.TOPICS and doc.when.strip() and doc.fields.strip(), doc
    page = (DOCS / "reference" / "events.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z_]+)`", page, re.MULTILINE)
    assert sorted(rows) == sorted(events.ALL)


def wire_names_used(tree: ast.Module) -> set[str]:
    """`wire.X` in one module (`from esiwrap.trainer import wire`)."""
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "wire"}


def test_every_message_sent_is_a_wire_class() -> None:
    """The trainer library and the integrations send messages built from `esiwrap.trainer.wire`'s
    classes, never a type name and fields of their own: no `send("...")`, no `send(kind, **fields)`;
    the JSON field names are spelled in `wire` alone (its classes' fields)."""
    spelled, built = [], set()
    for path, tree in package_sources(PACKAGE / "trainer" / "wire.py"):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                    and func.value.id == "wire" and func.attr in {c.__name__ for c in wire.CLASSES.values()}:
                built.add(func.attr)
            if isinstance(func, ast.Attribute) and func.attr == "send" and node.args:
                first = node.args[0]
                if (isinstance(first, ast.Constant) and isinstance(first.value, str)) or node.keywords:
                    spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert spelled == []
    assert built >= {"Hello", "Step", "Checkpoint", "SaveBegin", "SaveSnapshot", "SaveEnd", "Start",
                     "Deadline"}
    names = {"save_begin", "save_snapshot", "save_end", "hello", "bye"}  # words no other code uses
    again = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
             for path, tree in package_sources(PACKAGE / "trainer" / "wire.py")
             for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names]
    assert again == []


def test_every_message_becomes_an_input_and_the_channel_takes_no_other() -> None:
    """esiwrap's end of the channel turns each class of `wire.CLASSES` into what the controller
    reads, and names each trainer report it may refuse by its message; a datagram of another type
    is not a message."""
    from esiwrap.core import controller as core
    from esiwrap.shell import channel as shell_channel

    handled = wire_names_used(parse_file(PACKAGE / "shell" / "channel.py"))
    assert {cls.__name__ for cls in wire.CLASSES.values()} <= handled
    assert set(shell_channel.WIRE_NAMES) == {core.Hello, *core.TRAINER_REPORTS}
    assert set(shell_channel.WIRE_NAMES.values()) <= wire.ALL
    assert isinstance(wire.decode(b'{"type": "hullo", "pid": 42}'), wire.Malformed)
    assert set(wire.CLASSES.values()) >= channel.KEPT_WHEN_REFUSED


def module_map() -> list[str]:
    """The files named in the design page's module map (its fenced tree), as paths under esiwrap/."""
    design = (DOCS / "design.md").read_text(encoding="utf-8")
    section = design.split("\n## Module map\n", 1)[1]
    tree = section.split("```\n", 2)[1]
    named, folders = [], []
    for line in tree.splitlines()[1:]:  # the first line is esiwrap/ itself
        word = line.split()[0] if line.strip() else ""
        if not word.endswith((".py", "/")):
            continue  # a description's second line
        depth = (len(line) - len(line.lstrip(" "))) // 2 - 1
        folders = folders[:depth]
        if word.endswith("/"):
            folders.append(word.rstrip("/"))
        else:
            named.append("/".join([*folders, word]))
    return named


def test_the_module_map_matches_the_tree() -> None:
    """docs/design.md's module map names every module file of the package once, and no module
    that does not exist."""
    named = module_map()
    actual = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py"))
    assert len(named) == len(set(named))
    assert sorted(named) == actual


def test_every_default_of_the_core_has_one_home() -> None:
    """The run options of the core take their defaults from its configuration (`esiwrap.core.config`,
    `PolicyConfig`): built back from the options' defaults, it is the default configuration. Every
    field of it is an option's, or named here as one no option sets; a new field without its option
    (or a changed default in one place) fails."""
    from dataclasses import fields, replace

    from esiwrap.cli import options
    from esiwrap.core.config import ControllerConfig
    from esiwrap.core.policy import PolicyConfig

    defaults = {opt.dest: opt.default for opt in options.ALL_RUN_OPTIONS}
    # One difference, on purpose: the core verifies a checkpoint only when told to (a caller
    # without checkpoint files has nothing to check); the command line tells it to by default
    # (--verify-builtin auto).
    built = options.controller_config(defaults)
    assert built.policy.verify and not PolicyConfig().verify
    assert built == replace(ControllerConfig(), policy=replace(PolicyConfig(), verify=True))
    not_options = {"policy", "save_signal", "stop_signal", "probe_dir",  # set from --signal, ... --state-file
                   "prior_sigma", "save_safety_factor", "final_save_factor", "uploads",  # constants; --upload
                   "verify", "verify_command",  # --verify-builtin, --verify
                   "restore", "restore_manifests", "manifests"}  # whether --restore, ..., --upload are set
    named = set(options.POLICY_FIELDS.values()) | set(options.CONTROLLER_FIELDS.values())
    every = {f.name for f in fields(PolicyConfig)} | {f.name for f in fields(ControllerConfig)}
    assert every - named == not_options
    for dest, field in options.POLICY_FIELDS.items():
        assert defaults[dest] == getattr(PolicyConfig(), field), dest
    for dest, field in options.CONTROLLER_FIELDS.items():
        assert defaults[dest] == getattr(ControllerConfig(), field), dest
