"""The package a user would `pip install`, installed as the README and the docs say, each command as
written (`tests/lib/install_commands.py`), in a folder holding a copy of the tree named `esiwrap` (the
docs' clone): the sdist and the wheel built by `python -m build esiwrap` (the wheel from the
sdist), their metadata and contents checked, and the wheel installed alone into a fresh venv (its
core dependencies only: no torch, no verl), where `esiwrap --version`, `esiwrap deadline --json`,
`esiwrap systemd-unit`, `esiwrap docs` and a supervised trainer run, the trainer's start-up hook and
the trainer library coming from the installed wheel. In two more fresh venvs: `pip install
./esiwrap` from the clone, and the clone with the extra that installs without PyPI here."""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import tarfile
import textwrap
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, ROOT, EsiwrapRun
from install_commands import BUILD, COMMANDS, FROM_CHECKOUT, FROM_WHEEL, RUN, WITH_EXTRA

from esiwrap import __version__
from esiwrap.errors import EXIT_CHECKPOINTED

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

PACKAGE = ROOT / "esiwrap"
CORE_DEPENDENCIES = {"psutil>=5.9", "structlog>=23.1"}
# what a fresh venv may hold besides esiwrap and its core dependencies
VENV_TOOLS = {"pip", "setuptools", "wheel"}
NOT_IN_A_BUILD = shutil.ignore_patterns(".git", ".venv", "site", "build", "dist", "*.egg-info", "__pycache__",
                                        ".mypy_cache", ".ruff_cache", ".pytest_cache", "demo-checkpoints")

TRAINER = '''
"""Only esiwrap.trainer: steps of 0.2 s, a save that writes a file; says where its code came from."""
import json, os, sys, time
import esiwrap, esiwrap.trainer as esi
hook = sys.modules.get("sitecustomize")
print("ORIGIN " + json.dumps({"esiwrap": esiwrap.__file__, "hook": getattr(hook, "__file__", None),
                              "pythonpath": os.environ.get("PYTHONPATH", "")}), flush=True)
esi.install()
step = 0
while True:
    step += 1
    time.sleep(0.2)
    esi.step_done(step)
    if esi.save_requested():
        with esi.saving(step, sys.argv[1]):
            with open(sys.argv[1], "w") as out:
                out.write(str(step))
                out.flush()
                os.fsync(out.fileno())
'''


@dataclass
class Venv:
    """A fresh venv esiwrap was installed into."""

    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def site_packages(self) -> Path:
        (found,) = (self.venv / "lib").glob("python3*/site-packages")
        return found

    def distributions(self) -> set[str]:
        names = "sorted(d.metadata['Name'].lower() for d in m.distributions())"
        code = f"import importlib.metadata as m, json; print(json.dumps({names}))"
        done = subprocess.run([str(self.bin / "python"), "-c", code], capture_output=True, text=True,
                              timeout=60, env=clean_env(self), cwd=self.venv, check=True)
        return set(json.loads(done.stdout))


@dataclass
class Built(Venv):
    sdist: Path
    wheel: Path


def clean_env(venv: Venv, **extra: str) -> dict[str, str]:
    """Nothing of the development tree: no PYTHONPATH, no esiwrap variables, the venv first on PATH."""
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR")}
    return {**keep, "PATH": f"{venv.bin}:/usr/bin:/bin", **extra}


def run_documented(command: str, where: Path, path: Path) -> None:
    """Run a command of the docs as written, through the shell (its `*` and quotes are the
    shell's), in `where` (the folder that holds the clone `esiwrap`) with `path` first on PATH."""
    assert command in COMMANDS, command
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR")}
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=600, cwd=where,
                          env={**keep, "PATH": f"{path}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert done.returncode == 0, (command, done.stdout[-3000:] + done.stderr[-3000:])


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a copy of the tree named `esiwrap`, as the docs' clone is; its wheel and
    sdist built there as the docs build them (`python -m build esiwrap`, with the suite's own
    Python, which has the `build` package)."""
    where = tmp_path_factory.mktemp("install")
    shutil.copytree(ROOT, where / "esiwrap", ignore=NOT_IN_A_BUILD, symlinks=True)
    done = subprocess.run(["/bin/sh", "-c", BUILD], capture_output=True, text=True, timeout=600, cwd=where,
                          env={**os.environ, "PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return where


def fresh_venv(where: Path, name: str, command: str) -> Venv:
    """A new venv in `where`, and the documented `command` run with it first on PATH."""
    venv = Venv(where / name)
    subprocess.run([PYTHON, "-m", "venv", str(venv.venv)], check=True, timeout=300)
    run_documented(command, where, venv.bin)
    return venv


@pytest.fixture(scope="module")
def built(clone: Path) -> Iterator[Built]:
    """The wheel installed as the docs say: `pip install esiwrap/dist/esiwrap-*.whl`."""
    dist = clone / "esiwrap" / "dist"
    (sdist,) = dist.glob("esiwrap-*.tar.gz")
    (wheel,) = dist.glob("esiwrap-*.whl")
    venv = fresh_venv(clone, "venv-wheel", FROM_WHEEL)
    yield Built(venv.venv, sdist, wheel)


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode("utf-8"))


def test_the_metadata_names_the_project_and_only_the_core_dependencies(built: Built) -> None:
    """The wheel's METADATA and the sdist's PKG-INFO agree: name, version (the package's own),
    summary, Python requirement, licence, the README as a Markdown description; the only
    unconditional requirements are psutil and structlog (torch, verl and the SDKs only in
    extras), and every extra is declared."""
    meta = wheel_metadata(built.wheel)
    assert meta["Name"] == "esiwrap" and meta["Version"] == __version__
    assert meta["Summary"] and meta["Requires-Python"] == ">=3.10"
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()
    requires = meta.get_all("Requires-Dist") or []
    core = {r.replace(" ", "") for r in requires if "extra ==" not in r}
    assert core == CORE_DEPENDENCIES
    heavy = [r for r in requires if r.split(";")[0].strip().lower().startswith(("torch", "verl", "ray"))]
    assert heavy and all("extra ==" in r for r in heavy)
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"volcengine", "verl", "hf", "lightning", "demo", "docs", "test"} <= extras
    with tarfile.open(built.sdist) as archive:
        (info,) = [m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        handle = archive.extractfile(info)
        assert handle is not None
        pkg_info = email.parser.Parser().parsestr(handle.read().decode("utf-8"))
    assert (pkg_info["Name"], pkg_info["Version"]) == ("esiwrap", __version__)
    with zipfile.ZipFile(built.wheel) as archive:
        (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        assert "esiwrap = esiwrap._console:console" in archive.read(entry_points).decode()


def test_the_wheel_carries_every_file_of_the_package(built: Built) -> None:
    """Every file under esiwrap/ in the tree (modules, py.typed, the start-up hook, the systemd
    unit template) is in the wheel, and nothing of tests/, docs/ or examples/ is."""
    source = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    with zipfile.ZipFile(built.wheel) as archive:
        names = set(archive.namelist())
    packaged = {n for n in names if n.startswith("esiwrap/")}
    assert {"esiwrap/py.typed", "esiwrap/_bootstrap/sitecustomize.py",
            "esiwrap/shell/systemd/esiwrap@.service"} <= packaged
    assert source == packaged, (source ^ packaged)
    assert not [n for n in names if n.startswith(("tests/", "docs/", "examples/", "benchmarks/"))]
    with tarfile.open(built.sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert source <= members and {"README.md", "pyproject.toml"} <= members


def test_the_fresh_venv_holds_esiwrap_and_its_core_dependencies_only(built: Built) -> None:
    """`pip install` of the wheel alone brought esiwrap, psutil and structlog: no torch, no verl,
    no Ray, no SDK."""
    installed = built.distributions()
    assert {"esiwrap", "psutil", "structlog"} <= installed
    assert installed - VENV_TOOLS == {"esiwrap", "psutil", "structlog"}


def test_the_installed_commands_answer(built: Built, tmp_path: Path) -> None:
    """From the venv: `esiwrap --version` and `python -m esiwrap --version`; `esiwrap deadline
    --json` finds a platform's deadline (the Volcengine ML platform's variable; the metadata
    service pointed at a closed loopback port); `esiwrap systemd-unit` prints the unit template,
    a data file of the wheel."""
    env = clean_env(built)
    for command in ([str(built.bin / "esiwrap"), "--version"],
                    [str(built.bin / "python"), "-m", "esiwrap", "--version"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert (done.returncode, done.stdout.strip()) == (0, f"esiwrap {__version__}"), done.stderr
    end = int(time.time()) + 3600
    done = subprocess.run([str(built.bin / "esiwrap"), "deadline", "--json"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          env={**env, "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": str(end),
                               "ESIWRAP_METADATA_URL": "http://127.0.0.1:9"})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["source"] == "env:MLP" and abs(answer["epoch"] - end) < 1, answer
    by_source = {s["source"]: s for s in answer["sources"]}
    assert by_source["volcengine"]["ok"] is False and by_source["volcengine"]["reason"]  # failed soft
    done = subprocess.run([str(built.bin / "esiwrap"), "systemd-unit"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "[Service]" in done.stdout
    assert f"ExecStart={built.bin / 'esiwrap'}" in done.stdout


def test_the_installed_wheel_says_where_the_documentation_is(built: Built, tmp_path: Path) -> None:
    """`esiwrap docs` from a venv with the wheel alone: no docs folder to name (the wheel carries
    none, and pip installed it from a file), so it says where the docs are and what the terminal
    has; exit 0."""
    done = subprocess.run([str(built.bin / "esiwrap"), "docs"], capture_output=True, text=True, timeout=60,
                          env=clean_env(built), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "installed without its documentation" in done.stdout and "esiwrap --help-all" in done.stdout
    assert str(ROOT) not in done.stdout


@pytest.fixture(scope="module")
def from_checkout(clone: Path) -> Venv:
    """`pip install ./esiwrap` in a fresh venv, next to the clone."""
    return fresh_venv(clone, "venv-checkout", FROM_CHECKOUT)


def test_a_checkout_path_installs_esiwrap_alone_and_its_docs_are_found(from_checkout: Venv, clone: Path,
                                                                       tmp_path: Path) -> None:
    """From the clone's path: esiwrap and its core dependencies only, `esiwrap --version`
    answers, and `esiwrap docs` names the docs/ folder of the clone it was installed from."""
    assert from_checkout.distributions() - VENV_TOOLS == {"esiwrap", "psutil", "structlog"}
    env = clean_env(from_checkout)
    done = subprocess.run([str(from_checkout.bin / "esiwrap"), "--version"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert done.stdout.strip() == f"esiwrap {__version__}", done.stderr
    done = subprocess.run([str(from_checkout.bin / "esiwrap"), "docs"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the folder this esiwrap was installed from" in done.stdout
    assert str(clone / "esiwrap" / "docs" / "getting-started.md") in done.stdout


@pytest.fixture(scope="module")
def with_extra(clone: Path) -> Venv:
    """`pip install './esiwrap[demo]'` in a fresh venv: the extra that installs here without PyPI."""
    return fresh_venv(clone, "venv-extra", WITH_EXTRA)


def test_an_extra_brings_its_dependencies(with_extra: Venv, tmp_path: Path) -> None:
    """The clone with the demo's extra: esiwrap with torch and numpy, which import, and the
    trainer library beside them."""
    assert {"esiwrap", "torch", "numpy", "psutil", "structlog"} <= with_extra.distributions()
    code = "import numpy, torch, esiwrap.trainer; print(torch.__version__.split('+')[0])"
    done = subprocess.run([str(with_extra.bin / "python"), "-c", code], capture_output=True, text=True,
                          timeout=120, env=clean_env(with_extra), cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "2.13.0"), done.stderr


def test_the_commands_run_here_are_the_ones_the_table_marks() -> None:
    """What this module runs is what tests/lib/install_commands.py says it runs (and no more)."""
    assert {c for c, how in COMMANDS.items() if how == RUN} == {FROM_WHEEL, FROM_CHECKOUT, WITH_EXTRA}


def test_a_supervised_trainer_runs_from_the_installed_wheel(built: Built, tmp_path: Path) -> None:
    """A trainer that uses only `esiwrap.trainer`, run by the venv's `esiwrap` with the venv's
    Python: it attaches, saves when asked and esiwrap exits 75; its start-up hook
    (`sitecustomize`, first on its PYTHONPATH) and the trainer library are the wheel's files in
    the venv, not the development tree's."""
    script, checkpoint = tmp_path / "trainer.py", tmp_path / "checkpoint.txt"
    script.write_text(textwrap.dedent(TRAINER))
    run = EsiwrapRun(["--deadline", "+40s", "--redundant-time", "10", "--save-duration", "1",
                      "--final-margin", "3", "--log-format", "json", "--",
                      str(built.bin / "python"), str(script), str(checkpoint)],
                     env=clean_env(built), cwd=tmp_path, launcher=[str(built.bin / "esiwrap")])
    try:
        code = run.finish(timeout=120)
    finally:
        run.kill()
    missed = [e for e in run.events if e["event"] == "save_missed"]
    assert code == EXIT_CHECKPOINTED, (run.names(), missed, run.other_lines[-10:])
    attached = run.first("trainer_attached")
    assert attached["integration"] == "plain" and attached["saves"] is True
    completed = [e for e in run.events if e["event"] == "save_completed"]
    assert completed and checkpoint.read_text() == str(completed[-1]["step"])
    origin_line = next(line for line in run.stdout.decode().splitlines() if line.startswith("ORIGIN "))
    origin = json.loads(origin_line.removeprefix("ORIGIN "))
    site = str(built.site_packages())
    assert origin["esiwrap"].startswith(site), origin
    assert origin["hook"] == f"{site}/esiwrap/_bootstrap/sitecustomize.py", origin
    assert origin["pythonpath"].split(os.pathsep)[0] == f"{site}/esiwrap/_bootstrap", origin
    assert str(ROOT) not in json.dumps(origin)
