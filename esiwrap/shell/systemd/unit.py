"""The systemd template unit, a job's environment file, and installing both.

A job is an instance of `esiwrap@.service`. Its environment file holds the training command in
`ESIWRAP_COMMAND` (split into arguments like a POSIX shell, with `shlex`) and any
`ESIWRAP_<OPTION>` settings; esiwrap reads both from its environment. The file is written in the
syntax systemd's `EnvironmentFile=` and a POSIX shell agree on: `KEY="value"` with `\\`, `"`, `$`
and backtick escaped by a backslash.

Installing never overwrites a file that differs from what it would write unless forced, so
running it twice is harmless and an edited file is never lost silently.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from esiwrap.envvars import COMMAND_ENV
from esiwrap.errors import UsageError

TEMPLATE_NAME = "esiwrap@.service"
SHIPPED_EXEC = "/opt/esiwrap/venv/bin/esiwrap"
DEFAULT_ENV_DIR = "/etc/esiwrap"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
DROP_IN_NAME = "10-esiwrap-install.conf"
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class OptionDoc:
    """One esiwrap option as the environment file lists it (commented out, with its default)."""

    env: str
    default: str
    help: str


@dataclass(frozen=True)
class FileToWrite:
    path: Path
    text: str
    mode: int


@dataclass(frozen=True)
class Written:
    path: Path
    action: str  # created | replaced | unchanged | would create | would replace
    diff: str = ""  # dry run of a replacement: what would change


def shipped_template() -> str:
    """The unit as shipped (package data): ExecStart points at /opt/esiwrap/venv."""
    return resources.files("esiwrap.shell.systemd").joinpath(TEMPLATE_NAME).read_text(encoding="utf-8")


def render_unit(esiwrap_path: str = SHIPPED_EXEC, env_dir: str = DEFAULT_ENV_DIR) -> str:
    """The template with this installation's esiwrap and environment directory filled in."""
    text = shipped_template()
    text = _replace_line(text, "ExecStart=", "ExecStart=" + _unit_path(esiwrap_path, "esiwrap path"))
    env_file = _unit_path(env_dir.rstrip("/") or "/", "environment directory") + "/%i.env"
    return _replace_line(text, "EnvironmentFile=", "EnvironmentFile=" + env_file.replace("//", "/"))


def _replace_line(text: str, prefix: str, line: str) -> str:
    lines = text.splitlines(keepends=True)
    index = next(i for i, old in enumerate(lines) if old.startswith(prefix))
    lines[index] = line + "\n"
    return "".join(lines)


def _unit_path(path: str, what: str) -> str:
    """A path as a unit file wants it: absolute, `%` escaped (specifiers), no whitespace."""
    if not os.path.isabs(path):
        msg = f"{what} {path!r}: must be an absolute path"
        raise UsageError(msg)
    if any(ch.isspace() for ch in path):
        msg = f"{what} {path!r}: a path with spaces cannot go in a unit file; use a symlink without them"
        raise UsageError(msg)
    return path.replace("%", "%%")


def check_job_name(name: str) -> str:
    if not _JOB_NAME.match(name):
        msg = (f"job name {name!r}: use letters, digits and '-', '_', '.', ':' (e.g. llama-sft); "
               "it becomes esiwrap@NAME.service and /etc/esiwrap/NAME.env")
        raise UsageError(msg)
    return name


def quote_env_value(value: str) -> str:
    """`"value"` as systemd's EnvironmentFile= and `sh` both read it back unchanged."""
    escaped = "".join("\\" + ch if ch in '\\"$`' else ch for ch in value)
    return f'"{escaped}"'


def env_file_text(
    name: str,
    command: Sequence[str],
    settings: Mapping[str, str],
    options: Sequence[OptionDoc],
) -> str:
    """The job's environment file: the command, the settings given, every option commented."""
    lines = [
        f"# esiwrap@{name}.service: the job's command and settings (EnvironmentFile= of the unit).",
        f"# Edit, then `systemctl restart esiwrap@{name}`. Syntax: KEY=\"value\"; inside the quotes",
        "# put a backslash before \\ \" $ and `. esiwrap and the command see every variable here.",
        "",
        "# The training command, split into arguments like a POSIX shell (quote what has spaces).",
        f"{COMMAND_ENV}={quote_env_value(shlex.join(command))}",
    ]
    if settings:
        lines += ["", "# Set at install time."]
        lines += [f"{key}={quote_env_value(value)}" for key, value in settings.items()]
    lines += [
        "",
        "# esiwrap options, with their defaults (see `esiwrap --help`); uncomment to change one.",
        "# Tip: ESIWRAP_LOG_FILE on storage that outlives the instance (next to the checkpoints)",
        "# keeps `esiwrap report` possible after the instance is gone.",
    ]
    for opt in options:
        if opt.env not in settings:  # no comment after a value: systemd would keep it in the value
            lines += [f"# {opt.help}", f"#{opt.env}={opt.default}"]
    return "\n".join(lines) + "\n"


def drop_in_text(name: str, workdir: str) -> str:
    return (
        f"# Written by `esiwrap systemd-unit --install {name}`: the command runs where it was given.\n"
        "[Service]\n"
        f"WorkingDirectory={_unit_path(workdir, 'working directory')}\n"
    )


def check_setting(key: str) -> str:
    if not _ENV_KEY.match(key):
        msg = f"--setenv {key!r}: not a variable name; e.g. --setenv ESIWRAP_STOP_GRACE=60"
        raise UsageError(msg)
    if key == COMMAND_ENV:
        msg = f"--setenv {COMMAND_ENV}: give the command after `--` instead"
        raise UsageError(msg)
    return key


def resolve_command(command: Sequence[str], workdir: str, path_env: str) -> list[str]:
    """The command with its program made absolute: a unit has neither your PATH nor your cwd."""
    if not command:
        msg = "no command given; e.g. esiwrap systemd-unit --install llama -- /opt/venv/bin/python train.py"
        raise UsageError(msg)
    program = command[0]
    if os.sep in program:
        found: str | None = os.path.normpath(os.path.join(workdir, program))
    else:
        found = shutil.which(program, path=path_env)
    if found is None or not os.path.exists(found):
        msg = f"command {program!r}: not found (PATH={path_env}); give its absolute path"
        raise UsageError(msg)
    return [found, *command[1:]]


@dataclass(frozen=True)
class InstallPlan:
    name: str | None  # None: the template only
    files: tuple[FileToWrite, ...]
    esiwrap_path: str


def plan_install(
    *,
    name: str | None,
    command: Sequence[str],
    settings: Mapping[str, str],
    options: Sequence[OptionDoc],
    esiwrap_path: str,
    unit_dir: str = DEFAULT_UNIT_DIR,
    env_dir: str = DEFAULT_ENV_DIR,
    workdir: str | None = None,
) -> InstallPlan:
    """What installing writes: the template, and for a job its environment file and drop-in."""
    units = Path(unit_dir)
    files = [FileToWrite(units / TEMPLATE_NAME, render_unit(esiwrap_path, env_dir), 0o644)]
    if name is not None:
        check_job_name(name)
        # 0600: the environment file may hold credentials (cloud API keys for deadline look-ups).
        files.append(FileToWrite(Path(env_dir) / f"{name}.env",
                                 env_file_text(name, command, settings, options), 0o600))
        if workdir is not None:
            files.append(FileToWrite(units / f"esiwrap@{name}.service.d" / DROP_IN_NAME,
                                     drop_in_text(name, workdir), 0o644))
    return InstallPlan(name, tuple(files), esiwrap_path)


def apply_install(plan: InstallPlan, *, force: bool = False, dry_run: bool = False) -> list[Written]:
    """Write the plan's files; refuse (writing nothing) if any differs from what exists."""
    conflicts = [f.path for f in plan.files if _differs(f)]
    if conflicts and not force and not dry_run:
        shown = ", ".join(str(p) for p in conflicts)
        msg = (f"{shown}: exists with different content; see what would change with --dry-run, "
               "then use --force to replace it")
        raise UsageError(msg)
    done = []
    for file in plan.files:
        if not file.path.exists():
            action = "create"
        elif file.path in conflicts:
            action = "replace"
        else:
            done.append(Written(file.path, "unchanged"))
            continue
        if dry_run:
            needs = " (needs --force)" if action == "replace" and not force else ""
            diff = _diff(file) if action == "replace" else ""
            done.append(Written(file.path, f"would {action}{needs}", diff))
            continue
        try:
            _write_atomically(file)
        except OSError as exc:
            msg = (f"{file.path}: cannot write it ({exc.strerror or exc}); run as root (sudo), "
                   "or choose other directories with --unit-dir and --env-dir")
            raise UsageError(msg) from None
        done.append(Written(file.path, action + "d"))
    return done


def _differs(file: FileToWrite) -> bool:
    if not file.path.exists():
        return False
    try:
        return file.path.read_text(encoding="utf-8") != file.text
    except (OSError, UnicodeDecodeError):  # unreadable: not ours to overwrite silently
        return True


def _diff(file: FileToWrite) -> str:
    try:
        old = file.path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    except OSError as exc:
        return f"(cannot read: {exc})\n"
    new = file.text.splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, str(file.path), str(file.path) + " (new)"))


def _write_atomically(file: FileToWrite) -> None:
    file.path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{file.path.name}.", dir=file.path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(file.text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, file.mode)
        os.replace(tmp, file.path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def next_steps(plan: InstallPlan) -> list[str]:
    """The commands to run after installing (esiwrap never calls systemctl itself)."""
    if plan.name is None:
        return [
            "systemctl daemon-reload",
            f"{plan.esiwrap_path} systemd-unit --install JOB -- COMMAND...   # then, for each job",
        ]
    unit = f"esiwrap@{plan.name}.service"
    return [
        "systemctl daemon-reload",
        f"systemctl enable --now {unit}        # or `systemctl restart {unit}` if it already runs",
        f"systemctl status {unit}",
        f"journalctl -u {unit} -o cat -f",
        f"journalctl -u {unit} -o cat | {plan.esiwrap_path} report -",
    ]
