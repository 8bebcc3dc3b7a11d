"""Starting the command as execvp would: a script without `#!` runs with /bin/sh, and an
"argument list too long" says whether esiwrap's own variables were the last straw."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON

from esiwrap.errors import EXIT_NOT_EXECUTABLE

pytestmark = pytest.mark.system

ESIWRAP = [PYTHON, "-m", "esiwrap"]
MAX_ARG_STRLEN = 32 * 4096  # Linux: the longest single argument or NAME=value


def executable(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    path.chmod(stat.S_IRWXU)
    return path


def test_a_script_without_a_shebang_runs_with_bin_sh(esiwrap, tmp_path: Path) -> None:
    """An executable text file with no `#!` line: the kernel refuses it (ENOEXEC); execvp, tini
    and every shell run it with /bin/sh, and so does esiwrap (it used to exit 126)."""
    script = executable(tmp_path / "train", b'echo "ran $0 with $# args: $*"\nexit 7\n')
    run = esiwrap("--", str(script), "a", "b c")
    assert run.finish(30) == 7
    assert run.stdout.decode() == f"ran {script} with 2 args: a b c\n"
    assert run.first("child_started")["argv"] == [str(script), "a", "b c"]


def test_a_binary_for_another_machine_is_not_given_to_the_shell(esiwrap, tmp_path: Path) -> None:
    """ENOEXEC from a file that is no script (an ELF header the kernel rejects): 126 and one line."""
    binary = executable(tmp_path / "trainer.bin", b"\x7fELF" + b"\x00" * 60)
    run = esiwrap("--", str(binary))
    assert run.finish(30) == EXIT_NOT_EXECUTABLE
    reason = run.first("command_failed")["reason"]
    assert "Exec format error" in reason and "another kind of machine" in reason


def failure_reason(stderr: str) -> str:
    """The reason of esiwrap's `command_failed` log line."""
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return str(next(e["reason"] for e in lines if e["event"] == "command_failed"))


def test_too_long_because_of_esiwraps_own_variable_says_so() -> None:
    """A PYTHONPATH just under the kernel's limit for one string runs without esiwrap; esiwrap's
    start-up hook in front of it is the last straw (E2BIG): the error names esiwrap's additions
    and the fix, in one line, exit 126; with that fix (ESIWRAP_HOOK=0: PYTHONPATH left alone) it runs."""
    env = {**os.environ, "PYTHONPATH": "/" + "x" * (MAX_ARG_STRLEN - len("PYTHONPATH=/") - 4)}
    assert subprocess.run(["true"], env=env, check=False).returncode == 0  # fine without esiwrap
    done = subprocess.run([*ESIWRAP, "--sources", "cli", "--", "true"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == EXIT_NOT_EXECUTABLE
    reason = failure_reason(done.stderr)
    assert "argument list too long, because of esiwrap's own variables" in reason
    assert "PYTHONPATH" in reason and "ESIWRAP_HOOK=0" in reason and "\n" not in reason
    hooks_off = subprocess.run([*ESIWRAP, "--sources", "cli", "--", "true"], env={**env, "ESIWRAP_HOOK": "0"},
                               capture_output=True, text=True, timeout=60, check=False)
    assert hooks_off.returncode == 0, hooks_off.stderr[-300:]  # the fix it names works


def padding(size: int) -> dict[str, str]:
    """`size` bytes of environment in variables short enough for the kernel's per-string limit."""
    return {f"PADDING{i}": "x" * min(100_000, size - i) for i in range(0, size, 100_000)}


def test_too_long_in_total_because_of_esiwraps_variables_says_so() -> None:
    """argv and environment right at the kernel's limit: esiwrap itself starts (it is exec'd with
    the same environment), its child does not, because of what esiwrap adds to it. The most
    environment esiwrap can still be started with is found by trying."""
    base = {**os.environ, "ESIWRAP_SOURCES": "cli"}
    command = [*ESIWRAP, "--", "true"]

    def starts(size: int) -> bool:
        try:
            proc = subprocess.Popen(command, env={**base, **padding(size)}, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        except OSError:
            return False
        proc.kill()
        proc.wait()
        return True

    low, high = 0, os.sysconf("SC_ARG_MAX")
    assert starts(low) and not starts(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if starts(middle) else (low, middle)
    done = subprocess.run(command, env={**base, **padding(low)}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == EXIT_NOT_EXECUTABLE, done.stderr[-500:]
    reason = failure_reason(done.stderr)
    assert "argument list too long, because of esiwrap's own variables" in reason, reason
    assert "ESIWRAP_SOCKET" in reason and "over the kernel's limit" in reason
