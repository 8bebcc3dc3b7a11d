"""The reference pages and `--help` come from the option registry and the event list: the committed
pages are what `scripts/gen_reference.py` writes, every option has its section, help and
description, and `esiwrap --help` shows where to start and the sections as groups (`--help-all`
describes each). The documentation's pictures are what their scripts draw now: the modes from the
transition table, the timeline from the committed log of a real run (`scripts/gen_pictures.py`)."""

from __future__ import annotations

import difflib
import enum
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest
from esiwrap_harness import PYTHON, ROOT

from esiwrap import cli, envvars, errors
from esiwrap.cli.options import (
    ALL_RUN_OPTIONS,
    BOOLEAN_FLAGS,
    QUIET_NEGATIVES,
    RUN_FLAGS,
    START_HERE,
    build_run_parser,
    has_default,
    in_short_help,
)
from esiwrap.core.controller.modes import TRANSITIONS, Mode
from esiwrap.optiontypes import SECTIONS, Option

DOCS = ROOT / "docs"
SVG = "{http://www.w3.org/2000/svg}"
# The names every earlier release documented: they keep working, whatever is added.
FLAGS_SINCE_0_1 = (
    "--deadline", "--sources", "--refresh", "--sagemaker-lead", "--slurm-requeue", "--volcengine-endpoint",
    "--volcengine-region", "--volcengine-timeout", "--metadata-url", "--aws-metadata-url",
    "--azure-metadata-url", "--azure-ack", "--gcp-metadata-url", "--gcp-maintenance-notice",
    "--redundant-time", "--save-duration", "--unmeasured-factor", "--interruption-rate", "--state-file",
    "--probe-storage", "--upload", "--upload-duration", "--local-checkpoints-survive", "--step-window",
    "--step-quantile", "--final-save", "--final-margin", "--after-save", "--stop-grace", "--stop-budget",
    "--on-sigterm", "--signal", "--signal-child", "--stop-signal", "--log-file", "--log-format",
    "--log-level", "--metrics-file", "--metrics-port", "--metrics-address", "--status-file",
)


def generator() -> ModuleType:
    return script("gen_reference")


def script(name: str) -> ModuleType:
    """scripts/NAME.py, loaded afresh."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_pages_are_current() -> None:
    """Each committed page (options, environment variables, events, the design page's modes) and
    the modes' picture (docs/images/modes.svg) is exactly what the generator writes from the code
    now: a changed option, variable, event or move without a regenerated page fails here, with
    the difference."""
    gen = generator()
    fresh_texts = {name: write() for name, write in gen.FILES.items()}
    for page in gen.BLOCKS:
        fresh_texts[page] = gen.generated(page, (DOCS / page).read_text(encoding="utf-8"))
    for name, fresh in fresh_texts.items():
        committed = (DOCS / name).read_text(encoding="utf-8")
        diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                            f"docs/{name} (committed)", f"docs/{name} (generated)", n=1))
        assert committed == fresh, f"stale: run scripts/gen_reference.py\n{diff}"


def test_a_stale_page_is_caught_and_named(tmp_path: Path) -> None:
    """The check itself: a page whose generated block is edited by hand is reported stale by
    `--check` (exit 1, the page named), and regenerating restores it."""
    gen = generator()
    page = "reference/options.md"
    text = (DOCS / page).read_text(encoding="utf-8")
    edited = text.replace("`ESIWRAP_STOP_GRACE`", "`ESIWRAP_STOP_GRACEFULLY`", 1)
    assert edited != text
    assert gen.generated(page, edited) == gen.generated(page, text) == text
    copy = tmp_path / "docs" / page
    copy.parent.mkdir(parents=True)
    copy.write_text(edited, encoding="utf-8")
    copy_generated(gen, tmp_path / "docs", but=page)
    gen.DOCS = tmp_path / "docs"
    assert gen.stale_pages() == [page]
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and copy.read_text(encoding="utf-8") == text


def copy_generated(gen: ModuleType, docs: Path, but: str) -> None:
    """The committed generated pages and pictures, but one, copied under `docs`."""
    for name in [*gen.BLOCKS, *gen.FILES]:
        if name != but:
            (docs / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(DOCS / name, docs / name)


class Extra(enum.Enum):
    PAUSED = "paused"


def table_with_a_new_mode() -> dict[object, dict[str, object]]:
    """The transition table as it is, and one more mode with causes no table has held."""
    table: dict[object, dict[str, object]] = {mode: dict(moves) for mode, moves in
                                              generator().moves_only(TRANSITIONS).items()}
    table[Mode.RUNNING]["capacity paused"] = Extra.PAUSED
    table[Extra.PAUSED] = {"capacity back": Mode.RUNNING, "stop": Mode.STOPPING}
    return table


def test_the_modes_picture_is_drawn_from_the_table_when_the_generator_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The picture is read from `modes.TRANSITIONS` at run time, whatever its modes and causes: a
    table with a mode and causes added draws a box for the mode and a label for each cause, so the
    committed picture is then stale (`--check` names it) and regenerating writes the new one; the
    design page's table gains the new rows too."""
    gen = generator()
    picture = gen.MODES_SVG
    copy_generated(gen, tmp_path / "docs", but="")
    gen.DOCS = tmp_path / "docs"
    monkeypatch.setattr(gen, "TRANSITIONS", table_with_a_new_mode())
    svg = gen.modes_svg()
    root = ET.fromstring(svg)
    modes = {g.get("data-mode") for g in root.iter(f"{SVG}g") if g.get("class") == "mode"}
    causes = {"".join(text.itertext()) for g in root.iter(f"{SVG}g") if g.get("class") == "cause"
              for text in g.iter(f"{SVG}text")}
    assert modes == {mode.value for mode in Mode} | {"paused"}
    assert {"capacity paused", "capacity back", "save asked", "deadline gone"} <= causes
    assert gen.stale_pages() == ["design.md", picture]
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and (tmp_path / "docs" / picture).read_text(encoding="utf-8") == svg
    design = (tmp_path / "docs" / "design.md").read_text(encoding="utf-8")
    assert "`paused` (capacity paused)" in design


def test_a_stale_modes_picture_is_caught_and_named(tmp_path: Path) -> None:
    """A picture edited by hand, or missing, is reported stale by `--check` (exit 1, the picture
    named), and regenerating restores it."""
    gen = generator()
    picture = gen.MODES_SVG
    copy_generated(gen, tmp_path / "docs", but="")
    gen.DOCS = tmp_path / "docs"
    path = tmp_path / "docs" / picture
    committed = path.read_text(encoding="utf-8")
    path.write_text(committed.replace(">save asked<", ">save wanted<"), encoding="utf-8")
    assert gen.stale_pages() == [picture] and gen.main(["--check"]) == 1
    path.unlink()
    assert gen.stale_pages() == [picture]
    assert gen.main([]) == 0 and path.read_text(encoding="utf-8") == committed


@pytest.mark.parametrize("table", ["as it is", "with a new mode"])
def test_the_modes_picture_keeps_boxes_and_labels_apart(table: str) -> None:
    """The layout, for the table as it is and with a mode added: every mode is one box and every
    move (its causes together) one arrow with one label; no two boxes overlap, no label covers a
    box or another label, everything lies inside the picture, and its text is 12 px or more; the
    table as it is fits the page's text column (at most 720 px wide: a mode more may widen it)."""
    gen = generator()
    transitions = gen.moves_only(TRANSITIONS) if table == "as it is" else table_with_a_new_mode()
    diagram = gen.state_diagram(transitions, Mode.RUNNING, list(gen.EXIT_MODES))
    names = {mode.value for mode in transitions}
    names |= {target.value for moves in transitions.values() for target in moves.values()}
    assert set(diagram.boxes) == names
    assert len(diagram.arrows) == len({(m, t) for m, moves in transitions.items() for t in moves.values()})
    boxes = [box.bounds for box in diagram.boxes.values()]
    labels = [arrow.label.bounds for arrow in diagram.arrows]
    for i, one in enumerate(boxes + labels):
        for other in (boxes + labels)[i + 1:]:
            assert not gen._overlap(one, other), (one, other)
        left, top, right, bottom = one
        assert left >= 0 and top >= 0 and right <= diagram.width and bottom <= diagram.height
    assert gen.LABEL_SIZE >= 12 and gen.BOX_SIZE >= 12
    assert diagram.width <= 720 or table != "as it is"


def test_the_timeline_picture_is_what_esiwrap_report_draws_from_the_committed_run(tmp_path: Path) -> None:
    """docs/images/timeline.svg (the report page's picture) is exactly what `esiwrap report LOG
    --svg` draws now from the committed log of the demo run, docs/images/timeline-run.jsonl: a
    change to the timeline's drawing without `scripts/gen_pictures.py --render` fails here, at the
    first difference."""
    pictures = script("gen_pictures")
    fresh = tmp_path / "timeline.svg"
    assert cli.main(["report", str(pictures.LOG), "--svg", str(fresh)]) == 0
    drawn, committed = fresh.read_text(encoding="utf-8"), pictures.SVG.read_text(encoding="utf-8")
    at = next((i for i, (a, b) in enumerate(zip(drawn, committed, strict=False)) if a != b),
              min(len(drawn), len(committed)))
    around = slice(max(at - 80, 0), at + 80)
    assert drawn == committed, (
        f"stale: run scripts/gen_pictures.py --render; the first difference, at character {at}:\n"
        f" committed …{committed[around]}…\n drawn     …{drawn[around]}…")


def test_the_run_behind_the_timeline_picture_is_whole_and_names_no_machine() -> None:
    """The committed log is one whole run of the demo's trainer under esiwrap (its command, a
    deadline from the command line, completed saves, exit 75), and neither it nor the picture names
    a path of the machine it ran on or that machine: checkpoints under /ckpt, host gpu-node-1."""
    pictures = script("gen_pictures")
    text = pictures.LOG.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines()]
    by_event: dict[str, list[dict[str, object]]] = {}
    for line in lines:
        by_event.setdefault(str(line["event"]), []).append(line)
    started, = by_event["child_started"]
    assert started["argv"][:2] == ["python", "examples/tiny_trainer.py"] and started["host"] == pictures.HOST
    assert by_event["deadline_resolved"][0]["source"] == "cli"
    assert [line["kind"] for line in by_event["save_completed"]][-1] == "final"
    assert by_event["trainer_attached"][0]["checkpoint_dir"] == "/ckpt"
    assert by_event["supervisor_exit"][0]["code"] == errors.EXIT_CHECKPOINTED
    for body in (text, pictures.SVG.read_text(encoding="utf-8")):
        assert not re.search(r"/work/|/root|/tmp/|/home/|worktree|\.venv", body)


def test_the_picture_script_replaces_every_scratch_path_and_the_host_name() -> None:
    """The script's scrubbing: a scratch path anywhere in a line (nested, inside longer text) becomes
    its neutral name, the longest first; a value that is the host name becomes gpu-node-1; and what
    is left over is found (a host name only as a whole word)."""
    pictures = script("gen_pictures")
    places = {"/tmp/x/job/ckpt": "/ckpt", "/tmp/x/job": "/job"}
    line = {"event": "e", "host": socket.gethostname(), "argv": ["python", "--ckpt-dir", "/tmp/x/job/ckpt"],
            "settings": {"--state-file": "/tmp/x/job/ckpt/state.json", "--log": "/tmp/x/job/e.jsonl"},
            "why": "saved to /tmp/x/job/ckpt/latest.pt", "step": 3}
    assert pictures.neutral(line, places) == {
        "event": "e", "host": "gpu-node-1", "argv": ["python", "--ckpt-dir", "/ckpt"],
        "settings": {"--state-file": "/ckpt/state.json", "--log": "/job/e.jsonl"},
        "why": "saved to /ckpt/latest.pt", "step": 3}
    assert pictures.leftovers('{"path": "/tmp/x/job/a"}', ["/tmp/x/job", "/srv"]) == ["/tmp/x/job"]
    assert pictures.leftovers('{"host": "vm", "why": "vmstat"}', ["vm"]) == ["vm"]
    assert pictures.leftovers('{"why": "vmstat, kvm"}', ["vm"]) == []


def test_every_option_has_a_section_a_short_help_and_a_description() -> None:
    """The registry holds what the reference and --help show: a known section, a help that fits a
    help line, a description, and a page that exists."""
    keys = [section.key for section in SECTIONS]
    for opt in ALL_RUN_OPTIONS:
        assert opt.section in keys, opt.flag
        assert opt.help and len(opt.help) <= 45, (opt.flag, opt.help)
        assert len(opt.doc.split()) >= 8, opt.flag
        if opt.see:
            assert (DOCS / opt.see.partition("#")[0]).is_file(), (opt.flag, opt.see)
    for section in SECTIONS:
        assert (DOCS / section.page).is_file(), section
        assert any(opt.section == section.key for opt in ALL_RUN_OPTIONS), section


def test_every_esiwrap_variable_is_described() -> None:
    """Each `ESIWRAP_…` name of `envvars` (beyond the options' own) has a meaning in the environment
    reference."""
    names = {value for name, value in vars(envvars).items()
             if name.isupper() and isinstance(value, str) and value.startswith(envvars.PREFIX)
             and value != envvars.PREFIX}
    options = {opt.env for opt in ALL_RUN_OPTIONS}
    assert names - options - set(envvars.DESCRIPTIONS) == set()
    page = (DOCS / "reference" / "environment.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in page for name in names | options)


def test_the_flags_and_variables_of_earlier_releases_still_work() -> None:
    """No flag or variable was renamed: each one documented before still parses."""
    assert set(FLAGS_SINCE_0_1) <= set(RUN_FLAGS)
    by_flag = {opt.flag: opt for opt in ALL_RUN_OPTIONS}
    for flag in FLAGS_SINCE_0_1:
        assert by_flag[flag].env == "ESIWRAP_" + flag[2:].upper().replace("-", "_")


def esiwrap_help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run([PYTHON, "-m", "esiwrap", *args], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def short_help_groups() -> list[tuple[str, list[Option]]]:
    """`esiwrap --help`'s groups as the registry says they are: what most runs set, then each
    section's other options that are neither a platform's own setting nor an advanced knob."""
    by_flag = {opt.flag: opt for opt in ALL_RUN_OPTIONS}
    groups = [("start here", [by_flag[flag] for flag in START_HERE])]
    for section in SECTIONS:
        shown = [o for o in ALL_RUN_OPTIONS if o.section == section.key and in_short_help(o)
                 and o.flag not in START_HERE]
        if shown:
            groups.append((section.title, shown))
    return groups


def shown_flag(opt: Option) -> str:
    return f"--[no-]{opt.flag[2:]}" if opt.flag in BOOLEAN_FLAGS - QUIET_NEGATIVES else opt.flag


@pytest.mark.system
def test_help_starts_where_most_runs_start_and_fits_one_screen() -> None:
    """`esiwrap --help` at 80 columns fits one screen (at most 50 lines of at most 80 columns): the
    options most runs set first (`start here`: the deadline or its sources, the state file, the
    upload, the log), then each section's others, each option once with its default in brackets
    where it has one; the platforms' own settings and the advanced knobs are left to `--help-all`,
    which it names, and `esiwrap docs` says where the documentation is (a repository path would
    mean nothing to a user who installed the package)."""
    text = esiwrap_help("--help")
    lines = text.splitlines()
    assert len(lines) <= 50 and max(len(line) for line in lines) <= 80, len(lines)
    groups = short_help_groups()
    titles = [line[:-1] for line in lines if re.fullmatch(r"[a-z][a-z ,]*:", line)]
    assert titles == [title for title, _ in groups]
    for title, options in groups:
        group = text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0]
        assert re.findall(r"^  (--\S+)", group, re.MULTILINE) == [shown_flag(o) for o in options], title
        entries = re.split(r"\n(?=  --)", group)
        for opt, entry in zip(options, entries, strict=True):
            packed = " ".join(entry.split())
            assert packed.endswith(f"[{opt.default_text}]") == has_default(opt), (opt.flag, packed)
    hidden = [o for o in ALL_RUN_OPTIONS if not in_short_help(o)]
    assert {o.section for o in hidden} >= {"platforms"} and any(o.advanced for o in hidden)
    assert not [o.flag for o in hidden if re.search(rf"^  {re.escape(shown_flag(o))}\b", text, re.MULTILINE)]
    assert "--help-all" in text and "esiwrap docs" in text and "docs/" not in text


def test_options_left_out_of_help_still_parse() -> None:
    """A platform's setting or an advanced knob is only left out of `--help`'s list: the command
    line takes it (a prefix too) as before."""
    parser = build_run_parser()
    ns = parser.parse_args(["--metadata-url", "http://10.0.0.1", "--step-win", "5", "--no-azure-ack",
                            "--", "python", "train.py"])
    assert (ns.metadata_url, ns.step_window, ns.azure_ack) == ("http://10.0.0.1", "5", "false")
    assert ns.command == ["--", "python", "train.py"]


@pytest.mark.system
def test_help_names_every_exit_code_of_a_run() -> None:
    """`esiwrap --help` says what each of a run's own exit codes means, as the README's table does
    (78 was once left out of the help when it was added)."""
    text = " ".join(esiwrap_help("--help").split())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for code in (errors.EXIT_NOT_UPLOADED, errors.EXIT_CHECKPOINTED, errors.EXIT_SAVE_MISSED,
                 errors.EXIT_NO_PROGRESS, errors.EXIT_NOT_RESTORED, errors.EXIT_USAGE, errors.EXIT_FAILURE):
        assert re.search(rf"(; |: ){code} ", text), code
        assert f"| **{code}** |" in readme or f"| {code} |" in readme, code
    assert "126/127" in text


@pytest.mark.system
def test_help_all_describes_every_option_with_its_variable_and_default() -> None:
    """`esiwrap --help-all` (exit 0): the same groups, and each option's description, variable
    and default; the command splitter knows it (it takes no value)."""
    text = esiwrap_help("--help-all")
    packed = "".join(text.split())  # wrapped lines (also at hyphens) joined again

    def pack(words: str) -> str:
        return "".join(words.replace("`", "").split())

    for opt in ALL_RUN_OPTIONS:
        assert pack(f"[env {opt.env}; default {opt.default_text}]") in packed, opt.flag
        assert pack(opt.doc) in packed, opt.flag
    titles = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[a-z][a-z ,]*:", line)]
    assert titles[-len(SECTIONS):] == [section.title for section in SECTIONS]
    assert RUN_FLAGS["--help-all"] is False
    assert len(text.splitlines()) > 2 * len(esiwrap_help("--help").splitlines())
