"""The reference pages and `--help` come from the option registry and the event list: the committed
pages are what `scripts/gen_reference.py` writes, every option has its section, help and
description, and `esiwrap --help` shows the sections as groups (`--help-all` describes each)."""

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
from esiwrap.cli.options import ALL_RUN_OPTIONS, BOOLEAN_FLAGS, QUIET_NEGATIVES, RUN_FLAGS
from esiwrap.optiontypes import SECTIONS

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


@pytest.mark.system
def test_help_groups_the_options_by_section_one_line_each() -> None:
    """`esiwrap --help`: one group per section, in order, each listing its options' flags (a
    boolean as --[no-]X); short enough to scan: under 80 lines of at most 80 columns; it says
    where the rest is."""
    text = esiwrap_help("--help")
    titles = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[a-z][a-z ,]*:", line)]
    assert titles[-len(SECTIONS):] == [section.title for section in SECTIONS]
    for section in SECTIONS:
        group = text.split(f"\n{section.title}:\n", 1)[1].split("\n\n", 1)[0]
        for opt in (o for o in ALL_RUN_OPTIONS if o.section == section.key):
            shown = f"--[no-]{opt.flag[2:]}" if opt.flag in BOOLEAN_FLAGS - QUIET_NEGATIVES else opt.flag
            assert re.search(rf"^  {re.escape(shown)}\b", group, re.MULTILINE), (section.title, shown)
    lines = text.splitlines()
    assert len(lines) < 80 and max(len(line) for line in lines) <= 80
    assert "--help-all" in text and "docs/reference/options.md" in text


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
    assert RUN_FLAGS["--help-all"] is False
    assert len(text.splitlines()) > 2 * len(esiwrap_help("--help").splitlines())
