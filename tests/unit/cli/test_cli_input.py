"""What a user types before the command: the splitter between esiwrap's options and the command,
a mistyped subcommand, a log file that cannot be written, and an upload command that could never
work. Each mistake is one line, exit 2, before the child starts; a well-formed command reaches the
child untouched."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON

from esiwrap.cli import split_run_argv, warn_upload_without_path
from esiwrap.cli.options import ALL_RUN_OPTIONS, BOOLEAN_FLAGS, upload_names_checkpoint
from esiwrap.errors import EXIT_NOT_FOUND, EXIT_USAGE, UsageError
from esiwrap.optiontypes import resolve_options
from esiwrap.shell.log import capture_logs

PRINT_ARGV = "import os, sys; print(os.environ.get('FOO'), sys.argv[1:])"


@pytest.mark.parametrize(("argv", "options", "command"), [
    (["--", "python", "train.py"], [], ["python", "train.py"]),
    (["python", "train.py"], [], ["python", "train.py"]),
    (["env", "FOO=1", "--", "sh", "-c", "echo $FOO"], [], ["env", "FOO=1", "--", "sh", "-c", "echo $FOO"]),
    (["uv", "run", "--", "python", "train.py"], [], ["uv", "run", "--", "python", "train.py"]),
    (["--deadline", "+2h", "env", "FOO=1", "--", "x"], ["--deadline", "+2h"], ["env", "FOO=1", "--", "x"]),
    (["--deadline=+2h", "torchrun", "--nproc_per_node=2", "--", "train.py", "--", "x"], ["--deadline=+2h"],
     ["torchrun", "--nproc_per_node=2", "--", "train.py", "--", "x"]),
    (["--stop-grace", "5", "--final-save", "--", "--", "x"], ["--stop-grace", "5", "--final-save"],
     ["--", "x"]),
    (["--no-final-save", "--signal-child", "python"], ["--no-final-save", "--signal-child"], ["python"]),
    (["--dead", "+2h", "python"], ["--dead", "+2h"], ["python"]),  # a unique prefix, as argparse allows
    (["--deadline", "--", "python"], ["--deadline", "--"], ["python"]),  # the value, whatever it is
    (["--stop-grace", "5"], ["--stop-grace", "5"], []),
    (["--"], [], []),
    ([], [], []),
    (["-", "x"], [], ["-", "x"]),
])
def test_split(argv: list[str], options: list[str], command: list[str]) -> None:
    """Options up to the first `--` or the first word that is neither an option nor its value."""
    assert split_run_argv(argv) == (options, command)


def _esiwrap(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    return subprocess.run([PYTHON, "-m", "esiwrap", *args], capture_output=True, text=True, env=full,
                          cwd=cwd, timeout=60)


@pytest.mark.system
def test_words_before_a_later_double_dash_reach_the_child() -> None:
    """`esiwrap env FOO=1 python -c ... -- a`: env, its assignment and the later `--` all arrive."""
    done = _esiwrap("env", "FOO=1", PYTHON, "-c", PRINT_ARGV, "--", "a")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1 ['--', 'a']\n"


def test_the_command_argv_is_untouched(esiwrap) -> None:
    """The issue's shape (`esiwrap env FOO=1 -- sh -c 'echo $FOO'`) with a program that prints its
    arguments instead of complaining: the child runs exactly the argv given, `--` and all."""
    argv = ["sh", "-c", 'echo "args: $*"', "sh", "FOO=1", "--", "x"]
    run = esiwrap(*argv)
    assert run.wait_event("child_started", 30)["argv"] == argv
    run.wait_stdout("args: FOO=1 -- x\n", 30)
    assert run.finish(30) == 0


@pytest.mark.system
def test_options_then_command_then_double_dash() -> None:
    """`esiwrap --deadline +2h uv-like run -- python ...`: the option is esiwrap's, the rest the
    command's, a `--` included."""
    done = _esiwrap("--deadline", "+2h", "env", "FOO=2", PYTHON, "-c", PRINT_ARGV, "--", "--lr", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2 ['--', '--lr', '1']\n"
    assert '"source":"cli"' in done.stderr


@pytest.mark.system
def test_mistyped_subcommand_suggests_the_real_one(tmp_path: Path) -> None:
    """`esiwrap reprot run.jsonl`: one line with the suggestion, exit 2 (not 127)."""
    done = _esiwrap("reprot", "run.jsonl")
    assert done.returncode == EXIT_USAGE
    assert done.stderr.count("\n") == 1 and "did you mean `report`?" in done.stderr
    deadline = _esiwrap("dedline")
    assert deadline.returncode == EXIT_USAGE and "did you mean `deadline`?" in deadline.stderr


@pytest.mark.system
def test_a_subcommand_after_run_options_says_where_its_options_go() -> None:
    """`esiwrap --sources env:MLP deadline`: the subcommand with its options in front of it is
    one usage line with the order that works (exit 2), not a command that was not found (127);
    after `--` the word is a command, as always."""
    done = _esiwrap("--sources", "env:MLP", "deadline")
    assert done.returncode == EXIT_USAGE and done.stderr.count("\n") == 1
    assert "esiwrap deadline --sources env:MLP" in done.stderr
    after_dashes = _esiwrap("--deadline", "+2h", "--", "deadline")
    assert after_dashes.returncode == 127


@pytest.mark.system
def test_a_real_command_close_to_a_subcommand_still_runs(tmp_path: Path) -> None:
    """A command on PATH is run even when its name is close to a subcommand."""
    program = tmp_path / "reports"
    program.write_text("#!/bin/sh\necho ran reports\n")
    program.chmod(0o755)
    done = _esiwrap("reports", env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert done.returncode == 0 and done.stdout == "ran reports\n", done.stderr


@pytest.mark.system
def test_unknown_command_is_still_127() -> None:
    """A word far from every subcommand, not on PATH: command not found, 127, as before."""
    assert _esiwrap("no-such-command-esiwrap").returncode == EXIT_NOT_FOUND
    assert _esiwrap("--", "reprot").returncode == EXIT_NOT_FOUND  # after --, it is a command


@pytest.mark.system
@pytest.mark.parametrize(("where", "expected"), [
    ("missing/dir/run.jsonl", "directory {tmp}/missing/dir does not exist; create it (mkdir -p"),
    (".", "is a directory; name a file in it, e.g. {tmp}/esiwrap.jsonl"),
    ("file/run.jsonl", "{tmp}/file is not a directory"),
])
def test_log_file_that_cannot_be_written(tmp_path: Path, where: str, expected: str) -> None:
    """One line naming the path and the fix, exit 2, and the child never starts."""
    (tmp_path / "file").write_text("")
    marker = tmp_path / "started"
    path = str(tmp_path / where) if where != "." else str(tmp_path)
    for args, env, label in ((["--log-file", path], {}, "--log-file"),
                             ([], {"ESIWRAP_LOG_FILE": path}, "ESIWRAP_LOG_FILE")):
        done = _esiwrap(*args, "--", "touch", str(marker), env=env)
        assert done.returncode == EXIT_USAGE, done.stderr
        assert done.stderr.startswith(f"esiwrap: {label} {path!r}: ")
        assert expected.format(tmp=tmp_path) in done.stderr
        assert done.stderr.count("\n") == 1 and not marker.exists()


@pytest.mark.system
def test_log_file_on_a_read_only_mount(tmp_path: Path) -> None:
    """A directory esiwrap may not write (a read-only bind mount in a private mount namespace;
    root ignores permission bits): refused before the child starts."""
    logs = tmp_path / "logs"
    logs.mkdir()
    marker = tmp_path / "started"
    script = (f'mount --bind -o ro "{logs}" "{logs}" && exec "$0" -m esiwrap '
              f'--log-file "{logs}/run.jsonl" -- touch "{marker}"')
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, PYTHON],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert f"directory {logs} is not writable; fix its permissions" in done.stderr
    assert not marker.exists()


@pytest.mark.system
def test_log_file_in_an_existing_directory_is_written(tmp_path: Path) -> None:
    """The ordinary case still works: the file is created and holds the run's JSON lines."""
    log = tmp_path / "run.jsonl"
    done = _esiwrap("--log-file", str(log), "--", "true")
    assert done.returncode == 0, done.stderr
    assert '"event":"supervisor_exit"' in log.read_text()


@pytest.mark.parametrize("option", [o for o in ALL_RUN_OPTIONS if o.flag not in BOOLEAN_FLAGS],
                         ids=lambda o: o.flag)
def test_every_option_that_takes_a_value_keeps_it_from_the_command(option) -> None:
    """The splitter knows every run option: `--flag VALUE cmd` never takes VALUE for the command."""
    options, command = split_run_argv([option.flag, "value", "train.sh", "--flag-of-the-command"])
    assert options == [option.flag, "value"] and command == ["train.sh", "--flag-of-the-command"]


UPLOAD = next(opt for opt in ALL_RUN_OPTIONS if opt.flag == "--upload")
GOOD_UPLOAD = "e.g. --upload 'aws s3 cp --recursive {path} s3://bucket/job/{step}/'"


@pytest.mark.parametrize(("command", "reason"), [
    ("cp {path /x/", "unclosed '{' (character 4)"),
    ("cp path} /x/", "a '}' with no '{' before it (character 8)"),
    ("", "empty command"),
    ("   \t", "empty command"),
    ("aws s3 cp {path} 's3://bucket/{step}/", "no closing quotation"),
    ("aws s3 cp {path} s3://b/{stpe}/", "unknown placeholder {stpe}"),
])
def test_a_malformed_upload_command_is_refused_with_a_good_one(command: str, reason: str) -> None:
    """An upload command that could never run (or would copy nothing useful) fails before the
    child starts, not as exit 74 at the first upload: one line naming it, the reason and a good
    one, by flag and by variable alike (an empty variable is an unset one)."""
    with pytest.raises(UsageError) as caught:
        resolve_options(argparse.Namespace(upload=command), [UPLOAD], {})
    message = str(caught.value)
    assert message.startswith(f"--upload {command!r}: {reason}")
    assert message.endswith(GOOD_UPLOAD) and "\n" not in message
    if command.strip():
        with pytest.raises(UsageError, match=r"^ESIWRAP_UPLOAD "):
            resolve_options(argparse.Namespace(), [UPLOAD], {"ESIWRAP_UPLOAD": command})


@pytest.mark.parametrize("command", [
    "aws s3 cp --recursive {path} s3://bucket/job/{step}/",
    "rsync -a \"$ESIWRAP_CHECKPOINT_PATH\" backup:/job/",
    "gsutil cp -r ${ESIWRAP_CHECKPOINT_PATH} gs://b/${ESIWRAP_CHECKPOINT_STEP}/",
    "awk '{print $1}' {path}/index && f() { cp -r \"$1\" /mnt/backup; }; f {path}",
])
def test_an_upload_command_that_names_the_checkpoint_is_taken_as_given(command: str) -> None:
    """Braces that pair up (shell's own `${VAR}`, awk, a function) and either way of naming the
    checkpoint: accepted, and no warning."""
    assert resolve_options(argparse.Namespace(upload=command), [UPLOAD], {})["upload"] == command
    assert upload_names_checkpoint(command)
    with capture_logs() as logs:
        warn_upload_without_path(command)
    assert logs == []


@pytest.mark.parametrize("command", [
    "rsync -a /mnt/ckpt/ backup:/job/", "./upload.sh {step}", "echo $ESIWRAP_CHECKPOINT_PATHS",
])
def test_an_upload_command_that_names_no_checkpoint_is_a_warning(command: str) -> None:
    """Neither `{path}` nor `$ESIWRAP_CHECKPOINT_PATH`: it copies the same thing after every save,
    which is right only for a script that reads the variable or a directory of every checkpoint,
    so it runs, with `upload_without_path` naming the fix."""
    assert not upload_names_checkpoint(command)
    with capture_logs() as logs:
        warn_upload_without_path(command)
    (warning,) = logs
    assert warning["event"] == "upload_without_path" and warning["log_level"] == "warning"
    assert warning["upload"] == command and "{path}" in warning["fix"]
    assert "$ESIWRAP_CHECKPOINT_PATH" in warning["fix"]


@pytest.mark.system
def test_upload_commands_at_the_start_of_a_run(tmp_path: Path) -> None:
    """A malformed one: exit 2, one line, the command never starts. One that names no checkpoint:
    the run goes on, warned before the child starts."""
    marker = tmp_path / "started"
    done = _esiwrap("--deadline", "+1h", "--upload", "cp {path /x/", "--", "touch", str(marker))
    assert done.returncode == EXIT_USAGE and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("esiwrap: --upload 'cp {path /x/': unclosed '{'") and not marker.exists()
    done = _esiwrap("--deadline", "+1h", "--log-format", "json", "--upload", "rsync -a /ckpt/ backup:/",
                    "--", "touch", str(marker))
    assert done.returncode == 0 and marker.exists(), done.stderr
    names = [json.loads(line)["event"] for line in done.stderr.splitlines()]
    assert names.index("upload_without_path") < names.index("child_started")
