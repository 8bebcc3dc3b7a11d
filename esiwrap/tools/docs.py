"""`esiwrap docs`: where esiwrap's documentation is, however esiwrap was installed.

The documentation is the `docs/` folder of esiwrap's source (a MkDocs site: `scripts/docs.sh` in
the checkout serves it); the wheel does not carry it. So, in this order:

* the checkout this esiwrap runs from (`pip install -e`, `PYTHONPATH`, `scripts/demo.sh`'s venv);
* the folder pip installed it from (`pip install ./esiwrap`: the `direct_url.json` pip writes
  beside the installed package), while that folder is still there;
* the address the package's metadata names as its `Documentation` URL (`[project.urls]` in
  pyproject.toml), when it names one;
* else: where the source is, and what the terminal says meanwhile (`esiwrap --help-all`, each
  subcommand's `--help`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DIST_NAME = "esiwrap"
# The pages worth opening first, relative to docs/.
PAGES = (
    ("index.md", "where to go"),
    ("getting-started.md", "the demo, and your own trainer under esiwrap"),
    ("reference/options.md", "every option, described"),
    ("reference/events.md", "every log event"),
    ("reference/exit-codes.md", "every exit code"),
)
IN_THE_TERMINAL = (
    ("esiwrap --help-all", "every run option, described, with its variable and default"),
    ("esiwrap deadline --help", "ask the deadline sources"),
    ("esiwrap report --help", "what a run did, from its log"),
)
CHECKOUT = "the checkout this esiwrap runs from"
INSTALLED_FROM = "the folder this esiwrap was installed from"


@dataclass(frozen=True)
class Docs:
    """Where the documentation is: a `docs/` folder (and how it was found), and/or an address."""

    folder: Path | None = None
    how: str = ""  # CHECKOUT or INSTALLED_FROM
    url: str | None = None  # the metadata's `Documentation` URL


def docs_folder(source: Path) -> Path | None:
    """`source/docs` when `source` is esiwrap's source tree (its site's config and front page)."""
    docs = source / "docs"
    if (source / "mkdocs.yml").is_file() and (docs / "index.md").is_file():
        return docs
    return None


def installed_from(direct_url: str | None) -> Path | None:
    """The local folder a `direct_url.json` names (`pip install ./esiwrap`), not an archive or a
    remote address."""
    if not direct_url:
        return None
    try:
        record: Any = json.loads(direct_url)
    except ValueError:
        return None
    url = record.get("url") if isinstance(record, dict) else None
    if not isinstance(url, str) or not url.startswith("file://") or "dir_info" not in record:
        return None
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(url).path))


def documentation_url(project_urls: list[str]) -> str | None:
    """The `Documentation` entry of the metadata's `Project-URL` lines ("Documentation, https://…")."""
    for entry in project_urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("documentation", "docs") and url.strip():
            return url.strip()
    return None


def locate(package_dir: Path) -> Docs:
    """Where the documentation of the esiwrap package in `package_dir` is."""
    folder = docs_folder(package_dir.parent)
    if folder is not None:
        return Docs(folder, CHECKOUT)
    direct_url, project_urls = _distribution()
    source = installed_from(direct_url)
    url = documentation_url(project_urls)
    folder = docs_folder(source) if source is not None else None
    return Docs(folder, INSTALLED_FROM if folder is not None else "", url)


def _distribution() -> tuple[str | None, list[str]]:
    """The installed distribution's `direct_url.json` and `Project-URL` lines (none when esiwrap
    is not installed as a distribution)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(DIST_NAME)
    except metadata.PackageNotFoundError:
        return None, []
    return dist.read_text("direct_url.json"), list(dist.metadata.get_all("Project-URL") or [])


def render(docs: Docs, version: str) -> str:
    lines: list[str] = []
    if docs.folder is not None:
        lines.append(f"esiwrap {version}: the documentation is the docs/ folder of {docs.how}:")
        width = max(len(str(docs.folder / page)) for page, _ in PAGES)
        lines += [f"  {docs.folder / page!s:<{width}}  {what}" for page, what in PAGES]
        serve = docs.folder.parent / "scripts" / "docs.sh"
        if serve.is_file():
            lines.append(f"As a site on http://127.0.0.1:8000: {serve}")
    if docs.url is not None:
        lines.append(f"Online: {docs.url}")
    if docs.folder is None:
        if docs.url is None:
            lines.append(f"esiwrap {version} was installed without its documentation: it is the docs/ "
                         "folder of esiwrap's source (a clone of its repository; README.md there says "
                         "where to start, docs/reference/options.md lists every option).")
        lines.append("In the terminal:")
        width = max(len(command) for command, _ in IN_THE_TERMINAL)
        lines += [f"  {command:<{width}}  {what}" for command, what in IN_THE_TERMINAL]
    return "\n".join(lines) + "\n"

