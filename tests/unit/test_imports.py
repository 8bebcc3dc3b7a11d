"""The package's import graph, read from the source with `ast` (every `import`, at the top of a module
or inside a function): no module imports `esiwrap.cli` but the entry points, and nothing imports
its way back to itself. The option table gathers each deadline source's options, and the heavy
source modules load only when a run names their sources."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_source import parse, parse_file

from esiwrap.cli.options import ALL_RUN_OPTIONS
from esiwrap.sources import registry
from esiwrap.sources.registry import SOURCE_OPTIONS

PACKAGE = Path(registry.__file__).resolve().parent.parent
ENTRY_POINTS = {"esiwrap._console", "esiwrap.__main__"}
HEAVY_SOURCE_MODULES = (
    "esiwrap.sources.metadata", "esiwrap.sources.spot", "esiwrap.sources.volcengine_api",
    "esiwrap.sources.azure_events", "esiwrap.sources.gcp_notices",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported_names(name: str) -> Iterator[str]:
    """Every module name an `import` in `name` names (relative imports resolved), with
    `from X import Y` also naming X.Y when that is a module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def edges(name: str) -> set[str]:
    """The package's modules that importing `name` runs: each imported module and the packages
    above it (importing a.b.c runs a/__init__ and a/b/__init__ first), except the packages `name`
    itself is in, which are already being imported, unless `name` takes names their `__init__`
    defines (`from esiwrap.integrations import install_verl_hooks` in a submodule): that is a
    dependency on the package's own code all the same."""
    found = set()
    for target in imported_names(name):
        parts = target.split(".")
        for end in range(1, len(parts) + 1):
            module = ".".join(parts[:end])
            if module in MODULES and module != name and not name.startswith(module + "."):
                found.add(module)
    return found | own_packages_code_used(name)


def own_packages_code_used(name: str) -> set[str]:
    """The packages above `name` whose `__init__` defines a name `name` imports from them."""
    used = set()
    for target in imported_names(name):
        package, _, attribute = target.rpartition(".")
        if attribute and name.startswith(package + ".") and package in MODULES and target not in MODULES:
            used.add(package)
    return used


GRAPH = {name: edges(name) for name in MODULES}


def cycles() -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(GRAPH[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1 or module in GRAPH[module]:
                found.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return found


def test_the_graph_reader_sees_every_kind_of_import() -> None:
    """Top-level, function-level, relative and `from package import module` imports are edges;
    the package of a module imported is one too."""
    assert "esiwrap.cli.options" in GRAPH["esiwrap.cli"]  # top level
    assert "esiwrap.shell.supervisor" in GRAPH["esiwrap.cli"]  # inside run()
    assert "esiwrap.sources.volcengine_api" in GRAPH["esiwrap.sources.volcengine"]  # inside build()
    assert {"esiwrap.times", "esiwrap.envvars"} <= GRAPH["esiwrap.optiontypes"]
    assert "esiwrap.integrations.verl_hooks" in GRAPH["esiwrap.integrations"]  # from ... import name
    assert "esiwrap.integrations.verl" in GRAPH["esiwrap.integrations.verl_hooks"]  # from ... import verl
    assert "esiwrap.integrations.ray_relay" in GRAPH["esiwrap.integrations"]  # inside activate()
    # a package's own modules
    assert "esiwrap.core.controller.protocol" in GRAPH["esiwrap.core.controller.machine"]


# ---------------------------------------------------------------------------------- the floors
FLOORS: dict[str, frozenset[str]] = {  # each floor, and the floors its modules may import
    "ground": frozenset({"ground"}),
    "core": frozenset({"ground", "core"}),
    "trainer": frozenset({"ground", "trainer"}),
    "sources": frozenset({"ground", "core", "sources"}),
    "integrations": frozenset({"ground", "core", "trainer", "sources", "integrations"}),
    "shell": frozenset({"ground", "core", "trainer", "sources", "shell"}),
    "tools": frozenset({"ground", "core", "shell", "tools"}),
    "cli": frozenset({"ground", "core", "trainer", "sources", "integrations", "shell", "tools", "cli"}),
    "entry": frozenset({"ground", "shell", "cli", "entry"}),  # `esiwrap`, `python -m esiwrap`
    "_bootstrap": frozenset({"ground", "integrations", "_bootstrap"}),  # the child's start-up hook
}
MAX_TOP_LEVEL_MODULES = 11  # the ground floor and the entry points; everything else is in a floor


def floor(module: str) -> str:
    """The floor a module is on: its folder under esiwrap/, `entry` for the executables, else the
    ground floor (the names every floor shares: errors, events, envvars, signals, times, options)."""
    if module in ENTRY_POINTS:
        return "entry"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else "ground"


def test_every_folder_of_the_package_is_a_floor() -> None:
    """The package's folders are its floors, and its top level holds only the ground floor's few
    shared modules and the entry points."""
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == set(FLOORS) - {"ground", "entry"}
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_import_runs_upward() -> None:
    """A module imports only its own floor and the floors below it: the core and the trainer side
    know nothing of the shell, the sources nothing of the supervisor, the tools nothing of the
    command line (every import, inside functions too)."""
    upward = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
                    if floor(target) not in FLOORS[floor(module)])
    assert upward == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if floor(m) == "core"))
def test_the_core_does_no_io_and_reads_no_clock(module: str) -> None:
    """The core (the controller, the policy, the history, the job, the runner) imports nothing that
    does I/O or reads a clock: the supervisor, the simulator and the tests drive the very same
    code with the time as an argument."""
    source = MODULES[module].read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    forbidden = {"os", "signal", "socket", "selectors", "psutil", "time", "subprocess", "threading"}
    assert imported.isdisjoint(forbidden)
    assert "time.time(" not in source and "monotonic(" not in source


def test_a_module_that_takes_names_from_its_own_package_depends_on_it(tmp_path: Path) -> None:
    """`from esiwrap.integrations import install_verl_hooks` inside esiwrap/integrations/ray_relay.py
    is a dependency on the package's `__init__` (how ray_relay and verl once looped through it);
    `from esiwrap.integrations import verl` is one on the module only."""
    saved = dict(MODULES)
    try:
        fake = tmp_path / "esiwrap" / "integrations" / "fake.py"
        fake.parent.mkdir(parents=True)
        fake.write_text("def f():\n    from esiwrap.integrations import install_verl_hooks, verl\n")
        MODULES["esiwrap.integrations.fake"] = fake
        assert own_packages_code_used("esiwrap.integrations.fake") == {"esiwrap.integrations"}
        assert "esiwrap.integrations.verl" in edges("esiwrap.integrations.fake")
    finally:
        MODULES.clear()
        MODULES.update(saved)


def test_only_the_entry_points_import_the_cli() -> None:
    """`esiwrap.cli` is the top: nothing of the package imports it but the executables."""
    importers = {name for name, targets in GRAPH.items()
                 if "esiwrap.cli" in targets and not name.startswith("esiwrap.cli")}
    assert importers == ENTRY_POINTS


def test_the_import_graph_has_no_cycle() -> None:
    """No module imports, however indirectly and wherever in its code, a module that imports it
    (the decision core's package and the integrations' included)."""
    assert cycles() == []


def test_every_sources_options_are_in_the_table_once() -> None:
    """Each source module's `OPTIONS` are in `SOURCE_OPTIONS` (after the general `--deadline`,
    `--sources`, `--refresh`), its `NAMES` are `--sources` words; no flag, variable or source
    name is declared twice."""
    declared = [opt for module in registry.SOURCE_MODULES for opt in module.OPTIONS]
    assert [opt.flag for opt in SOURCE_OPTIONS] == ["--deadline", "--sources", "--refresh",
                                                    *(opt.flag for opt in declared)]
    names = [name for module in registry.SOURCE_MODULES for name in module.NAMES]
    assert tuple(names) == registry.KNOWN_SOURCES and len(set(names)) == len(names)
    assert set(registry.DEFAULT_SOURCES) <= set(names)
    flags = [opt.flag for opt in ALL_RUN_OPTIONS]
    assert len(set(flags)) == len(flags)
    assert len({opt.env for opt in ALL_RUN_OPTIONS}) == len(flags)


@pytest.mark.system
def test_heavy_source_modules_load_only_for_the_sources_that_need_them() -> None:
    """`esiwrap --help` and a run with local sources import no cloud source's machinery (the
    metadata client, the spot poller, the ECS API); naming the cloud sources imports it."""
    code = (
        "import contextlib, io, sys\n"
        "from esiwrap.cli import main\n"
        "from esiwrap.sources.registry import build_sources\n"
        "from esiwrap.sources.registry import source_values\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        f"heavy = {HEAVY_SOURCE_MODULES!r}\n"
        "build_sources(['cli', 'env'], source_values(), {}, 0.0)\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "local = source_values(metadata_url='http://127.0.0.1:9', aws_metadata_url='http://127.0.0.1:9',\n"
        "                      azure_metadata_url='http://127.0.0.1:9', gcp_metadata_url='http://127.0.0.1:9')\n"
        "build_sources(['volcengine', 'aws-spot', 'azure', 'gcp'], local, {}, 0.0)\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.splitlines() == ["[]", str(sorted(HEAVY_SOURCE_MODULES))]
