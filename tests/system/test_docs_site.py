"""The documentation site builds with `mkdocs build --strict` (no broken link or anchor, no page
left out of the nav), and the front page (README.md) is short and reaches what a newcomer looks
for in one link each. The built site works opened from disk in Chromium with the network off: its
pictures load, it asks nothing of the network, names stay whole and code blocks scroll."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from browser import Chromium, Page, Png
from esiwrap_harness import PYTHON, ROOT

from esiwrap import events

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
    from esiwrap.cli.options import ALL_RUN_OPTIONS

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


# ------------------------------------------------------------------- in Chromium, from disk
NARROW = (1024, 768)  # viewport widths: a small laptop, a tablet (Material's drawer layout)
NAMES_IN_FIRST_COLUMN = """
Array.from(document.querySelectorAll("article table td:first-child code")).map(c => {
    const style = getComputedStyle(c);
    return {name: c.textContent, boxes: c.getClientRects().length,
            height: c.getBoundingClientRect().height,
            line: parseFloat(style.lineHeight) || 1.5 * parseFloat(style.fontSize)};
})"""
CLIPPED_CODE = """Array.from(document.querySelectorAll("article pre")).flatMap((pre, index) => {
    const column = pre.closest("article").getBoundingClientRect();
    const found = [];
    if (pre.getBoundingClientRect().right > column.right + 1) {
        found.push(`pre ${index} reaches past the column`);
    }
    for (const el of [pre, ...pre.querySelectorAll("*")]) {
        if (el.scrollWidth <= el.clientWidth + 1) continue;
        const style = getComputedStyle(el);
        const line = el.textContent.split("\\n")[0].slice(0, 60);
        const what = `pre ${index}: <${el.tagName.toLowerCase()}> ${line}`;
        if (!["auto", "scroll"].includes(style.overflowX)) {
            found.push(`${what}: cut, overflow-x ${style.overflowX}`);
            continue;
        }
        if (style.scrollbarWidth === "none") found.push(`${what}: scrolls with no scroll bar`);
        el.scrollLeft = el.scrollWidth;
        if (el.scrollLeft + el.clientWidth < el.scrollWidth - 1) {
            found.push(`${what}: its end cannot be scrolled to`);
        }
        el.scrollLeft = 0;
    }
    return found;
})"""


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    with Chromium(tmp_path_factory.mktemp("chromium")) as browser:
        yield browser


def html_pages(site: Path) -> list[Path]:
    """The site's pages a reader opens; not 404.html, which a web server shows in place of a missing
    page anywhere in the site and which therefore links its styles from the site's root."""
    return sorted(path for path in site.rglob("*.html") if path.name != "404.html")


def image(page: Page, name: str) -> dict[str, float]:
    """The page's <img> whose source ends in `name`: whether it loaded, its natural and shown sizes
    and where it is on the page, scrolled into view."""
    found = page.evaluate(f"""(() => {{
        const img = Array.from(document.images).find(i => i.getAttribute("src").endsWith({name!r}));
        if (!img) return null;
        img.scrollIntoView({{block: "center"}});  // clear of Material's sticky header
        const box = img.getBoundingClientRect();
        return {{complete: img.complete, naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight,
                 width: box.width, height: box.height, x: box.x + scrollX, y: box.y + scrollY}};
    }})()""")
    assert found is not None, f"no image {name} on the page"
    return found  # type: ignore[no-any-return]


def test_every_page_opened_from_disk_offline_loads_without_error(site: Path, chromium: Chromium) -> None:
    """Every built page, opened from disk (file://) with the network off, loads nothing but files
    of the site and data: URLs, and logs no failed load, console error or uncaught exception (the
    Mermaid script, Google's fonts and Material's file:// search index once failed here)."""
    page = chromium.open("about:blank", offline=True)
    found = []
    for path in html_pages(site):
        page.goto(path.as_uri())
        found += [f"{path.relative_to(site)}: {problem}" for problem in page.problems()]
        found += [f"{path.relative_to(site)}: asked the network for {url[:100]}"
                  for url in page.requested_urls() if not url.startswith(("file:", "data:"))]
    assert not found, "\n".join(found)


def test_the_design_pages_diagram_is_a_picture_that_loads_offline(site: Path, chromium: Chromium) -> None:
    """The design page's mode diagram is an image (no Mermaid, no script) that loaded from disk
    with the network off (naturalWidth > 0) and is drawn (its boxes' fill shows in a screenshot);
    at a narrow window it is shown at its own size, so its text stays at its 12-13 px."""
    for width in NARROW:
        page = chromium.open((site / "design.html").as_uri(), width=width, offline=True)
        diagram = image(page, "images/modes.svg")
        assert diagram["complete"] and diagram["naturalWidth"] > 0, diagram
        assert diagram["width"] == diagram["naturalWidth"], (width, diagram)
        assert page.evaluate("document.querySelectorAll('.mermaid, pre code.language-mermaid').length") == 0
        shot = Png(page.screenshot((diagram["x"], diagram["y"], diagram["width"], diagram["height"])))
        assert shot.share_of("#e8eaf6", tolerance=6) > 0.02  # the modes' boxes


def test_the_report_pages_timeline_picture_loads_offline(site: Path, chromium: Chromium) -> None:
    """The report page's timeline picture (a real run's, docs/images/timeline.svg) loaded from disk
    with the network off, at its natural 1200 px, and is drawn: the training lane's steps show
    in a screenshot of it; the picture links to itself at full size."""
    page = chromium.open((site / "observe" / "report.html").as_uri(), offline=True)
    timeline = image(page, "images/timeline.svg")
    assert timeline["complete"] and timeline["naturalWidth"] == 1200, timeline
    shot = Png(page.screenshot((timeline["x"], timeline["y"], timeline["width"], timeline["height"])))
    assert shot.share_of("#6baed6", tolerance=16) + shot.share_of("#9ecae1", tolerance=16) > 0.02
    assert page.evaluate("document.querySelector('a > img[src$=\"images/timeline.svg\"]')"
                         ".parentElement.getAttribute('href')") == "../images/timeline.svg"


@pytest.mark.parametrize("width", NARROW)
def test_event_names_are_never_broken_at_a_narrow_window(site: Path, chromium: Chromium, width: int) -> None:
    """On the events reference at a narrow window, every event name in a table's first column is
    drawn as one box one line high (never `child_start` / `ed`), and every event is there."""
    page = chromium.open((site / "reference" / "events.html").as_uri(), width=width, offline=True)
    names = page.evaluate(NAMES_IN_FIRST_COLUMN)
    assert {name["name"] for name in names} == set(events.DOCS)
    broken = [name for name in names if name["boxes"] != 1 or name["height"] > 1.5 * name["line"]]
    assert not broken, broken


@pytest.mark.parametrize("width", NARROW)
def test_no_code_block_is_cut_off(site: Path, chromium: Chromium, width: int) -> None:
    """On every page at a narrow window, no code or log block is wider than the text column, and
    an element of one whose content is wider than it lets it scroll (overflow-x auto or scroll,
    with a scroll bar) all the way to the end of its longest line."""
    page = chromium.open("about:blank", width=width, offline=True)
    found = []
    for path in html_pages(site):
        page.goto(path.as_uri())
        found += [f"{path.relative_to(site)} at {width} px: {problem}"
                  for problem in page.evaluate(CLIPPED_CODE)]
    assert not found, "\n".join(found)


def test_a_code_block_shows_that_its_line_goes_on(site: Path, chromium: Chromium) -> None:
    """Where scroll bars show only while scrolling, a long line still says it goes on: the right
    edge of a block that scrolls is shaded, and the shade is gone once it is scrolled to the end
    (getting-started's widest log, at 1024 px)."""
    page = chromium.open((site / "getting-started.html").as_uri(), width=1024, offline=True)
    box = page.evaluate("""(() => {
        const code = Array.from(document.querySelectorAll("article pre > code"))
            .reduce((a, b) => b.scrollWidth - b.clientWidth > a.scrollWidth - a.clientWidth ? b : a);
        code.scrollIntoView({block: "center"});  // clear of Material's sticky header
        code.id = "long-line";
        const r = code.getBoundingClientRect();
        return {x: r.right + scrollX, y: r.top + scrollY};
    })()""")

    def edge_brightness() -> float:
        # 3 x 4 px at the right edge, in the block's top padding: no text there
        shot = Png(page.screenshot((box["x"] - 5, box["y"] + 2, 3, 4)))
        pixels = [shot.pixel(x, y) for y in range(shot.height) for x in range(shot.width)]
        return sum(sum(p) / 3 for p in pixels) / len(pixels)

    before = edge_brightness()
    page.evaluate("(c => { c.scrollLeft = c.scrollWidth; })(document.getElementById('long-line'))")
    after = edge_brightness()
    assert before < after - 20, (before, after)
