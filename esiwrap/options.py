"""The run options of `esiwrap [OPTIONS] -- COMMAND`: one table, read by the command line, `--help`,
the environment (`ESIWRAP_<NAME>`; the flag wins), the systemd job file, a Ray node's watch, the
simulator and `esiwrap report --what-if`.

    SOURCE_OPTIONS   --deadline, --sources, --refresh, then each deadline source's own (declared
                     beside the source, gathered by `esiwrap.deadline.registry`)
    RUN_OPTIONS      the plan, the save and the stop (the controller's configuration)
    LOG_OPTIONS, OBSERVE_OPTIONS

`resolve_options` turns flags and variables into values (a bad one is one line naming the input,
the value and a good example: `UsageError`); `controller_config` turns values into the decision
core's configuration. Nothing here starts anything.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from esiwrap import __version__
from esiwrap.choices import AFTER_SAVE, LOG_FORMATS, LOG_LEVELS, ON_SIGTERM
from esiwrap.deadline.parse import parse_when
from esiwrap.deadline.registry import DEFAULT_SOURCES, KNOWN_SOURCES, parse_source_names
from esiwrap.deadline.registry import OPTIONS as EACH_SOURCES_OPTIONS
from esiwrap.errors import UsageError
from esiwrap.optiontypes import (
    Option,
    as_given,
    boolean,
    choice,
    file_in_existing_dir,
    port,
    positive_int,
    seconds,
)
from esiwrap.policy import PolicyConfig
from esiwrap.signals import signal_label, signal_number

if TYPE_CHECKING:
    from esiwrap.controller import ControllerConfig

SAVE_SIGNALS = ("SIGUSR1", "SIGUSR2")
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL")


# ---------------------------------------------------------------------------------- parsers
def _quantile(text: str) -> float:
    if text.strip().lower() == "max":
        return 1.0
    value = float(text)
    if not 0.0 < value <= 1.0:
        msg = "must be in (0, 1] or 'max'"
        raise ValueError(msg)
    return value


def _factor(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 1.0:
        msg = "must be a number of at least 1"
        raise ValueError(msg)
    return value


def _rate(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None  # by the capacity's kind
    value = float(text)
    if not math.isfinite(value) or value < 0.0:
        msg = "must be a number of interruptions a day, 0 or more"
        raise ValueError(msg)
    return value


def _state_file(text: str) -> str:
    path = file_in_existing_dir(
        text, name_a_file="name a file in it, e.g. /mnt/checkpoints/job/esiwrap-state.json",
        create="create it (next to the checkpoints)")
    directory = os.path.dirname(path)
    if not os.access(directory, os.W_OK):
        msg = f"directory {directory} is not writable"
        raise ValueError(msg)
    return path


def _upload_command(text: str) -> str:
    command = text.strip()
    unknown = sorted({m for m in re.findall(r"(?<!\$)\{(\w*)\}", command) if m not in ("path", "step")})
    if unknown:
        msg = (f"unknown placeholder {{{unknown[0]}}}: the command may use {{path}} (the checkpoint, "
               "shell-quoted) and {step}; e.g. --upload 'aws s3 cp --recursive {path} s3://bucket/job/{step}/'")
        raise ValueError(msg)
    return command


def _signal_parser(allowed: Sequence[str]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        signum = signal_number(text)
        if signum is None or signal_label(signum) not in allowed:
            msg = f"must be one of {', '.join(allowed)}"
            raise ValueError(msg)
        return signum

    return parse


def _deadline_text(text: str) -> str:
    parse_when(text, time.time())  # validate now; the source parses again at launch
    return text


def _sources(text: str) -> list[str]:
    try:
        return parse_source_names(text)
    except UsageError:
        msg = f"unknown source name; choose from {','.join(KNOWN_SOURCES)}"
        raise ValueError(msg) from None


def _address(text: str) -> str:
    from esiwrap.endpoint import parse_address

    return parse_address(text)


def _status_file(text: str) -> str:
    if text.strip().lower() in ("auto", "none"):
        return text.strip().lower()
    return file_in_existing_dir(text)


# ---------------------------------------------------------------------------------- the tables
SOURCE_OPTIONS = (
    Option("--deadline", _deadline_text, None, "+2h",
           "expiry: epoch s/ms, ISO-8601 with offset, or +90s/+15m/+2h; overrides discovery"),
    Option("--sources", _sources, list(DEFAULT_SOURCES), ",".join(DEFAULT_SOURCES),
           "ordered deadline sources"),
    Option("--refresh", seconds, 300.0, "300", "seconds between deadline re-resolutions"),
    *EACH_SOURCES_OPTIONS,
)

RUN_OPTIONS = (
    Option("--redundant-time", seconds, 120.0, "120", "slack before the deadline for the insurance save"),
    Option("--save-duration", seconds, 60.0, "60", "initial save-time estimate, until a save is measured"),
    Option("--unmeasured-factor", _factor, 6.0, "6",
           "until a save is measured, the insurance save assumes --save-duration times this"),
    Option("--interruption-rate", _rate, None, "1",
           "interruptions a day to guard against with periodic saves (Young/Daly); 0 turns them off; "
           "auto: by the capacity's kind (spot, reserved, unknown) and the job's nodes",
           show=lambda value: "auto" if value is None else f"{value:g}"),
    Option("--state-file", _state_file, None, "/mnt/checkpoints/job/esiwrap-state.json",
           "keep this job's measured step and save times here, for the next run"),
    Option("--probe-storage", boolean, True, "false",
           "before the first save, measure how fast the checkpoint directory's storage takes writes "
           "(a bounded write, removed after); with the checkpoint's size it plans the first save"),
    Option("--upload", _upload_command, None, "'aws s3 cp --recursive {path} s3://bucket/job/{step}/'",
           "after each completed save, run this shell command ({path}, {step}); exit 75 only once "
           "the last checkpoint's upload completed"),
    Option("--upload-duration", seconds, 60.0, "600",
           "the upload time expected until one is measured (times --unmeasured-factor for the "
           "insurance save)"),
    Option("--local-checkpoints-survive", boolean, False, "true",
           "this machine's local disk outlives the instance: no checkpoint_not_durable warning"),
    Option("--step-window", positive_int, 100, "100", "how many recent step intervals to learn from"),
    Option("--step-quantile", _quantile, 0.99, "0.99 or max", "quantile of the window used as the step time"),
    Option("--final-save", boolean, True, "true", "after the insurance save, keep training and save again"),
    Option("--final-margin", seconds, 5.0, "5", "slack before the deadline for final saves"),
    Option("--after-save", choice(AFTER_SAVE), "stop", "stop",
           "once the last planned save is acknowledged: stop the child, let it train until the stop "
           "must begin (linger: a later deadline is followed), or leave it running", AFTER_SAVE),
    Option("--stop-grace", seconds, 30.0, "30", "seconds between the stop signal and SIGKILL"),
    Option("--stop-budget", seconds, None, "30",
           "seconds the platform gives a stop before its SIGKILL (docker stop: 10, Kubernetes: 30); "
           "warns when a step, a save and --stop-grace do not fit"),
    Option("--on-sigterm", choice(ON_SIGTERM), "checkpoint", "checkpoint",
           "SIGTERM to esiwrap: save first, or just forward", ON_SIGTERM),
    Option("--signal", _signal_parser(SAVE_SIGNALS), int(signal.SIGUSR1), "SIGUSR1",
           "the save signal sent to registered trainers", SAVE_SIGNALS, show=signal_label),
    Option("--signal-child", boolean, False, "true",
           "send the save signal to the direct child, which handles it itself"),
    Option("--stop-signal", _signal_parser(STOP_SIGNALS), int(signal.SIGTERM), "SIGTERM",
           "first signal of the stop sequence", STOP_SIGNALS, show=signal_label),
)

LOG_OPTIONS = (
    Option("--log-file", as_given, None, "/var/log/esiwrap/job.jsonl", "also write JSON lines here"),
    Option("--log-format", choice(LOG_FORMATS), None, "json",
           "json (default when stderr is not a terminal) or console", LOG_FORMATS),
    Option("--log-level", choice(LOG_LEVELS), "info", "info", "least severe level written", LOG_LEVELS),
)

OBSERVE_OPTIONS = (
    Option("--metrics-file", file_in_existing_dir, None, "/var/lib/node_exporter/textfile/esiwrap.prom",
           "write Prometheus metrics here on every change (node_exporter textfile collector)"),
    Option("--metrics-port", port, None, "9478",
           "serve Prometheus metrics on this TCP port (0: any free port; see metrics_serving)"),
    Option("--metrics-address", _address, "127.0.0.1", "0.0.0.0",
           "address the metrics port listens on (0.0.0.0 or :: for every interface)"),
    Option("--status-file", _status_file, "auto", "/run/esiwrap/job.json",
           "where `esiwrap status` finds this run (auto: a per-user runtime directory; none: no file)"),
)

ALL_RUN_OPTIONS = SOURCE_OPTIONS + RUN_OPTIONS + LOG_OPTIONS + OBSERVE_OPTIONS
BOOLEAN_FLAGS = {opt.flag for opt in ALL_RUN_OPTIONS if opt.parse is boolean}  # also as --no-X
QUIET_NEGATIVES = {"--signal-child", "--local-checkpoints-survive"}  # off by default: --no-X not in --help
# Every long option of a run, and whether it takes a value (the command splitter must know).
RUN_FLAGS: dict[str, bool] = {
    **{opt.flag: opt.flag not in BOOLEAN_FLAGS for opt in ALL_RUN_OPTIONS},
    **{"--no-" + flag[2:]: False for flag in BOOLEAN_FLAGS},
    "--help": False, "--version": False,
}


# ---------------------------------------------------------------------------------- resolution
def resolve_options(
    ns: argparse.Namespace, options: Sequence[Option], environ: Mapping[str, str]
) -> dict[str, Any]:
    """Flag, else ESIWRAP_<NAME>, else default, by `Option.dest`; each parsed, a bad one raising
    `UsageError` with the line to show (`esiwrap.cli` exits 2 with it; a Ray node's watch
    reports it)."""
    values: dict[str, Any] = {}
    for opt in options:
        raw = getattr(ns, opt.dest, None)
        label = opt.flag
        if raw is None and environ.get(opt.env, "").strip():
            raw, label = environ[opt.env], opt.env
        if raw is None:
            values[opt.dest] = opt.default
            continue
        try:
            values[opt.dest] = opt.parse(raw)
        except (ValueError, KeyError) as exc:
            reason = _reason(exc)
            shown = "e.g." in reason or opt.example.split()[0] in reason
            example = "" if shown else f"; e.g. {opt.flag} {opt.example}"
            msg = f"{label} {raw!r}: {reason}{example}"
            raise UsageError(msg) from None
    return values


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if "invalid literal" in text or "could not convert" in text:
        return "not a number"
    if isinstance(exc, KeyError):
        return "unknown name"
    return text or type(exc).__name__


def source_values(**given: Any) -> dict[str, Any]:
    """The source options' defaults, with `given` (by `Option.dest`) on top: what
    `esiwrap.deadline.registry.build_sources` takes, for code that has no command line."""
    values = {opt.dest: opt.default for opt in SOURCE_OPTIONS}
    unknown = set(given) - set(values)
    if unknown:
        msg = f"not source options: {', '.join(sorted(unknown))}"
        raise KeyError(msg)
    return {**values, **given}


def policy_config(values: Mapping[str, Any]) -> PolicyConfig:
    return PolicyConfig(
        redundant_s=values["redundant_time"],
        save_duration_s=values["save_duration"],
        unmeasured_factor=values["unmeasured_factor"],
        interruption_rate_per_day=values["interruption_rate"],
        step_window=values["step_window"],
        step_quantile=values["step_quantile"],
        final_save=values["final_save"],
        final_margin_s=values["final_margin"],
        uploads=values["upload"] is not None,
        upload_duration_s=values["upload_duration"],
    )


def controller_config(values: Mapping[str, Any]) -> ControllerConfig:
    """The decision core's configuration from the run options' values: what the supervisor, the
    simulator and `--what-if` all run with."""
    from esiwrap.controller import ControllerConfig

    return ControllerConfig(
        policy=policy_config(values),
        save_signal=signal_label(values["signal"]),
        stop_signal=signal_label(values["stop_signal"]),
        stop_grace_s=values["stop_grace"],
        after_save=values["after_save"],
        on_sigterm=values["on_sigterm"],
        signal_child=values["signal_child"],
        stop_budget_s=values["stop_budget"],
        probe_storage=values["probe_storage"],
        # the state file lives next to the checkpoints: its storage, when no trainer names one
        probe_dir=os.path.dirname(values["state_file"]) if values["state_file"] else None,
        local_checkpoints_survive=values["local_checkpoints_survive"],
    )


# ---------------------------------------------------------------------------------- argparse
class OptionParser(argparse.ArgumentParser):
    """argparse with esiwrap's help layout; a bad command line raises `UsageError` (one line)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        msg = f"{message}; see esiwrap --help"
        raise UsageError(msg)


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, sized without importing shutil: argparse builds a formatter for
    every option it adds, and shutil brings the compression modules along (start-up time)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_terminal_columns() - 2)


def _terminal_columns() -> int:
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        pass
    try:
        return max(40, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        return 80


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Each option as a flag whose help names its variable and default; a boolean also as --no-X."""
    for opt in options:
        env_note = f" [env {opt.env}; default {opt.default_text}]"
        if opt.flag in BOOLEAN_FLAGS:
            negative = "--no-" + opt.flag[2:]
            parser.add_argument(opt.flag, dest=opt.dest, action="store_const", const="true",
                                help=opt.help + env_note)
            parser.add_argument(negative, dest=opt.dest, action="store_const", const="false",
                                help=argparse.SUPPRESS if opt.flag in QUIET_NEGATIVES else "the opposite")
        else:
            parser.add_argument(opt.flag, dest=opt.dest, metavar=opt.metavar, help=opt.help + env_note)


def build_run_parser() -> argparse.ArgumentParser:
    """`esiwrap [OPTIONS] -- COMMAND`: every run option, `--version`, and the command."""
    parser = OptionParser(
        prog="esiwrap",
        usage="esiwrap [OPTIONS] -- COMMAND [ARGS...]\n"
        "       esiwrap {deadline,report,status,systemd-unit} ...",
        description="Run COMMAND and checkpoint it at the last safe moment before the capacity it "
        "runs on is reclaimed. Exit codes: the child's own; 75 stopped after a completed "
        "checkpoint (with --upload: and its upload); 74 with --upload, the last checkpoint is complete "
        "on local storage only (its upload did not finish); 76 no acknowledged checkpoint before the "
        "deadline; 2 usage; 126/127 command not executable/not found; 1 esiwrap failed.",
    )
    parser.add_argument("--version", action="version", version=f"esiwrap {__version__}")
    add_options(parser, ALL_RUN_OPTIONS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command")
    return parser
