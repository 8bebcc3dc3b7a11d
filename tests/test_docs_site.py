"""The documentation site builds with `mkdocs build --strict` (no broken link or anchor, no page
left out of the nav), and the front page (README.md) is short and reaches what a newcomer looks
for in one link each."""

from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from esiwrap_harness import PYTHON, ROOT

pytestmark = pytest.mark.system

DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")
# What a user's page never shows: a path from a development machine, and the wording of how the
# work was organised (issues, rounds, sessions). The Development page and the benchmarks' history
# are about exactly that, and are left out.
NOT_FOR_USERS = {
    "a development path": re.compile(r"/work/|/root/|/tmp/pytest-|worktree|/home/[\w.-]+|/Users/[\w.-]+"),
    "internal wording": re.compile(r"\bissue #?\d+|\bthis round\b|\bround \d|\bstop \d+|\bsession\b",
                                   re.IGNORECASE),
}
# A process's session and a login session are the words of the trade, not of our work.
TECHNICAL_SESSION = re.compile(r"\b(?:own|new|login) session\b|\bsession token\b", re.IGNORECASE)
ABOUT_DEVELOPMENT = frozenset({"development.html", "benchmarks-history.html"})
TAG = re.compile(r"<(?!!--)[^>]+>")


class Ids(HTMLParser):
    """Every id="..." of a page: the anchors a link can land on."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([PYTHON, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(out)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


class _ConfigLoader(yaml.SafeLoader):
    """mkdocs.yml as data: a `!!python/name:` tag (an extension's formatter) is left as None."""


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def test_the_site_builds_strictly_with_every_page_in_the_nav(site: Path) -> None:
    """`mkdocs build --strict` succeeds with no warning; every Markdown file under docs/ is in the
    nav, once, and became a page."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_ConfigLoader)
    listed = nav_pages(config["nav"])
    files = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == files and len(set(listed)) == len(listed)
    for page in files:
        assert (site / page.replace(".md", ".html")).is_file(), page


def test_the_site_has_a_page_for_each_platform_and_reference(site: Path) -> None:
    """The pages the issue names exist in the built site, with their titles."""
    wanted = {
        "platforms/volcengine.html": "Volcengine", "platforms/sagemaker.html": "SageMaker",
        "platforms/aws.html": "AWS", "platforms/azure.html": "Azure", "platforms/gcp.html": "GCP",
        "platforms/slurm.html": "Slurm", "platforms/kubernetes.html": "Kubernetes",
        "platforms/skypilot.html": "SkyPilot", "running/systemd.html": "systemd",
        "running/container.html": "container", "running/several-nodes.html": "Several nodes",
        "uploads-and-resumes.html": "Uploads and resumes", "observe/index.html": "Observing a run",
        "reference/options.html": "Options", "reference/environment.html": "Environment variables",
        "reference/events.html": "Events", "reference/exit-codes.html": "Exit codes",
        "reference/signals.html": "Signals", "design.html": "Design", "development.html": "Development",
        "getting-started.html": "Getting started", "trainer.html": "trainer API",
        "policy.html": "How the moment is chosen",
    }
    for page, title in wanted.items():
        html = (site / page).read_text(encoding="utf-8")
        assert re.search(r"<h1[^>]*>[^<]*" + re.escape(title), html), page


def test_the_front_page_is_short_and_one_link_from_what_a_newcomer_wants(site: Path) -> None:
    """README.md: at most 150 lines; the two set-up commands and the docs command; the five lines
    and the exit-code table on the page itself; one link each to the Slurm page, the exit codes,
    the option list and how the first save is planned; every link to the docs lands on an existing
    page and anchor of the built site."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for command in ("scripts/demo.sh", "scripts/test.sh", "scripts/docs.sh"):
        assert command in readme
    assert "esi.step_done(step)" in readme and "| **75** |" in readme
    links = LINK.findall(readme)
    for wanted in ("docs/platforms/slurm.md", "docs/reference/exit-codes.md", "docs/reference/options.md",
                   "docs/policy.md#before-the-first-save-the-checkpoints-size-and-the-storages-speed"):
        assert wanted in links, wanted
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), link
        if path.startswith("docs/") and path.endswith(".md"):
            page = site / path.removeprefix("docs/").replace(".md", ".html")
            parser = Ids()
            parser.feed(page.read_text(encoding="utf-8"))
            assert not anchor or anchor in parser.ids, link


def test_the_generated_options_page_reaches_every_option_by_its_anchor(site: Path) -> None:
    """The options reference in the built site has an anchor per option (its name, e.g.
    #stop-grace), the targets of links from the other pages and of `esiwrap --help`'s pointer."""
    from esiwrap.options import ALL_RUN_OPTIONS

    parser = Ids()
    parser.feed((site / "reference" / "options.html").read_text(encoding="utf-8"))
    assert {opt.flag[2:] for opt in ALL_RUN_OPTIONS} <= parser.ids


def test_no_user_page_shows_a_development_path_or_internal_wording(site: Path) -> None:
    """No built page but the Development page and the benchmarks' history holds a development
    path (`/work/`, `/root/`, `/tmp/pytest-`, a worktree, a home directory) or the wording of how
    the work was organised (`issue 27`, `this round`, `round 2`, `stop 3`, `session`) anywhere in
    its HTML, comments and titles included; each one found is named with its page and line."""
    found = []
    for page in sorted(site.rglob("*.html")):
        name = str(page.relative_to(site))
        if name in ABOUT_DEVELOPMENT:
            continue
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            text = TECHNICAL_SESSION.sub("", line)
            for what, pattern in NOT_FOR_USERS.items():
                for match in pattern.finditer(text):
                    context = TAG.sub("", text[max(match.start() - 60, 0):match.end() + 60]).strip()
                    found.append(f"{name}:{number}: {what} {match.group()!r}: …{context}…")
    assert not found, "\n".join(found)
