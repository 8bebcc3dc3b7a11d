"""The checkpoint's files as the shell handles them (`esiwrap.shell.checkpoints`): the built-in
check or only what is there, the manifest written beside the checkpoint (or, where that cannot be
written, in a local directory), the manifests read back, and the helper commands' placeholders;
and the options that start it all, each mistake one line, exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON

from esiwrap.cli.options import ALL_RUN_OPTIONS, check_combinations, controller_config
from esiwrap.core import manifest as manifests
from esiwrap.core.controller import WriteManifest
from esiwrap.core.state import Checkpoint, JobState
from esiwrap.errors import EXIT_USAGE, UsageError
from esiwrap.optiontypes import resolve_options
from esiwrap.shell import checkpoints
from esiwrap.shell import upload_process as helper

T0 = 1_800_000_000.0


def write(tmp_path: Path, checkpoint: Path, step: int = 7) -> tuple[str, str]:
    state = JobState(steps=(1.0,), updated_at=T0, checkpoint=Checkpoint(step, T0, str(checkpoint)),
                     checkpoint_durable="upload")
    return checkpoints.write_manifest(WriteManifest(step, str(checkpoint), T0, "r1", 10, 1, "torch", state))


def test_the_manifest_is_written_beside_the_checkpoint_and_reads_back(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt" / "global_step_7"
    checkpoint.mkdir(parents=True)
    written, error = write(tmp_path, checkpoint)
    assert error == "" and written == str(tmp_path / "ckpt" / "esiwrap-manifest.global_step_7.json")
    back = manifests.parse(Path(written).read_text(), T0 + 1)
    assert (back.step, back.path, back.run_id, back.bytes, back.verified) == \
        (7, str(checkpoint), "r1", 10, "torch")
    assert back.state is not None and back.state.checkpoint == Checkpoint(7, T0, str(checkpoint))


def test_a_directory_that_cannot_be_written_gets_the_manifest_elsewhere(tmp_path: Path) -> None:
    """Where the checkpoint's directory cannot take the manifest (here: it is not a directory),
    it goes to a private local directory, and the error is said."""
    (tmp_path / "not-a-dir").write_bytes(b"x")
    written, error = write(tmp_path, tmp_path / "not-a-dir" / "latest.pt")
    assert error and Path(written).is_file() and not written.startswith(str(tmp_path))
    assert manifests.parse(Path(written).read_text(), T0).step == 7


def test_manifests_are_read_back_and_the_broken_ones_named(tmp_path: Path) -> None:
    """Every *.json under the directory: complete manifests, and each other file with why."""
    good = manifests.render(5, "/ckpt/a", T0, run_id="r1")
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "esiwrap-manifest.json").write_text(good)
    (tmp_path / "6").mkdir()
    (tmp_path / "6" / "esiwrap-manifest.json").write_text(good[:40])
    (tmp_path / "7.json").write_text(json.dumps({"format": "something else"}))
    (tmp_path / "notes.txt").write_text("not looked at")
    found, rejected = checkpoints.read_manifests(str(tmp_path), T0)
    assert [m.step for m in found] == [5] and found[0].source == "5/esiwrap-manifest.json"
    assert dict(rejected).keys() == {"6/esiwrap-manifest.json", "7.json"}
    assert "not JSON" in dict(rejected)["6/esiwrap-manifest.json"]


def test_the_built_in_check_off_counts_only_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"12345")
    verdict = checkpoints.check(str(tmp_path), 3, builtin=False)
    assert verdict.ok and verdict.files == 1 and verdict.bytes == 5 and "off" in verdict.checked
    broken = tmp_path / "model.pt"
    broken.write_bytes(b"PK\x03\x04 cut")
    assert not checkpoints.check(str(broken), 3, builtin=True).ok


def test_the_previous_checkpoint_is_gone_only_when_it_was_named_and_is_not_there(tmp_path: Path) -> None:
    assert not checkpoints.previous_gone("")
    assert not checkpoints.previous_gone(str(tmp_path))
    assert checkpoints.previous_gone(str(tmp_path / "global_step_1"))


def test_helper_commands_get_their_placeholders_quoted() -> None:
    line = helper.render("cp {path} s3://b/{step}/ && cp {manifest} {dir}", "/ck pt/x", 9,
                         manifest="/ck pt/m.json", directory="/tmp/d")
    assert line == "cp '/ck pt/x' s3://b/9/ && cp '/ck pt/m.json' /tmp/d"


def values(**flags: str) -> dict[str, object]:
    import argparse

    from esiwrap.cli.options import build_run_parser

    argv = [word for flag, value in flags.items() for word in (f"--{flag.replace('_', '-')}", value)]
    ns: argparse.Namespace = build_run_parser().parse_args(argv)
    return resolve_options(ns, ALL_RUN_OPTIONS, {})


def test_verification_is_on_by_default_and_off_with_none() -> None:
    assert controller_config(values()).verifies
    assert not controller_config(values(verify_builtin="none")).verifies
    assert controller_config(values(verify_builtin="none", verify="true")).verifies
    assert controller_config(values(verify="true")).policy.verify_command
    with_upload = controller_config(values(upload="cp {path} /b/{step}"))
    assert with_upload.manifests and not controller_config(values()).manifests


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("verify", "check {paht}", "unknown placeholder {paht}"),
    ("restore", "aws s3 cp s3://b/{stp}/ {path}", "unknown placeholder {stp}"),
    ("restore", "  ", "empty command"),
    ("restore_manifests", "aws s3 cp --recursive s3://b/ /tmp/x", "{dir}"),
    ("upload", "cp {path} {manifest} {dir}", "unknown placeholder {dir}"),
])
def test_a_helper_command_with_a_wrong_placeholder_is_a_usage_error(flag: str, value: str, said: str) -> None:
    with pytest.raises(UsageError) as raised:
        values(**{flag: value})
    assert said in str(raised.value) and f"--{flag.replace('_', '-')}" in str(raised.value)


def test_restore_manifests_alone_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="give --restore CMD too"):
        check_combinations(values(restore_manifests="cp -r /b/. {dir}"))
    check_combinations(values(restore_manifests="cp -r /b/. {dir}", restore="cp /b/{step} {path}"))


@pytest.mark.system
def test_a_restore_command_with_a_typo_stops_before_the_command_starts() -> None:
    done = subprocess.run([PYTHON, "-m", "esiwrap", "--restore", "aws s3 cp s3://b/{stpe}/ {path}", "--",
                           "true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "{stpe}" in done.stderr and "--restore" in done.stderr


def test_a_checkpoint_that_lost_files_since_it_was_verified_counts_as_deleted(tmp_path: Path) -> None:
    """verl's rotation deletes an old step's actor/ and leaves the step's directory: fewer files
    than when it was verified."""
    step = tmp_path / "global_step_3"
    (step / "actor").mkdir(parents=True)
    for name in ("model.pt", "optim.pt", "fsdp_config.json"):
        (step / "actor" / name).write_bytes(b"x")
    (step / "data.pt").write_bytes(b"x")
    assert not checkpoints.previous_gone(str(step), 4)
    for name in ("model.pt", "optim.pt", "fsdp_config.json"):
        (step / "actor" / name).unlink()
    assert checkpoints.previous_gone(str(step), 4) and not checkpoints.previous_gone(str(step), None)


def test_manifests_beside_checkpoints_that_are_gone_are_removed(tmp_path: Path) -> None:
    kept, rotated = tmp_path / "global_step_2", tmp_path / "global_step_1"
    kept.mkdir()
    written = {str(path): str(tmp_path / manifests.file_name(str(path))) for path in (kept, rotated)}
    for manifest in written.values():
        Path(manifest).write_text("{}")
    assert checkpoints.remove_stale_manifests(written) == [str(rotated)]
    assert Path(written[str(kept)]).exists() and not Path(written[str(rotated)]).exists()
