"""The shipped unit, a job's environment file, `esiwrap systemd-unit` and `bin/install-esiwrap`.

systemd itself checks what we write: `systemd-analyze verify` the installed unit, and systemd's
environment-file parser (reached through `systemd-analyze condition ConditionOSRelease=`, which
reads `$SYSTEMD_OS_RELEASE` with the same parser as `EnvironmentFile=`) reads the command back.

Run this file as a script to regenerate systemd/example.env after the options change.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, ROOT

from esiwrap.cli import option_docs
from esiwrap.errors import EXIT_USAGE
from esiwrap.shell.systemd.unit import env_file_text, quote_env_value, render_unit, shipped_template

pytestmark = pytest.mark.system

EXAMPLE_ENV = ROOT / "systemd" / "example.env"
EXAMPLE_COMMAND = ["/opt/venvs/train/bin/python", "/srv/llama/train.py", "--config", "/srv/llama/config.yaml"]
EXAMPLE_SETTINGS = {"ESIWRAP_LOG_FILE": "/mnt/checkpoints/llama/esiwrap.jsonl",
                    "ESIWRAP_SAVE_DURATION": "300", "ESIWRAP_STOP_GRACE": "120"}
INSTALLER = ROOT / "bin" / "install-esiwrap"


def example_env_text() -> str:
    return env_file_text("llama", EXAMPLE_COMMAND, EXAMPLE_SETTINGS, option_docs())


def systemd_unit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "esiwrap", "systemd-unit", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True,
                          text=True, timeout=60)


def stub_esiwrap(tmp_path: Path) -> Path:
    stub = tmp_path / "bin" / "esiwrap"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    return stub


def install_args(tmp_path: Path, stub: Path, *extra: str) -> list[str]:
    return ["--install", "llama", "--esiwrap-path", str(stub), "--unit-dir", str(tmp_path / "units"),
            "--env-dir", str(tmp_path / "env"), *extra]


def test_installed_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """The template and the installed instance (with its drop-in) verify with no output at all;
    the same check does speak up about a broken unit, so silence means something."""
    stub = stub_esiwrap(tmp_path)
    done = systemd_unit(*install_args(tmp_path, stub, "--", "/bin/true"))
    assert done.returncode == 0, done.stderr
    units = tmp_path / "units"
    for unit in (units / "esiwrap@.service", units / "esiwrap@llama.service"):
        checked = verify(unit)
        assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", ""), unit

    broken = tmp_path / "broken" / "esiwrap@.service"
    broken.parent.mkdir()
    broken.write_text(render_unit(str(tmp_path / "missing" / "esiwrap")).replace("KillMode=", "KilMode="))
    complaint = verify(broken)
    assert "not executable" in complaint.stderr and "KilMode" in complaint.stderr


def test_shipped_unit_has_a_reason_for_every_directive() -> None:
    """systemd/esiwrap@.service is the packaged unit; every group of directives has a comment
    above it, and the directives the design relies on are there."""
    shipped = shipped_template()
    assert (ROOT / "systemd" / "esiwrap@.service").read_text() == shipped
    previous = ""
    for line in shipped.splitlines():
        if re.match(r"^[A-Za-z]+=", line) and not line.startswith("Description="):
            assert previous.startswith("#") or re.match(r"^[A-Za-z]+=", previous), line
        previous = line
    for directive in ("Type=notify", "NotifyAccess=main", "EnvironmentFile=/etc/esiwrap/%i.env",
                      "KillMode=mixed", "Restart=on-failure", "SuccessExitStatus=75",
                      "RestartPreventExitStatus=2 66 76 78 126 127", "After=network-online.target",
                      "Wants=network-online.target", "SyslogIdentifier=esiwrap",
                      "LogExtraFields=ESIWRAP_JOB=%i", "TimeoutStopSec=5min", "WatchdogSec=3min"):
        assert f"\n{directive}\n" in shipped, directive


NASTY_COMMAND = ["/usr/bin/python3", "-c", 'print("a b")', "$HOME", "back\\slash", "it's",
                 "`tick`", "tab\there", "x=1 # not a comment"]


def test_environment_file_reads_back_through_systemd_and_sh(tmp_path: Path) -> None:
    """ESIWRAP_COMMAND as written is what systemd's own parser and a POSIX shell read back, and
    shlex splits that into the original arguments."""
    env_file = tmp_path / "job.env"
    env_file.write_text(env_file_text("job", NASTY_COMMAND, {"ESIWRAP_STOP_GRACE": "60"}, option_docs()))
    expected = shlex.join(NASTY_COMMAND)

    def systemd_reads(key: str, value: str) -> bool:
        quoted = (key + "=" + value).replace("\\", "\\\\").replace('"', '\\"')
        condition = f'ConditionOSRelease="{quoted}"'
        done = subprocess.run(["systemd-analyze", "condition", condition], capture_output=True, text=True,
                              env={**os.environ, "SYSTEMD_OS_RELEASE": str(env_file)}, timeout=60)
        return done.returncode == 0

    assert systemd_reads("ESIWRAP_COMMAND", expected)
    assert not systemd_reads("ESIWRAP_COMMAND", expected + " ")  # the check can fail
    assert systemd_reads("ESIWRAP_STOP_GRACE", "60")
    script = f'set -a; . {shlex.quote(str(env_file))}; printf %s "$ESIWRAP_COMMAND"'
    shell = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert shell.stdout == expected
    assert shlex.split(shell.stdout) == NASTY_COMMAND
    assert quote_env_value('a"b') == '"a\\"b"'


def test_esiwrap_runs_the_command_from_the_environment(tmp_path: Path) -> None:
    """With no command after `--`, esiwrap runs ESIWRAP_COMMAND (shell-style quoting); bad quoting
    is a one-line usage error."""
    env = {**os.environ, "ESIWRAP_COMMAND": "sh -c 'echo \"$0 $1\"; exit 3' 'first arg' second"}
    done = subprocess.run([PYTHON, "-m", "esiwrap"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 3 and done.stdout == "first arg second\n"
    env["ESIWRAP_COMMAND"] = "python 'train.py"
    bad = subprocess.run([PYTHON, "-m", "esiwrap"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == EXIT_USAGE and bad.stderr.count("\n") == 1 and "ESIWRAP_COMMAND" in bad.stderr


def test_example_env_is_what_install_writes() -> None:
    """systemd/example.env is current (regenerate: PYTHONPATH=tests/lib python
    tests/system/platforms/test_systemd_unit.py)."""
    assert EXAMPLE_ENV.read_text() == example_env_text()


def test_install_writes_refuses_and_forces(tmp_path: Path) -> None:
    """--install writes the template, JOB.env (0600) and a working-directory drop-in, and says
    which systemctl commands to run; again: unchanged; another command: refused (nothing
    written) until --force; --dry-run shows the difference and writes nothing."""
    stub = stub_esiwrap(tmp_path)
    workdir = tmp_path / "job"
    workdir.mkdir()
    job = ["--setenv", "ESIWRAP_STOP_GRACE=60", "--", "sh", "train.sh"]
    first = systemd_unit(*install_args(tmp_path, stub, *job), cwd=workdir)
    assert first.returncode == 0, first.stderr
    env_file = tmp_path / "env" / "llama.env"
    drop_in = tmp_path / "units" / "esiwrap@llama.service.d" / "10-esiwrap-install.conf"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert f'ESIWRAP_COMMAND="{shlex.join([_which("sh"), "train.sh"])}"' in env_file.read_text()
    assert 'ESIWRAP_STOP_GRACE="60"' in env_file.read_text()
    assert f"WorkingDirectory={workdir}\n" in drop_in.read_text()
    unit_text = (tmp_path / "units" / "esiwrap@.service").read_text()
    assert f"ExecStart={stub}\n" in unit_text and f"EnvironmentFile={tmp_path}/env/%i.env\n" in unit_text
    for expected in ("systemctl daemon-reload", "systemctl enable --now esiwrap@llama.service",
                     f"journalctl -u esiwrap@llama.service -o cat | {stub} report -"):
        assert expected in first.stdout

    again = systemd_unit(*install_args(tmp_path, stub, *job), cwd=workdir)
    assert again.returncode == 0 and again.stdout.count("unchanged") == 3

    before = env_file.read_text()
    other = systemd_unit(*install_args(tmp_path, stub, "--", "sh", "other.sh"), cwd=workdir)
    assert other.returncode == EXIT_USAGE and other.stderr.count("\n") == 1
    assert "--force" in other.stderr and env_file.read_text() == before
    preview = systemd_unit(*install_args(tmp_path, stub, "--dry-run", "--", "sh", "other.sh"), cwd=workdir)
    assert preview.returncode == 0 and "would replace (needs --force)" in preview.stdout
    assert '+ESIWRAP_COMMAND="' in preview.stdout and env_file.read_text() == before
    forced = systemd_unit(*install_args(tmp_path, stub, "--force", "--", "sh", "other.sh"), cwd=workdir)
    assert forced.returncode == 0 and "other.sh" in env_file.read_text()


def test_install_usage_errors(tmp_path: Path) -> None:
    """Bad job names, unknown programs, bad option values, a command without a job, a directory
    that cannot be written: one line, exit 2."""
    stub = stub_esiwrap(tmp_path)
    cases = [
        ["--install", "my job", "--esiwrap-path", str(stub), "--", "/bin/true"],
        install_args(tmp_path, stub, "--", "no-such-program-xyz"),
        install_args(tmp_path, stub, "--setenv", "ESIWRAP_STOP_GRACE=soon", "--", "/bin/true"),
        install_args(tmp_path, stub, "--setenv", "ESIWRAP_COMMAND=x", "--", "/bin/true"),
        ["--esiwrap-path", str(stub), "--", "/bin/true"],
        install_args(tmp_path, stub),
        ["--install", "llama", "--esiwrap-path", str(stub), "--unit-dir", str(stub / "units"),
         "--env-dir", str(tmp_path / "env"), "--", "/bin/true"],  # cannot write there
    ]
    for args in cases:
        done = systemd_unit(*args)
        assert done.returncode == EXIT_USAGE, (args, done.stderr)
        assert done.stderr.startswith("esiwrap: ") and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "units").exists()


def test_systemd_unit_prints_the_unit_for_this_esiwrap() -> None:
    """Without --install it prints the template, ExecStart pointing at the esiwrap next to this Python."""
    done = systemd_unit()
    assert done.returncode == 0
    assert done.stdout == render_unit(str(Path(PYTHON).parent / "esiwrap"))


def test_installer_dry_run_changes_nothing(tmp_path: Path) -> None:
    """bin/install-esiwrap --dry-run prints the venv, pip and unit steps and creates nothing."""
    done = subprocess.run(
        [str(INSTALLER), "--dry-run", "--prefix", str(tmp_path / "opt"), "--unit-dir", str(tmp_path / "u"),
         "--env-dir", str(tmp_path / "e"), "--link", str(tmp_path / "bin"),
         "--job", "llama", "--", "/bin/true"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith("+ ")]
    venv = tmp_path / "opt" / "venv"
    assert steps[:3] == [
        ["python3", "-m", "venv", str(venv)],
        [f"{venv}/bin/pip", "install", "--quiet", "--disable-pip-version-check", f"{ROOT}[volcengine]"],
        [f"{venv}/bin/esiwrap", "systemd-unit", "--install", "llama", "--esiwrap-path", f"{venv}/bin/esiwrap",
         "--unit-dir", str(tmp_path / "u"), "--env-dir", str(tmp_path / "e"), "--", "/bin/true"],
    ]
    assert "dry run: nothing was changed" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_installer_installs_for_real_and_again(tmp_path: Path) -> None:
    """A real install from this checkout into a temporary prefix: a working esiwrap, a unit that
    verifies, the link; a second look (--dry-run) finds every file unchanged."""
    common = [str(INSTALLER), "--prefix", str(tmp_path / "opt"), "--extras", "",
              "--unit-dir", str(tmp_path / "u"), "--env-dir", str(tmp_path / "e"),
              "--link", str(tmp_path / "bin"), "--job", "llama", "--", "/bin/true"]
    done = subprocess.run(common, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    esiwrap = tmp_path / "opt" / "venv" / "bin" / "esiwrap"
    version = subprocess.run([str(tmp_path / "bin" / "esiwrap"), "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("esiwrap ")
    assert f"ExecStart={esiwrap}\n" in (tmp_path / "u" / "esiwrap@.service").read_text()
    checked = verify(tmp_path / "u" / "esiwrap@llama.service")
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")

    again = subprocess.run([common[0], "--dry-run", *common[1:]], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("unchanged") == 3 and "already links" in again.stdout


def _which(program: str) -> str:
    import shutil

    found = shutil.which(program)
    assert found is not None
    return found


if __name__ == "__main__":
    EXAMPLE_ENV.write_text(example_env_text())
    print(f"wrote {EXAMPLE_ENV}", file=sys.stderr)
