"""The suite mirrors the package (docs/development.md): a test file is under tests/unit/, in the
folder of the floor it tests, or under tests/system/; the helpers are in tests/lib/."""

from __future__ import annotations

from esiwrap_harness import ROOT

TESTS = ROOT / "tests"


def test_every_test_file_is_under_unit_or_system() -> None:
    """No test file at the top of tests/ or among the helpers: a new one goes to
    tests/unit/<floor>/ or tests/system/<floor or theme>/."""
    stray = sorted(str(path.relative_to(TESTS)) for path in TESTS.rglob("test_*.py")
                   if path.relative_to(TESTS).parts[0] not in ("unit", "system"))
    assert stray == [], "move each to tests/unit/<floor>/ or tests/system/<floor or theme>/"


def test_the_top_of_tests_holds_only_conftest() -> None:
    """A helper at the top of tests/ is not on sys.path (conftest.py puts tests/lib/ there)."""
    assert sorted(path.name for path in TESTS.glob("*.py")) == ["conftest.py"], "move helpers to tests/lib/"


def test_the_unit_folders_are_floors_of_the_package() -> None:
    """Each folder under tests/unit/ is a folder of esiwrap/ (or benchmarks/, the simulator's)."""
    unit = TESTS / "unit"
    folders = [path.relative_to(unit) for path in unit.rglob("*")
               if path.is_dir() and "__pycache__" not in path.parts]
    assert folders
    assert [str(f) for f in folders if not (ROOT / "esiwrap" / f).is_dir() and not (ROOT / f).is_dir()] == []
