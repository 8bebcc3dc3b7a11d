"""The reference pages and `--help` come from the option registry and the event list: the committed
pages are what `scripts/gen_reference.py` writes, every option has its section, help and
description, and `esiwrap --help` shows where to start and the sections as groups (`--help-all`
describes each)."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from esiwrap_harness import PYTHON, ROOT

from esiwrap import envvars, errors
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
from esiwrap.optiontypes import SECTIONS, Option

DOCS = ROOT / "docs"
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
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_pages_are_current() -> None:
    """Each committed page (options, environment variables, events) is exactly what the
    generator writes from the code now: a changed option, variable or event without a
    regenerated page fails here, with the difference."""
    gen = generator()
    for page in gen.BLOCKS:
        committed = (DOCS / page).read_text(encoding="utf-8")
        fresh = gen.generated(page, committed)
        diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                            f"docs/{page} (committed)", f"docs/{page} (generated)", n=1))
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
    for other in gen.BLOCKS:
        if other != page:
            shutil.copy(DOCS / other, tmp_path / "docs" / other)
    gen.DOCS = tmp_path / "docs"
    assert gen.stale_pages() == [page]
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and copy.read_text(encoding="utf-8") == text


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
                 errors.EXIT_NO_PROGRESS, errors.EXIT_USAGE, errors.EXIT_FAILURE):
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
