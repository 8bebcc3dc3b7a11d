"""`esiwrap docs`: where the documentation is, however esiwrap was installed: the checkout it runs
from, the folder pip installed it from, the package's Documentation URL, else what the terminal
offers. (From an installed wheel and a checkout path: tests/system/test_wheel.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, ROOT

from esiwrap.tools import docs

VERSION = "0.1.0"


def test_from_a_checkout_the_docs_folder_and_its_first_pages() -> None:
    """Run from the checkout (editable install, PYTHONPATH): its docs/, each page named there
    exists, and the script that serves the site."""
    found = docs.locate(ROOT / "esiwrap")
    assert found == docs.Docs(ROOT / "docs", docs.CHECKOUT)
    text = docs.render(found, VERSION)
    for page, _ in docs.PAGES:
        assert (ROOT / "docs" / page).is_file(), page
        assert str(ROOT / "docs" / page) in text
    assert str(ROOT / "scripts" / "docs.sh") in text and "installed without" not in text


@pytest.mark.parametrize(("record", "folder"), [
    ({"url": "file:///home/me/src/esiwrap", "dir_info": {}}, Path("/home/me/src/esiwrap")),
    ({"url": "file:///home/me/my%20src/esiwrap", "dir_info": {"editable": True}},
     Path("/home/me/my src/esiwrap")),
    ({"url": "file:///tmp/dist/esiwrap-0.1.0-py3-none-any.whl", "archive_info": {}}, None),
    ({"url": "https://github.com/x/esiwrap", "vcs_info": {"vcs": "git"}}, None),
])
def test_the_folder_pip_installed_from(record: dict[str, object], folder: Path | None) -> None:
    """`pip install ./esiwrap` records the folder (direct_url.json): that is where the docs are;
    a wheel file or a remote repository is no folder here."""
    assert docs.installed_from(json.dumps(record)) == folder
    assert docs.installed_from(None) is None and docs.installed_from("{not json") is None


def test_an_installed_esiwrap_finds_the_folder_it_was_installed_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed into site-packages from a checkout that is still there: that checkout's docs/;
    once the checkout is gone, no folder, and the words say where the docs are instead."""
    installed = tmp_path / "site-packages" / "esiwrap"
    installed.mkdir(parents=True)
    source = tmp_path / "clone"
    (source / "docs").mkdir(parents=True)
    (source / "docs" / "index.md").write_text("# esiwrap\n")
    (source / "mkdocs.yml").write_text("site_name: esiwrap\n")
    record = json.dumps({"url": source.as_uri(), "dir_info": {}})
    monkeypatch.setattr(docs, "_distribution", lambda: (record, []))
    assert docs.locate(installed) == docs.Docs(source / "docs", docs.INSTALLED_FROM)
    (source / "mkdocs.yml").unlink()
    gone = docs.locate(installed)
    assert gone == docs.Docs()
    text = docs.render(gone, VERSION)
    assert "installed without its documentation" in text and "esiwrap --help-all" in text


def test_a_documentation_url_in_the_metadata_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `Documentation` Project-URL (pyproject's [project.urls]) is printed as the online address."""
    urls = ["Homepage, https://example.org/esiwrap", "Documentation, https://docs.example.org/esiwrap/"]
    assert docs.documentation_url(urls) == "https://docs.example.org/esiwrap/"
    assert docs.documentation_url(urls[:1]) is None
    monkeypatch.setattr(docs, "_distribution", lambda: (None, urls))
    found = docs.locate(tmp_path / "esiwrap")
    assert found == docs.Docs(url="https://docs.example.org/esiwrap/")
    text = docs.render(found, VERSION)
    assert "Online: https://docs.example.org/esiwrap/" in text and "installed without" not in text


@pytest.mark.system
def test_esiwrap_docs_from_the_checkout(tmp_path: Path) -> None:
    """`esiwrap docs`, run from anywhere with this checkout's esiwrap: exit 0, the docs' pages."""
    done = subprocess.run([PYTHON, "-m", "esiwrap", "docs"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{ROOT / 'docs' / 'getting-started.md'}" in done.stdout
