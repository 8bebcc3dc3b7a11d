"""The install commands the README and the docs give: each one is known to the suite
(`tests/lib/install_commands.py`), run in a fresh venv by tests/system/test_wheel.py or marked with why it
cannot run here, so a new, untested form fails; and what they say of torch and of PyPI holds."""

from __future__ import annotations

from esiwrap_harness import ROOT
from install_commands import BUILD, COMMANDS, FROM_CHECKOUT, FROM_WHEEL, NOT_PUBLISHED, RUN, documented, pages


def test_the_scanner_finds_commands_in_code_blocks_and_inline_code() -> None:
    """A code block's line (its comment dropped, a path to pip too) and an inline span, up to
    the prose after it."""
    page = ("Run `pip install ./esiwrap` (the core), or `sudo /opt/venv/bin/pip install x; then y`, "
            "not a bare `pip install`:\n\n"
            "```\n.venv/bin/pip install   './esiwrap[demo]'   # the demo\npython -m build esiwrap\n```\n")
    assert documented(page) == ["pip install './esiwrap[demo]'", "pip install ./esiwrap", "pip install x"]


def test_every_install_command_of_the_docs_is_one_the_suite_knows() -> None:
    """Every `pip install` a reader is given (README.md, docs/) is in the suite's table, which
    says whether tests/system/test_wheel.py runs it or why it cannot here; every entry of the table is
    still given somewhere (a stale one would hide a form nobody checks)."""
    given = {command: page.relative_to(ROOT) for page in pages(ROOT)
             for command in documented(page.read_text())}
    unknown = {command: str(page) for command, page in given.items() if command not in COMMANDS}
    assert unknown == {}, ("add each to tests/lib/install_commands.py: run it (tests/system/test_wheel.py) "
                           "or say why not")
    assert set(COMMANDS) - set(given) == set()
    assert all(how == RUN or len(how.split()) >= 4 for how in COMMANDS.values())


def test_the_readme_installs_from_a_checkout_or_a_wheel_and_pypi_is_the_future() -> None:
    """The README and the install section give the checkout and the wheel (with its build), and
    `pip install esiwrap` only as what will work once esiwrap is published."""
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = page.read_text()
        commands = documented(text)
        assert FROM_CHECKOUT in commands and FROM_WHEEL in commands and BUILD in text, page
        assert "pip install esiwrap" in commands and COMMANDS["pip install esiwrap"] == NOT_PUBLISHED
        said = " ".join(text.split())
        assert "not on PyPI yet" in said and "Once esiwrap is published on PyPI" in said, page
        assert "finds no distribution" in said, page


def test_what_the_docs_say_of_the_demos_torch() -> None:
    """The scripts pin torch 2.13.0, which from PyPI is the CUDA build: the README and getting
    started say so, and how to get the CPU build, which the scripts then keep."""
    for script in ("demo.sh", "test.sh"):
        assert "pip install --quiet --disable-pip-version-check torch==2.13.0\n" in (
            ROOT / "scripts" / script).read_text()
    cpu = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = " ".join(page.read_text().split())
        assert cpu in documented(page.read_text()) and "CUDA build" in text, page
