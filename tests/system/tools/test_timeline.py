"""`esiwrap report LOG --html/--svg` on a real run's log, rendered by headless Chromium.

The run: examples/tiny_trainer.py under esiwrap with the Volcengine fakes as its only deadline
source; a spot notice mid-run moves the deadline earlier, the insurance and the final save land
before it, esiwrap stops the trainer (exit 75). The page is opened in Debian's Chromium over the
DevTools protocol: the test reads the rendered geometry (what is where), looks at pixels of
screenshots, and keeps a full screenshot next to the page for people (timeline.png).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from browser import Chromium, Png
from esiwrap_harness import PYTHON, TINY_TRAINER, EsiwrapRun
from fakes.fixtures import CREDENTIALS, INSTANCE_ID, REGION, SCHEDULED_ID, rfc3339_in
from fakes.metadata import FakeMetadata
from fakes.volcengine_api import FakeVolcengineApi

from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.tools.timeline import COLORS

pytestmark = pytest.mark.system

SPOT_ITEM = "/latest/spot_instance_termination_time"


@dataclass
class Run:
    log: Path
    events: list[dict[str, Any]]
    code: int


@pytest.fixture(scope="module")
def moved_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("timeline")
    log = tmp / "run.jsonl"
    items = {"/latest/instance_id": INSTANCE_ID, "/latest/region_id": REGION}
    with FakeMetadata(items) as imds, FakeVolcengineApi() as api:
        api.add_instance(INSTANCE_ID, SCHEDULED_ID, expired_at=rfc3339_in(86400))
        started = time.time()
        release_at = started + 60  # beyond the run's end, on the picture's scale (see below)
        api.set_release(SCHEDULED_ID, rfc3339_in(release_at - time.time()))
        env = {**CREDENTIALS, "ESIWRAP_METADATA_URL": imds.url, "ESIWRAP_VOLCENGINE_ENDPOINT": api.url}
        run = EsiwrapRun([
            "--sources", "volcengine,volcengine-spot", "--refresh", "1", "--redundant-time", "10",
            "--save-duration", "1", "--final-margin", "2", "--log-level", "debug", "--log-file", str(log),
            "--", PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(tmp / "ckpt"), "--step-seconds", "0.3",
            "--save-seconds", "0.5"], env=env)
        try:
            run.wait_event("deadline_resolved", timeout=30, source="volcengine")
            run.wait_for(lambda e: e["event"] == "step_observed" and e.get("step", 0) >= 5, 90, "step 5")
            # The notice moves the deadline earlier however long torch took to start (before the
            # release), leaves the saves 25 s when it can (the insurance lands 10 s before it, so a
            # final save fits after a step a stalled node stretched to seconds), and keeps the run
            # long enough that the superseded release stays on the picture's scale (drawn when no
            # later than the run's end + 1.5 x its length: the run ends about 2.5 s before the
            # notice, so 30 s after the start puts the scale's edge past 67 s), whether torch
            # started in 2 s or 30.
            notice_at = min(max(time.time() + 25, started + 30), release_at - 8)
            imds.set(SPOT_ITEM, rfc3339_in(notice_at - time.time()))
            run.wait_event("deadline_changed", timeout=30, source="volcengine-spot")
            code = run.finish(timeout=90)
        finally:
            run.kill()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return Run(log, events, code)


GEOMETRY = """
(() => {
  const box = el => {
    const b = el.getBoundingClientRect();
    return {x: b.left, y: b.top, w: b.width, h: b.height};
  };
  const all = (sel, root = document) => Array.from(root.querySelectorAll(sel));
  return {
    svgs: all('svg').map(box),
    steps: all('rect.step').map(el => ({step: Number(el.dataset.step), ...box(el)})),
    deadlines: all('g.deadline').map(g => ({cls: g.getAttribute('class'), source: g.dataset.source,
      line: g.querySelector('line.deadline-line') ? box(g.querySelector('line.deadline-line')) : null,
      label: g.querySelector('text.deadline-label').textContent,
      moved: g.querySelector('text.deadline-moved')?.textContent ?? null})),
    saves: all('g.save').map(g => ({kind: g.dataset.kind, outcome: g.dataset.outcome,
      write: box(g.querySelector('rect.write')), signal: box(g.querySelector('path.signal-sent')),
      planned: g.querySelector('path.planned') ? box(g.querySelector('path.planned')) : null,
      label: g.querySelector('text').textContent})),
    signals: all('g.signal-mark').map(g => ({cls: g.getAttribute('class'),
      label: g.querySelector('text').textContent})),
    texts: all('svg text').map(el => ({text: el.textContent, ...box(el)})),
    lanes: all('rect.lane').map(el => ({cls: el.getAttribute('class'), ...box(el)})),
    title: document.title,
  };
})()
"""


def overlap(a: dict[str, float], b: dict[str, float]) -> float:
    width = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
    height = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
    return max(0.0, width) * max(0.0, height)


def test_timeline_page_renders_the_run_in_chromium(moved_run: Run, tmp_path: Path) -> None:
    """Every step, both deadlines, both saves (before the deadline that counted), the signals
    and the stop are drawn where the log says; labels do not collide; nothing is fetched."""
    assert moved_run.code == EXIT_CHECKPOINTED
    page_file, svg_file = tmp_path / "timeline.html", tmp_path / "timeline.svg"
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", str(moved_run.log), "--html", str(page_file),
                           "--svg", str(svg_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and f"wrote {page_file} (1 run)" in done.stderr
    svg = ET.parse(svg_file).getroot()  # well-formed XML on its own
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    page_text = page_file.read_text()
    assert "<script" not in page_text and "https://" not in page_text

    steps_logged = [e["step"] for e in moved_run.events if e["event"] == "step_observed"]
    kinds_logged = [e["kind"] for e in moved_run.events if e["event"] == "save_requested"]
    with Chromium(tmp_path) as browser:
        page = browser.open(page_file.as_uri())
        got = page.evaluate(GEOMETRY)
        full = page.screenshot()
        (tmp_path / "timeline.png").write_bytes(full)
        shot = Png(full)
        assert shot.width == 1280 and shot.height > 600

        assert got["title"].startswith("esiwrap timeline: ")
        (svg_box,) = got["svgs"]
        assert svg_box["w"] == pytest.approx(1200, abs=2)
        assert [s["step"] for s in got["steps"]] == steps_logged and len(steps_logged) > 20
        assert all(s["w"] > 0 for s in got["steps"])
        xs = [s["x"] for s in got["steps"]]
        assert xs == sorted(xs)

        old, new = got["deadlines"]  # the first value, replaced by the spot notice
        assert "superseded" in old["cls"] and old["source"] == "volcengine"
        assert "superseded" not in new["cls"] and new["source"] == "volcengine-spot"
        assert new["line"]["x"] < old["line"]["x"]  # moved earlier
        assert new["label"].startswith("deadline ") and old["label"].startswith("was ")
        assert new["moved"].startswith("moved −") and old["moved"] is None

        assert [s["kind"] for s in got["saves"]] == kinds_logged == ["insurance", "final"]
        for save in got["saves"]:
            assert save["outcome"] == "completed"
            assert save["signal"]["x"] <= save["write"]["x"]  # signal, then the boundary, then the write
            assert save["write"]["x"] + save["write"]["w"] < new["line"]["x"]  # landed before the deadline
            assert save["planned"] is not None
        assert got["saves"][0]["write"]["x"] < got["saves"][1]["write"]["x"]

        signal_classes = " ".join(s["cls"] for s in got["signals"])
        assert signal_classes.count("signal-signal") == 2
        assert "signal-stop" in signal_classes and "signal-exit" in signal_classes
        stop_labels = " ".join(s["label"] for s in got["signals"])
        assert "SIGTERM" in stop_labels and "esiwrap: exit 75" in stop_labels

        inside = [t for t in got["texts"] if t["x"] >= svg_box["x"] - 1 and t["y"] >= svg_box["y"] - 1
                  and t["x"] + t["w"] <= svg_box["x"] + svg_box["w"] + 1
                  and t["y"] + t["h"] <= svg_box["y"] + svg_box["h"] + 1]
        assert inside == got["texts"], "text drawn outside the picture"
        texts = got["texts"]
        clashes = [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:]
                   if overlap(a, b) > 4.0]
        assert clashes == [], "labels drawn over each other"

        assert all(url.startswith(("file:", "data:", "about:")) for url in page.requested_urls())

        # pixels, not just the DOM: the deadline's red along its line, a save's green, a step's blue
        saves_lane = next(lane for lane in got["lanes"] if "lane-saves" in lane["cls"])
        line_x = new["line"]["x"]
        red = Png(page.screenshot((line_x - 3, saves_lane["y"] + 4, 6, saves_lane["h"] - 8)))
        assert red.share_of(COLORS["deadline"]) > 0.12  # a 2.5 px line: at least one whole column of 6
        green = Png(page.screenshot(whole_pixels_inside(got["saves"][0]["write"], 4)))
        assert green.share_of(COLORS["completed"]) > 0.8
        blue = Png(page.screenshot(whole_pixels_inside(got["steps"][len(got["steps"]) // 2], 2)))
        assert max(blue.share_of(COLORS["step_a"]), blue.share_of(COLORS["step_b"])) > 0.8


def whole_pixels_inside(box: dict[str, float], inset_y: float) -> tuple[float, float, float, float]:
    """The columns that lie wholly inside a drawn box (its edges fall between pixels and are
    blended with the background: a save 7 px wide had 2 of its 7 columns half-green), at least
    one, and its rows less `inset_y` at the top and bottom."""
    left, right = math.ceil(box["x"]), math.floor(box["x"] + box["w"])
    if right - left < 1:
        left, right = math.floor(box["x"]), math.floor(box["x"]) + 1
    return (left, box["y"] + inset_y, right - left, box["h"] - 2 * inset_y)


def crowded_end(run_id: str, length_s: float, gaps_s: tuple[float, float, float]) -> list[dict[str, Any]]:
    """A run whose end is crowded in the signals lane: an insurance save, then the final save's
    signal to two pids, a warning, the stop signal, SIGKILL to what was left and both exits,
    `gaps_s` apart (the spacing a real stop has: a few seconds, or less)."""
    start = 1796000000.0
    events: list[dict[str, Any]] = []

    def log(t: float, name: str, level: str = "info", **fields: Any) -> None:
        stamp = datetime.fromtimestamp(start + t, timezone.utc).isoformat(timespec="milliseconds")
        events.append({"timestamp": stamp.replace("+00:00", "Z"), "level": level, "event": name,
                       "run_id": run_id, **fields})

    log(0, "child_started", pid=4250, argv=["python", "train.py"], host="vm", settings={})
    log(0.01, "deadline_resolved", source="cli", deadline=datetime.fromtimestamp(
        start + length_s + 4, timezone.utc).isoformat().replace("+00:00", "Z"), remaining_s=length_s + 4)
    log(2, "trainer_attached", pid=4250, rank=0, saves=True)
    t = length_s - sum(gaps_s) - 1
    for kind, at, step in (("insurance", t - 20, 10), ("final", t, 20)):
        log(at, "save_requested", reason="deadline", kind=kind, remaining_s=length_s - at, signal="SIGUSR1",
            pids=[4250, 4251])
        log(at + 0.2, "save_started", step=step, pid=4250, requested=True)
        log(at + 0.3, "save_completed", step=step, kind=kind, duration_s=0.1, path="/ckpt",
            remaining_s=length_s - at, requested=True)
    log(t + gaps_s[0] / 2, "stop_budget_too_small", level="warning", budget_s=10, needed_s=40, fix="raise it")
    t += gaps_s[0]
    log(t, "child_stopping", signal="SIGTERM", grace_s=30, reason="checkpoint complete")
    t += gaps_s[1]
    log(t, "child_killed", signal="SIGKILL", pids=[4251, 4252, 4253])
    t += gaps_s[2]
    log(t, "child_exited", pid=4250, code=None, signal="SIGTERM")
    log(t + 0.05, "supervisor_exit", code=75, reason="checkpoint complete", last_step=20, checkpoint_step=20)
    return events


SIGNAL_LABELS = """
(() => {
  const box = el => {
    const b = el.getBoundingClientRect();
    return {x: b.left, y: b.top, w: b.width, h: b.height};
  };
  return Array.from(document.querySelectorAll('svg g.run')).map(run => ({
    run: run.dataset.runId,
    svg: box(run.ownerSVGElement),
    lane: box(run.querySelector('rect.lane-signals')),
    labels: Array.from(run.querySelectorAll('text.signal-label'))
      .map(t => ({text: t.textContent, ...box(t)})),
  }));
})()
"""


def test_signal_labels_a_few_seconds_apart_never_overlap(tmp_path: Path) -> None:
    """Signals a few seconds (or less) apart at the end of runs from 30 s to an hour long: as
    Chromium renders them, no two labels of the signals lane share a pixel, and each lies inside
    its lane and the picture (the lane grows when the labels need more rows)."""
    spacings = [(30, (0.5, 0.5, 0.5)), (60, (1, 1, 1)), (60, (2, 3, 2)), (120, (4, 1, 3)), (600, (3, 3, 3)),
                (3600, (2, 2, 2))]
    log, page_file = tmp_path / "crowded.jsonl", tmp_path / "crowded.html"
    lines = [json.dumps(e) for i, (length, gaps) in enumerate(spacings)
             for e in crowded_end(f"crowded{i:05d}", length, gaps)]
    log.write_text("\n".join(lines) + "\n")
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", str(log), "--html", str(page_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with Chromium(tmp_path) as browser:
        runs = browser.open(page_file.as_uri()).evaluate(SIGNAL_LABELS)
    assert len(runs) == len(spacings)
    for run in runs:
        labels = run["labels"]
        named = " ".join(label["text"] for label in labels)
        assert all(word in named for word in ("SIGUSR1", "SIGTERM", "SIGKILL", "esiwrap: exit 75")), named
        clashes = [(a["text"], b["text"], overlap(a, b)) for i, a in enumerate(labels)
                   for b in labels[i + 1:] if overlap(a, b) > 0]
        assert clashes == [], (run["run"], clashes)
        lane, svg = run["lane"], run["svg"]
        for label in labels:
            where = (run["run"], label)
            assert lane["y"] <= label["y"] and label["y"] + label["h"] <= lane["y"] + lane["h"], where
            assert svg["x"] <= label["x"] and label["x"] + label["w"] <= svg["x"] + svg["w"], where


SVG = "{http://www.w3.org/2000/svg}"
PLAIN_RUN = [
    {"event": "child_started", "pid": 7, "argv": ["python", "train.py", "--name", "<a & b>"]},
    {"event": "trainer_attached", "pid": 7},
    {"event": "child_exited", "pid": 7, "code": 0, "signal": None},
    {"event": "supervisor_exit", "code": 0, "reason": "child exited"},
]


def svg_of(events: list[dict[str, Any]], tmp_path: Path) -> ET.Element:
    """`esiwrap report --svg` of a log holding these events, a second apart; the parsed SVG."""
    log, svg_file = tmp_path / "run.jsonl", tmp_path / "run.svg"
    lines = [json.dumps({"timestamp": f"2026-11-30T10:00:0{i}.000Z", "level": "info", "run_id": "r1", **e})
             for i, e in enumerate(events)]
    log.write_text("\n".join(lines) + "\n")
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", str(log), "--svg", str(svg_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return ET.parse(svg_file).getroot()


def test_a_log_without_steps_or_deadline_still_draws(tmp_path: Path) -> None:
    """An info-level log of a run with no deadline: the attached span, 'no deadline known',
    'no save'; the SVG is well-formed and the command line is escaped."""
    root = svg_of(PLAIN_RUN, tmp_path)
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert "no deadline known" in texts and "no save" in texts
    assert any("<a & b>" in t for t in texts)  # escaped in the file, intact once parsed
    spans = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "training-span"]
    assert len(spans) == 1


def test_a_deadline_past_the_year_9999_in_utc_still_draws(tmp_path: Path) -> None:
    """A deadline that parses but has no UTC calendar date (9999-12-31T23:59:59-12:00) is drawn
    and labelled as an epoch: formatting a time never raises (it used to end in a traceback)."""
    far = {"event": "deadline_resolved", "source": "cli", "deadline": "9999-12-31T23:59:59-12:00"}
    root = svg_of([PLAIN_RUN[0], far, *PLAIN_RUN[1:]], tmp_path)
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert any("epoch 253402343999" in t for t in texts), texts


def test_unwritable_output_is_one_line(tmp_path: Path) -> None:
    """--html into a directory that does not exist: one line naming the path, exit 2."""
    log = tmp_path / "l.jsonl"
    log.write_text(json.dumps({"timestamp": "2026-11-30T10:00:00.000Z", "level": "info", "run_id": "r",
                               "event": "child_started", "pid": 1, "argv": ["x"]}) + "\n")
    out = tmp_path / "no" / "x.html"
    done = subprocess.run([PYTHON, "-m", "esiwrap", "report", str(log), "--html", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(f"esiwrap: {tmp_path / 'no' / 'x.html'}: No such file or directory")


def test_a_resumed_run_says_where_it_started(tmp_path: Path) -> None:
    """A run whose trainer started from the state file's checkpoint (`resumed`) is marked in the
    training lane and in the subtitle with its start step; one that started further back
    (`resume_missed`) is marked as a missed resume, with the steps redone."""
    resumed = {"event": "resumed", "checkpoint_step": 54, "start_step": 54, "steps_redone": 0}
    root = svg_of([*PLAIN_RUN[:2], resumed, *PLAIN_RUN[2:]], tmp_path)
    (mark,) = [g for g in root.iter(f"{SVG}g") if g.get("class") == "resume"]
    assert mark.get("data-start-step") == "54" and mark.get("data-from-checkpoint") == "true"
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert "resumed at step 54 ✓" in texts and any("resumed at step 54" in t for t in texts if "run r1" in t)
    missed = {"event": "resume_missed", "checkpoint_step": 54, "start_step": 0, "steps_redone": 54,
              "causes": ["trainer.resume_mode is disable"]}
    root = svg_of([*PLAIN_RUN[:2], missed, *PLAIN_RUN[2:]], tmp_path)
    (mark,) = [g for g in root.iter(f"{SVG}g") if g.get("class") == "resume"]
    assert mark.get("data-from-checkpoint") == "false"
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert any(t.startswith("RESUME MISSED: started at step 0") and "54 steps redone" in t for t in texts)
