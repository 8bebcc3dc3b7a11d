"""Deadline sources `cli` and `env`, the chain's choice, and `esiwrap deadline`."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from esiwrap_harness import PYTHON

from esiwrap.core.values import Answer, Deadline, winner
from esiwrap.errors import EXIT_NO_DEADLINE, EXIT_OK, UsageError
from esiwrap.sources import registry
from esiwrap.sources.chain import ask
from esiwrap.sources.local import MLP_VAR, SAGEMAKER_VAR, CliSource, env_sources
from esiwrap.sources.registry import build_sources, source_values

NOW = 1_790_000_000.0


def by_name(environ: dict[str, str], lead: float = 1800.0) -> dict[str, Answer]:
    return {a.source: a for a in (ask(s, NOW) for s in env_sources(environ, lead))}


@pytest.mark.parametrize("raw", ["1790003600", " 1790003600\n", "1790003600.0", "1790003600000"])
def test_mlp_env_tolerates_whitespace_floats_and_ms(raw: str) -> None:
    """The ML platform's variable in seconds or ms, padded or fractional, is the same time."""
    answer = by_name({MLP_VAR: raw})["env:MLP"]
    assert answer.deadline is not None and answer.deadline.at == 1_790_003_600.0
    assert answer.deadline.raw == raw.strip()


def test_sagemaker_lead_is_applied_and_recorded() -> None:
    """Capacity blocks start terminating 30 minutes early: the lead comes off and is logged."""
    answer = by_name({SAGEMAKER_VAR: "1790003600"})["env:SAGEMAKER"]
    assert answer.deadline is not None
    assert answer.deadline.at == 1_790_003_600.0 - 1800.0
    assert answer.deadline.lead_s == 1800.0


def test_garbage_env_value_is_unavailable_with_reason() -> None:
    """A garbage value is a reason, not a crash; an unset one is the expected case."""
    answers = by_name({MLP_VAR: "tomorrow"})
    assert answers["env:MLP"].deadline is None
    assert "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP='tomorrow'" in answers["env:MLP"].reason
    assert not answers["env:MLP"].expected
    assert answers["env:SAGEMAKER"].expected


def test_earliest_answer_wins_and_cli_overrides() -> None:
    """Discovery picks the earliest deadline; --deadline beats every other source."""
    late = Deadline(at=NOW + 7200, source="env:MLP")
    early = Deadline(at=NOW + 3600, source="env:SAGEMAKER")
    cli = Deadline(at=NOW + 9000, source="cli")
    assert winner([Answer(late.source, late), Answer(early.source, early)]) == early
    assert winner([Answer("cli", cli), Answer(early.source, early)]) == cli
    assert winner([Answer("env:MLP", reason="not set")]) is None


def test_deadline_flag_skips_discovery() -> None:
    """With --deadline, no other source is even asked."""
    sources = build_sources(["cli", "env"], source_values(deadline="+1h"), {MLP_VAR: "1"}, NOW)
    assert [s.name for s in sources] == ["cli"]
    assert isinstance(sources[0], CliSource)


def test_a_failing_source_is_an_answer_not_an_exception() -> None:
    """A buggy source becomes a reason in the chain; training is never taken down by it."""

    class Broken:
        name = "broken"
        period_s = None

        def resolve(self, now: float) -> Deadline:
            raise KeyError("oops")

    answer = ask(Broken(), NOW)
    assert answer.deadline is None and "KeyError" in answer.reason


def run_deadline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (MLP_VAR, SAGEMAKER_VAR)}
    return subprocess.run([PYTHON, "-m", "esiwrap", "deadline", *args], capture_output=True,
                          text=True, env={**clean, **env}, timeout=30)


@pytest.mark.system
def test_deadline_command_reports_each_source_and_the_winner() -> None:
    """`esiwrap deadline --json`: every source's answer, the winner, exit 0."""
    soon = int(time.time()) + 3600
    done = run_deadline("--json", "--sources", "env", env={MLP_VAR: str(soon), SAGEMAKER_VAR: "x"})
    assert done.returncode == EXIT_OK, done.stderr
    report = json.loads(done.stdout)
    assert report["source"] == "env:MLP" and report["epoch"] == soon
    mlp, sagemaker = report["sources"]
    assert mlp["ok"] and mlp["raw"] == str(soon)
    assert not sagemaker["ok"] and "'x'" in sagemaker["reason"]


@pytest.mark.system
def test_deadline_command_without_any_deadline_exits_3() -> None:
    """No source knows: one line per source and a hint, exit 3."""
    done = run_deadline("--sources", "env", env={})
    assert done.returncode == EXIT_NO_DEADLINE
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("env:MLP") and "not set" in lines[0]
    assert "pass --deadline" in lines[-1]


class _KnowsCapacity:
    """A source that knows the capacity's kind but has no deadline (a spot VM without a notice)."""

    name = "probe"
    period_s = None

    def __init__(self, capacity: object, deadline: Deadline | None = None) -> None:
        self.capacity = capacity
        self.deadline = deadline

    def resolve(self, now: float) -> Deadline:
        from esiwrap.errors import SourceUnavailable

        if self.deadline is None:
            raise SourceUnavailable("no notice", expected=True)
        return self.deadline


def test_answers_carry_the_capacity_kind_a_source_knows() -> None:
    """The kind of capacity travels in the answer, with a deadline or without one; the deadline's
    own kind wins over the source's; a value that is not a kind is dropped."""
    assert ask(_KnowsCapacity("spot"), NOW).capacity == "spot"
    assert ask(_KnowsCapacity("cheap"), NOW).capacity is None
    spot_end = Deadline(at=NOW + 60, source="probe", capacity="spot")
    assert ask(_KnowsCapacity("on-demand", spot_end), NOW).capacity == "spot"
    answer = by_name({MLP_VAR: "1790003600"})["env:MLP"]
    assert answer.capacity == "reserved"
    assert ask(CliSource("+2h", NOW), NOW).capacity == "reserved"


def test_a_nodes_capacity_kind_survives_the_wire() -> None:
    """Another node's answer keeps its capacity kind across the relay; garbage there is dropped."""
    from esiwrap.sources import remote

    sent = Answer("node:abcd1234/aws-spot", reason="no notice", expected=True, capacity="spot")
    assert remote.from_fields(remote.to_fields(sent), NOW) == sent
    fields = remote.to_fields(sent) | {"capacity": ["spot"]}
    back = remote.from_fields(fields, NOW)
    assert back is not None and back.capacity is None


CLOSED = "http://127.0.0.1:9"
IN_A_SLURM_JOB = {"SLURM_JOB_ID": "42"}  # slurm builds its source only inside a job


def built_names(names: list[str] | tuple[str, ...], **values: str) -> list[str]:
    """The names the sources built for `names` report themselves as (built, not asked: every
    metadata client points at a closed port)."""
    urls = {"metadata_url": CLOSED, "aws_metadata_url": CLOSED, "azure_metadata_url": CLOSED,
            "gcp_metadata_url": CLOSED}
    sources = build_sources(names, source_values(**urls, **values), IN_A_SLURM_JOB, NOW, explain=True)
    return [s.name for s in sources]


def test_every_name_a_source_reports_is_a_word_of_sources() -> None:
    """Every output names a source as it reports itself (`env:MLP`, `volcengine-spot`): each such
    name is accepted by `--sources`, in any case, and asks that source alone."""
    reported = built_names(registry.KNOWN_SOURCES) + built_names(["cli"], deadline="+2h")
    assert set(reported) == {"env:MLP", "env:SAGEMAKER", "slurm", "volcengine", "volcengine-spot",
                             "aws-spot", "azure", "gcp", "cli"}
    for name in reported:
        assert registry.parse_source_names(name.lower()) == [name]
        given = {"deadline": "+2h"} if name == "cli" else {}  # cli says nothing without --deadline
        assert built_names([name], **given) == [name]


def test_env_is_both_variables_and_a_source_named_twice_is_asked_once() -> None:
    """`env` is `env:MLP` and `env:SAGEMAKER`; `env,env:MLP` asks the ML platform's variable once."""
    values, environ = source_values(), {MLP_VAR: "1790003600"}
    assert [s.name for s in build_sources(["env"], values, environ, NOW)] == ["env:MLP", "env:SAGEMAKER"]
    names = registry.parse_source_names("env:MLP, ENV, env:mlp")
    assert names == ["env:MLP", "env"]
    assert [s.name for s in build_sources(names, values, environ, NOW)] == ["env:MLP", "env:SAGEMAKER"]
    (alone,) = build_sources(registry.parse_source_names("env:mlp"), values, environ, NOW)
    assert ask(alone, NOW).deadline is not None


@pytest.mark.parametrize("text", ["env:XYZ", "node:1a2b3c4d/env:MLP", " , "])
def test_a_name_no_source_reports_is_refused_with_the_known_ones(text: str) -> None:
    """A name no source has (another node's answers come from that node, not from `--sources`) is
    one line listing the known names."""
    with pytest.raises(UsageError, match="unknown source; choose from cli,env,env:MLP,env:SAGEMAKER,"):
        registry.parse_source_names(text)
