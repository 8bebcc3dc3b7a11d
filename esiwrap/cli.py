"""Command line: `esiwrap [OPTIONS] -- COMMAND...`, `esiwrap deadline`, and the other subcommands.

Every option can also come from `ESIWRAP_<NAME>` (the flag wins). Bad values stop here with exit
2 and one line naming the input, the bad value and a good example; nothing below this module
parses user text.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from esiwrap import __version__
from esiwrap.choices import AFTER_SAVE, LOG_FORMATS, LOG_LEVELS, ON_SIGTERM
from esiwrap.deadline import Answer, TimeParseError, ask_all, parse_duration, parse_when, winner
from esiwrap.deadline.metadata import AWS_METADATA_URL, VOLCENGINE_METADATA_URL
from esiwrap.deadline.registry import (
    DEFAULT_SOURCES,
    KNOWN_SOURCES,
    SourceSettings,
    build_sources,
    parse_source_names,
)
from esiwrap.envvars import COMMAND_ENV, LOG_FILE_ENV, PREFIX, STATUS_FILE_ENV
from esiwrap.errors import (
    EXIT_FAILURE,
    EXIT_NO_DEADLINE,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_USAGE,
    EsiwrapError,
    UsageError,
)
from esiwrap.policy import PolicyConfig
from esiwrap.signals import signal_label, signal_number

if TYPE_CHECKING:
    from esiwrap.deadline import Deadline
    from esiwrap.integrations.ray_nodes import NodeAnswers

SUBCOMMANDS = ("deadline", "report", "status", "systemd-unit")
SAVE_SIGNALS = ("SIGUSR1", "SIGUSR2")
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL")


@dataclass(frozen=True)
class Option:
    flag: str
    parse: Callable[[str], Any]
    default: Any
    example: str
    help: str
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return PREFIX + self.dest.upper()

    @property
    def default_text(self) -> str:
        value = self.default
        if value is None:
            return "none"
        if isinstance(value, list):
            return ",".join(value)
        if isinstance(value, bool):
            return "on" if value else "off"
        if self.dest in ("signal", "stop_signal"):
            return signal_label(value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    @property
    def metavar(self) -> str:
        if self.choices:
            return "{" + ",".join(self.choices) + "}"
        if self.parse is _seconds:
            return "SECONDS"
        return self.dest.upper()


def _seconds(text: str) -> float:
    try:
        return parse_duration(text)
    except TimeParseError:
        msg = "not a number of seconds"
        raise ValueError(msg) from None


def _positive_int(text: str) -> int:
    value = int(text.strip())
    if value < 1:
        msg = "must be at least 1"
        raise ValueError(msg)
    return value


def _quantile(text: str) -> float:
    if text.strip().lower() == "max":
        return 1.0
    value = float(text)
    if not 0.0 < value <= 1.0:
        msg = "must be in (0, 1] or 'max'"
        raise ValueError(msg)
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    msg = "not a boolean"
    raise ValueError(msg)


def _factor(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 1.0:
        msg = "must be a number of at least 1"
        raise ValueError(msg)
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0.0:
        msg = "must be a number of interruptions a day, 0 or more"
        raise ValueError(msg)
    return value


def _state_file(text: str) -> str:
    path = os.path.abspath(os.path.expanduser(text.strip()))
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        msg = "is a directory; name a file in it, e.g. /mnt/checkpoints/job/esiwrap-state.json"
        raise ValueError(msg)
    if not os.path.isdir(directory):
        msg = f"directory {directory} does not exist; create it (next to the checkpoints)"
        raise ValueError(msg)
    if not os.access(directory, os.W_OK):
        msg = f"directory {directory} is not writable"
        raise ValueError(msg)
    return path


def _upload_command(text: str) -> str:
    import re

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


def _choice(allowed: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            msg = f"must be one of {', '.join(allowed)}"
            raise ValueError(msg)
        return value

    return parse


def _identity(text: str) -> str:
    return text


def _deadline_text(text: str) -> str:
    parse_when(text, time.time())  # validate now; the source parses again at launch
    return text


def _metadata_url(text: str) -> str:
    url = text.strip().rstrip("/")
    if not url.startswith("http://") or len(url) <= len("http://"):
        msg = "the metadata service is plain HTTP; use http://HOST[:PORT]"
        raise ValueError(msg)
    return url


def _endpoint(text: str) -> str:
    url = text.strip().rstrip("/")
    if not url or " " in url:
        msg = "not a host or URL"
        raise ValueError(msg)
    return url


def _sources(text: str) -> list[str]:
    try:
        return parse_source_names(text)
    except UsageError:
        msg = f"unknown source name; choose from {','.join(KNOWN_SOURCES)}"
        raise ValueError(msg) from None


SOURCE_OPTIONS = (
    Option("--deadline", _deadline_text, None, "+2h",
           "expiry: epoch s/ms, ISO-8601 with offset, or +90s/+15m/+2h; overrides discovery"),
    Option("--sources", _sources, list(DEFAULT_SOURCES), ",".join(DEFAULT_SOURCES),
           "ordered deadline sources"),
    Option("--sagemaker-lead", _seconds, 1800.0, "1800",
           "seconds before a SageMaker capacity block's end time that termination starts"),
    Option("--refresh", _seconds, 300.0, "300", "seconds between deadline re-resolutions"),
    Option("--volcengine-endpoint", _endpoint, None, "https://ecs.cn-beijing.volcengineapi.com",
           "ECS OpenAPI endpoint (host or URL); default: the SDK's endpoint for the region"),
    Option("--volcengine-region", _identity, None, "cn-beijing",
           "ECS region (else VOLCENGINE_REGION, else the metadata service's region_id)"),
    Option("--volcengine-timeout", _seconds, 5.0, "5", "ECS OpenAPI read timeout per attempt"),
    Option("--metadata-url", _metadata_url, VOLCENGINE_METADATA_URL, VOLCENGINE_METADATA_URL,
           "Volcengine instance metadata service"),
    Option("--aws-metadata-url", _metadata_url, AWS_METADATA_URL, AWS_METADATA_URL,
           "AWS instance metadata service (aws-spot)"),
)

RUN_OPTIONS = (
    Option("--redundant-time", _seconds, 120.0, "120", "slack before the deadline for the insurance save"),
    Option("--save-duration", _seconds, 60.0, "60", "initial save-time estimate, until a save is measured"),
    Option("--unmeasured-factor", _factor, 6.0, "6",
           "until a save is measured, the insurance save assumes --save-duration times this"),
    Option("--interruption-rate", _rate, 1.0, "1",
           "interruptions a day to guard against with periodic saves (Young/Daly); 0 turns them off"),
    Option("--state-file", _state_file, None, "/mnt/checkpoints/job/esiwrap-state.json",
           "keep this job's measured step and save times here, for the next run"),
    Option("--upload", _upload_command, None, "'aws s3 cp --recursive {path} s3://bucket/job/{step}/'",
           "after each completed save, run this shell command ({path}, {step}); exit 75 only once "
           "the last checkpoint's upload completed"),
    Option("--upload-duration", _seconds, 60.0, "600",
           "the upload time expected until one is measured (times --unmeasured-factor for the "
           "insurance save)"),
    Option("--local-checkpoints-survive", _bool, False, "true",
           "this machine's local disk outlives the instance: no checkpoint_not_durable warning"),
    Option("--step-window", _positive_int, 100, "100", "how many recent step intervals to learn from"),
    Option("--step-quantile", _quantile, 0.99, "0.99 or max", "quantile of the window used as the step time"),
    Option("--final-save", _bool, True, "true", "after the insurance save, keep training and save again"),
    Option("--final-margin", _seconds, 5.0, "5", "slack before the deadline for final saves"),
    Option("--after-save", _choice(AFTER_SAVE), "stop", "stop",
           "once the last planned save is acknowledged: stop the child, let it train until the stop "
           "must begin (linger: a later deadline is followed), or leave it running", AFTER_SAVE),
    Option("--stop-grace", _seconds, 30.0, "30", "seconds between the stop signal and SIGKILL"),
    Option("--stop-budget", _seconds, None, "30",
           "seconds the platform gives a stop before its SIGKILL (docker stop: 10, Kubernetes: 30); "
           "warns when a step, a save and --stop-grace do not fit"),
    Option("--on-sigterm", _choice(ON_SIGTERM), "checkpoint", "checkpoint",
           "SIGTERM to esiwrap: save first, or just forward", ON_SIGTERM),
    Option("--signal", _signal_parser(SAVE_SIGNALS), int(signal.SIGUSR1), "SIGUSR1",
           "the save signal sent to registered trainers", SAVE_SIGNALS),
    Option("--signal-child", _bool, False, "true",
           "send the save signal to the direct child, which handles it itself"),
    Option("--stop-signal", _signal_parser(STOP_SIGNALS), int(signal.SIGTERM), "SIGTERM",
           "first signal of the stop sequence", STOP_SIGNALS),
)

LOG_OPTIONS = (
    Option("--log-file", _identity, None, "/var/log/esiwrap/job.jsonl", "also write JSON lines here"),
    Option("--log-format", _choice(LOG_FORMATS), None, "json",
           "json (default when stderr is not a terminal) or console", LOG_FORMATS),
    Option("--log-level", _choice(LOG_LEVELS), "info", "info", "least severe level written", LOG_LEVELS),
)

def _port(text: str) -> int:
    value = int(text.strip())
    if not 0 <= value <= 65535:
        msg = "must be 0..65535 (0: any free port)"
        raise ValueError(msg)
    return value


def _address(text: str) -> str:
    from esiwrap.endpoint import parse_address

    return parse_address(text)


def _file_in_existing_dir(text: str) -> str:
    path = os.path.abspath(os.path.expanduser(text.strip()))
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        msg = f"directory {directory} does not exist; create it or choose another path"
        raise ValueError(msg)
    if os.path.isdir(path):
        msg = "is a directory; give a file path"
        raise ValueError(msg)
    return path


def _status_file(text: str) -> str:
    if text.strip().lower() in ("auto", "none"):
        return text.strip().lower()
    return _file_in_existing_dir(text)


OBSERVE_OPTIONS = (
    Option("--metrics-file", _file_in_existing_dir, None, "/var/lib/node_exporter/textfile/esiwrap.prom",
           "write Prometheus metrics here on every change (node_exporter textfile collector)"),
    Option("--metrics-port", _port, None, "9478",
           "serve Prometheus metrics on this TCP port (0: any free port; see metrics_serving)"),
    Option("--metrics-address", _address, "127.0.0.1", "0.0.0.0",
           "address the metrics port listens on (0.0.0.0 or :: for every interface)"),
    Option("--status-file", _status_file, "auto", "/run/esiwrap/job.json",
           "where `esiwrap status` finds this run (auto: a per-user runtime directory; none: no file)"),
)

ALL_RUN_OPTIONS = SOURCE_OPTIONS + RUN_OPTIONS + LOG_OPTIONS + OBSERVE_OPTIONS
BOOLEAN_FLAGS = {"--final-save", "--signal-child", "--local-checkpoints-survive"}
# Every long option of a run, and whether it takes a value (the splitter must know).
_RUN_FLAGS: dict[str, bool] = {
    **{opt.flag: opt.flag not in BOOLEAN_FLAGS for opt in ALL_RUN_OPTIONS},
    **{"--no-" + flag[2:]: False for flag in BOOLEAN_FLAGS},
    "--help": False, "--version": False,
}


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    print(f"esiwrap: {message}", file=sys.stderr)
    raise SystemExit(code)


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


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit 2."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        fail(f"{message}; see esiwrap --help")


def _add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for opt in options:
        env_note = f" [env {opt.env}; default {opt.default_text}]"
        if opt.flag in BOOLEAN_FLAGS:
            negative = "--no-" + opt.flag[2:]
            parser.add_argument(opt.flag, dest=opt.dest, action="store_const", const="true",
                                help=opt.help + env_note)
            parser.add_argument(negative, dest=opt.dest, action="store_const", const="false",
                                help="the opposite" if opt.flag == "--final-save" else argparse.SUPPRESS)
        else:
            parser.add_argument(opt.flag, dest=opt.dest, metavar=opt.metavar, help=opt.help + env_note)


def resolve_options(
    ns: argparse.Namespace, options: Sequence[Option], environ: Mapping[str, str]
) -> dict[str, Any]:
    """Flag, else ESIWRAP_<NAME>, else default; each parsed, a bad one raising `UsageError` with
    the line to show (`main` exits 2 with it; a Ray node's probe reports it)."""
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


def build_run_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    _add_options(parser, ALL_RUN_OPTIONS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command")
    return parser


def build_deadline_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="esiwrap deadline",
                     description="Ask every deadline source, print what each said and the winner. "
                     "Exit 0 when a deadline is known, 3 when none.")
    parser.add_argument("--json", action="store_true", help="one JSON object for machines")
    parser.add_argument("--cluster", action="store_true",
                        help="ask every node of a Ray cluster instead, each with its own sources and "
                        "settings (its environment): one line per node")
    parser.add_argument("--address", metavar="HOST:PORT",
                        help="the Ray cluster for --cluster (default: RAY_ADDRESS, else the one "
                        "started on this machine)")
    _add_options(parser, SOURCE_OPTIONS)
    return parser


def source_settings(values: Mapping[str, Any]) -> SourceSettings:
    return SourceSettings(
        deadline=values["deadline"],
        sagemaker_lead_s=values["sagemaker_lead"],
        refresh_s=values["refresh"],
        volcengine_endpoint=values["volcengine_endpoint"],
        volcengine_region=values["volcengine_region"],
        volcengine_timeout_s=values["volcengine_timeout"],
        metadata_url=values["metadata_url"],
        aws_metadata_url=values["aws_metadata_url"],
    )


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


def supervisor_config(command: Sequence[str], values: Mapping[str, Any], run_id: str = "") -> Any:
    """The supervisor's settings from the run options (also what benchmarks/simulate.py runs)."""
    from esiwrap.supervisor import SupervisorConfig

    return SupervisorConfig(
        argv=list(command),
        policy=policy_config(values),
        save_signal=values["signal"],
        stop_signal=values["stop_signal"],
        stop_grace_s=values["stop_grace"],
        after_save=values["after_save"],
        on_sigterm=values["on_sigterm"],
        signal_child=values["signal_child"],
        run_id=run_id,
        state_file=values["state_file"],
        stop_budget_s=values["stop_budget"],
        settings={opt.flag: values[opt.dest] for opt in RUN_OPTIONS},
        upload=values["upload"],
        local_checkpoints_survive=values["local_checkpoints_survive"],
    )


def observe_settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> Any:
    """What `esiwrap.observe.Observer` needs: the status file resolved to a path (or None)."""
    from esiwrap import statusfile
    from esiwrap.observe import ObserveSettings

    status_file = values["status_file"]
    if status_file == "auto":
        status_file = statusfile.default_status_file(environ, os.getpid(), os.getuid())
        if status_file is None:
            from esiwrap import events
            from esiwrap.log import get_logger

            get_logger().warning(events.STATUS_FILE_UNAVAILABLE,
                                 looked_in=statusfile.candidate_dirs(environ, os.getuid()),
                                 fix="--status-file PATH in a writable directory")
    elif status_file == "none":
        status_file = None
    return ObserveSettings(status_file=status_file, metrics_file=values["metrics_file"],
                           metrics_port=values["metrics_port"], metrics_address=values["metrics_address"])


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args, command = split_run_argv(argv)
    ns = build_run_parser().parse_args(args)
    if not command:
        command = _command_from_env(environ)
    if not command:
        fail("no command given; e.g. esiwrap --deadline +2h -- python train.py")
    values = resolve_options(ns, ALL_RUN_OPTIONS, environ)

    from esiwrap import log
    from esiwrap._console import resume_gc
    from esiwrap.supervisor import Supervisor

    resume_gc()  # everything supervision needs is loaded

    log_label = "--log-file" if ns.log_file is not None else LOG_FILE_ENV
    log_file = values["log_file"]
    if log_file is not None:
        check_log_file(log_file, log_label)
    run_id = log.new_run_id()
    try:
        log.configure(run_id, level=values["log_level"], fmt=values["log_format"], log_file=log_file)
    except OSError as exc:  # what the check above could not foresee (a full disk, a race)
        fail(f"{log_label} {log_file!r}: cannot open it ({exc.strerror or exc}); choose a writable file")
    config = supervisor_config(command, values, run_id)
    sources = build_sources(values["sources"], source_settings(values), environ, time.time())
    return Supervisor(config, sources, environ, observe=observe_settings(values, environ)).run()


def deadline_command(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    ns = build_deadline_parser().parse_args(list(argv))
    if ns.cluster:
        return cluster_deadline_command(ns.address or environ.get("RAY_ADDRESS", "").strip(), ns.json)
    if ns.address:
        fail("--address is for --cluster; e.g. esiwrap deadline --cluster --address 10.0.0.5:6379")
    values = resolve_options(ns, SOURCE_OPTIONS, environ)
    now = time.time()
    sources = build_sources(values["sources"], source_settings(values), environ, now)
    answers = ask_all(sources, now)
    best = winner(answers)
    if ns.json:
        print(json.dumps(_deadline_report(answers, best, now), indent=2))
    else:
        _print_deadline_table(answers, best, now)
    return EXIT_OK if best is not None else EXIT_NO_DEADLINE


def _deadline_report(answers: Sequence[Answer], best: Any, now: float) -> dict[str, Any]:
    def one(answer: Answer) -> dict[str, Any]:
        if answer.deadline is None:
            return {"source": answer.source, "ok": False, "reason": answer.reason}
        d = answer.deadline
        return {"source": answer.source, "ok": True, "deadline": d.iso(), "epoch": d.at,
                "raw": d.raw, "lead_s": d.lead_s, "remaining_s": round(d.at - now, 3), **d.detail}

    return {"sources": [one(a) for a in answers], **_ruling(best, now, "no source knows the deadline")}


def _ruling(best: Deadline | None, now: float, why_none: str) -> dict[str, Any]:
    """The deadline that rules, as JSON fields, or `why_none`."""
    if best is None:
        return {"deadline": None, "source": None, "reason": why_none}
    return {"deadline": best.iso(), "epoch": best.at, "source": best.source,
            "remaining_s": round(best.at - now, 3)}


def _print_deadline_table(answers: Sequence[Answer], best: Any, now: float) -> None:
    width = max((len(a.source) for a in answers), default=6)
    for answer in answers:
        if answer.deadline is None:
            print(f"{answer.source:<{width}}  unavailable: {answer.reason}")
        else:
            d = answer.deadline
            lead = f", lead {d.lead_s:g}s applied" if d.lead_s else ""
            print(f"{answer.source:<{width}}  {d.iso()} (in {d.at - now:.0f}s; raw {d.raw!r}{lead})")
    if not answers:
        print("no sources configured (--sources)")
    if best is None:
        print("deadline: unknown (no source answered); pass --deadline or set a source up")
    else:
        print(f"deadline: {best.iso()} from {best.source}, {best.at - now:.0f}s from now")


def check_log_file(path: str, label: str = "--log-file") -> None:
    """A log file esiwrap can append to, or one line naming the path and the fix (exit 2): found
    before the child starts, not as a traceback (under systemd: five failed restarts)."""
    problem = log_file_problem(path)
    if problem is not None:
        fail(f"{label} {path!r}: {problem}")


def log_file_problem(path: str) -> str | None:
    if not path.strip():
        return "empty path; name a file, e.g. /var/log/esiwrap/job.jsonl"
    if os.path.isdir(path):
        return f"is a directory; name a file in it, e.g. {os.path.join(path, 'esiwrap.jsonl')}"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        return f"directory {parent} does not exist; create it (mkdir -p {parent}) or choose another path"
    if not os.path.isdir(parent):
        return f"{parent} is not a directory; choose another path"
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            return "not writable; fix its permissions or choose another path"
    elif not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {parent} is not writable; fix its permissions or choose another path"
    return None


CLUSTER_ASK_TIMEOUT_S = 60.0  # every node's sources bound their own time; this bounds a stuck node


def cluster_deadline_command(address: str, as_json: bool) -> int:
    """`esiwrap deadline --cluster`: every node of the Ray cluster asked once, one line each."""
    from esiwrap.integrations import ray_nodes

    _check_ray_address(address)
    try:
        nodes = ray_nodes.ask_cluster(address or "auto", CLUSTER_ASK_TIMEOUT_S)
    except ConnectionError as exc:
        fail(f"--address {address or 'auto'}: {str(exc).splitlines()[0]}; start the cluster "
             "(ray start --head) or give its address, e.g. --address 10.0.0.5:6379")
    now = time.time()
    best = winner(answer for node in nodes for answer in node.answers)
    if as_json:
        print(json.dumps(_cluster_report(nodes, best, now), indent=2))
    else:
        _print_cluster_table(nodes, best, now)
    return EXIT_OK if best is not None else EXIT_NO_DEADLINE


def _check_ray_address(address: str) -> None:
    """A Ray address nobody listens on makes `ray.init` retry for minutes: ask the port first."""
    if not address or address == "auto":
        return
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "://" in address:
        fail(f"--address {address!r}: not HOST:PORT; e.g. --address 10.0.0.5:6379")
    try:
        socket.create_connection((host, int(port)), timeout=3.0).close()
    except OSError as exc:
        fail(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); "
             "start it (ray start --head) or give the head's HOST:PORT")


def _node_row(node: NodeAnswers, now: float) -> dict[str, Any]:
    row: dict[str, Any] = {"node_id": node.node.node_id, "address": node.node.address}
    if node.error:
        return {**row, **_ruling(None, now, f"no answer: {node.error}")}
    best = winner(node.answers)
    report = _deadline_report(node.answers, best, now)
    if best is None:  # why, source by source
        reasons = [f"{_local_name(a.source)}: {a.reason}" for a in node.answers]
        report["reason"] = "; ".join(reasons) or "no answer"
    return {**row, **report}


def _local_name(source: str) -> str:
    """`env:MLP` of `node:1a2b3c4d/env:MLP`."""
    return source.split("/", 1)[1] if "/" in source else source


def _cluster_report(nodes: Sequence[NodeAnswers], best: Deadline | None, now: float) -> dict[str, Any]:
    return {"nodes": [_node_row(n, now) for n in nodes], **_ruling(best, now, "no node knows its deadline")}


def _print_cluster_table(nodes: Sequence[NodeAnswers], best: Deadline | None, now: float) -> None:
    for node in nodes:
        row = _node_row(node, now)
        head = f"node {node.node.name()[len('node:'):]}  {node.node.address:<15}"
        if row["deadline"] is None:
            print(f"{head}  none: {row['reason']}")
        else:
            when = f"{row['deadline']} (in {row['remaining_s']:.0f}s)"
            print(f"{head}  {when} from {_local_name(row['source'])}")
    if best is None:
        print("cluster deadline: unknown (no node knows one)")
    else:
        print(f"cluster deadline: {best.iso()} from {best.source}, {best.at - now:.0f}s from now")


def _command_from_env(environ: Mapping[str, str]) -> list[str]:
    """ESIWRAP_COMMAND (the systemd unit's environment file), split like a POSIX shell would."""
    text = environ.get(COMMAND_ENV, "")
    try:
        return shlex.split(text)
    except ValueError as exc:
        fail(f"{COMMAND_ENV} {text!r}: {exc}; quote like a shell, e.g. python train.py --name 'my run'")


def split_run_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """esiwrap's own options, and the command.

    The command starts after the first `--`, or at the first word that is neither an option nor
    an option's value; from there on every word is the command's, untouched, a later `--`
    included (`esiwrap env FOO=1 -- sh -c ...`, `esiwrap uv run -- python train.py`). An option
    that takes a value takes the next word whatever it looks like (`--deadline +2h`); options
    may be shortened to a unique prefix, as argparse allows.
    """
    items = list(argv)
    index = 0
    while index < len(items):
        word = items[index]
        if word == "--":
            return items[:index], items[index + 1:]
        if not word.startswith("-") or word == "-":
            return items[:index], items[index:]
        name, has_value, _ = word.partition("=")
        index += 2 if not has_value and _takes_value(name) else 1
    return items, []


def _takes_value(flag: str) -> bool:
    """Does `flag` (exact, or a unique prefix of a long option) consume the next word?"""
    if not flag.startswith("--"):
        return False
    known = _RUN_FLAGS
    if flag in known:
        return known[flag]
    matches = [name for name in known if name.startswith(flag)]
    return len(matches) == 1 and known[matches[0]]


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """`systemd-unit`: options, then the job's command after the first `--`."""
    items = list(argv)
    if "--" in items:
        index = items.index("--")
        return items[:index], items[index + 1:]
    return items, None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    environ = dict(os.environ)
    try:
        if args and args[0] in SUBCOMMANDS:
            return _subcommand(args[0], args[1:], environ)
        if args:
            _refuse_mistyped_subcommand(args[0], environ)
        return run(args, environ)
    except UsageError as exc:
        fail(str(exc))
    except EsiwrapError as exc:
        fail(str(exc), EXIT_FAILURE)
    except KeyboardInterrupt:
        return 130


def _refuse_mistyped_subcommand(word: str, environ: Mapping[str, str]) -> None:
    """`esiwrap reprot run.jsonl`: a first word that is no command on PATH but close to a
    subcommand is a typo, not a training command (that would end in 127, command not found)."""
    if word.startswith("-") or os.sep in word:
        return
    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.6)
    if not close:
        return
    from esiwrap.process import which

    if which(word, environ.get("PATH", os.defpath)) is None:
        fail(f"'{word}' is neither a subcommand nor a command on PATH; did you mean `{close[0]}`? "
             f"(a command goes after --, e.g. esiwrap -- python train.py)")


def _subcommand(name: str, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    from esiwrap._console import resume_gc

    resume_gc()
    if name == "deadline":
        return deadline_command(argv, environ)
    if name == "report":
        return report_command(argv)
    if name == "status":
        return status_command(argv, environ)
    if name == "systemd-unit":
        return systemd_unit_command(argv, environ)
    fail(f"'{name}' is not available in this version")


def build_report_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="esiwrap report",
                     description="The timeline and figures of esiwrap runs from their JSON-lines log: "
                     "deadline and its changes, planned vs actual save signal, step and save "
                     "estimates vs what happened, the stop, the exit code and the work at risk; with "
                     "several runs, the job across them (instances, reclamations, work lost, time "
                     "saving and uploading). Lines that are not esiwrap events are skipped; every run "
                     "in the logs is reported.")
    parser.add_argument("log", nargs="*", default=["-"],
                        help="a --log-file, or `journalctl -o cat -u esiwrap@JOB` output; several "
                        "(one per instance) are read as one job; - (default) reads stdin")
    parser.add_argument("--json", action="store_true", help="one JSON object for machines")
    parser.add_argument("--last", action="store_true", help="only the last run in the log")
    parser.add_argument("--html", metavar="OUT.html",
                        help="write a self-contained page: each run's timeline picture and figures")
    parser.add_argument("--svg", metavar="OUT.svg", help="write the timeline picture(s) as one SVG file")
    parser.add_argument("--what-if", metavar="OPTIONS",
                        help="replay each run's measured steps and saves with these run options "
                        "(e.g. '--redundant-time 60 --final-margin 5') and compare")
    return parser


def report_command(argv: Sequence[str]) -> int:
    from esiwrap import report

    ns = build_report_parser().parse_args(list(argv))
    if ns.log.count("-") > 1:
        fail("stdin (-) can be read only once; name the other logs as files")
    try:
        lines = report.open_logs(ns.log)
    except OSError as exc:
        failed = getattr(exc, "filename", None) or " ".join(ns.log)
        fail(f"{failed}: {exc.strerror or exc}; give a log file, or - for stdin")
    events, skipped = report.run_events(lines, last_only=ns.last)
    if not events:
        fail(f"{' '.join(ns.log)}: no esiwrap log lines in it ({skipped} other lines); "
             "from the journal use `journalctl -o cat -u esiwrap@JOB | esiwrap report -`")
    if ns.html or ns.svg:
        _write_timelines(ns, events, skipped)
        if not ns.json:
            return EXIT_OK
    runs = [report.summarize(run) for run in events]
    job = report.job_report(runs, events) if len(runs) > 1 else None
    replays = _what_ifs(events, ns.what_if) if ns.what_if is not None else None
    if ns.json:
        document = json.loads(report.to_json(runs, skipped, job))
        if replays is not None:
            document["what_if"] = [r.to_dict() if not isinstance(r, str) else {"error": r} for r in replays]
        print(json.dumps(document, indent=2))
        return EXIT_OK
    print(report.render_text(runs, skipped, job), end="")
    for run, replayed in zip(runs, replays or [], strict=False):
        from esiwrap import whatif

        print(f"run {run.run_id}")
        print(whatif.render(replayed) if not isinstance(replayed, str) else f"  what if   {replayed}")
    return EXIT_OK


def _what_ifs(events: Sequence[Sequence[Any]], options: str) -> list[Any]:
    """Each run replayed with `options`; a run that cannot be replayed gets its reason instead. A
    bad option is one line and exit 2."""
    from esiwrap import whatif

    results: list[Any] = []
    for run in events:
        try:
            results.append(whatif.what_if(list(run), options))
        except whatif.WhatIfError as exc:
            if str(exc).startswith("--what-if"):
                fail(str(exc))
            results.append(str(exc))
    return results


def _write_timelines(ns: argparse.Namespace, events: Sequence[Sequence[Any]], skipped: int) -> None:
    from esiwrap import timeline

    source = ", ".join("standard input" if log == "-" else os.path.abspath(log) for log in ns.log)
    outputs: list[tuple[str, str]] = []
    if ns.svg:
        outputs.append((ns.svg, timeline.render_svg(events)))
    if ns.html:
        outputs.append((ns.html, timeline.render_html(events, skipped, source)))
    for path, text in outputs:
        try:
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as exc:
            fail(f"{path}: {exc.strerror or exc}; give a writable path for the picture")
        print(f"esiwrap: wrote {path} ({len(events)} run{'' if len(events) == 1 else 's'})", file=sys.stderr)


def build_status_parser() -> argparse.ArgumentParser:

    parser = _Parser(prog="esiwrap status",
                     description="What each running esiwrap knows now: the deadline and its source, the "
                     "next planned save, the last checkpoint, the work at risk. Read from the status "
                     "file each esiwrap keeps (see --status-file of a run). Exit 0 when one is running, "
                     f"{EXIT_NOT_RUNNING} when none is.")
    parser.add_argument("--json", action="store_true", help="one JSON object for scripts")
    parser.add_argument("--oneline", action="store_true",
                        help="one line per esiwrap (for a prompt or a status bar)")
    parser.add_argument("--pid", type=_pid_arg, help="only the esiwrap with this pid")
    parser.add_argument("--status-file", metavar="PATH",
                        help=f"read this status file only [env {STATUS_FILE_ENV}]")
    return parser


def _pid_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"{text!r} is not a process id; e.g. --pid 4242"
        raise argparse.ArgumentTypeError(msg)
    return value


def status_command(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    from esiwrap import status

    ns = build_status_parser().parse_args(list(argv))
    explicit = ns.status_file or environ.get(STATUS_FILE_ENV, "").strip() or None
    if explicit is not None and explicit.lower() in ("auto", "none"):
        explicit = None
    now = time.time()
    search = status.find_running(explicit, environ, os.getuid())
    running = [f for f in search.running if ns.pid is None or f.snapshot.pid == ns.pid]
    if ns.json:
        print(status.to_json(running, now), end="")
    elif ns.oneline:
        for found in running:
            print(f"esiwrap {found.snapshot.pid}: {status.summary(found.snapshot, now)}")
    elif running:
        print(status.render_text(running, now), end="")
    if not running:
        fail(_nothing_running(search, ns.pid), EXIT_NOT_RUNNING)
    return EXIT_OK


def _nothing_running(search: Any, pid: int | None) -> str:
    if pid is not None and search.running:
        others = ", ".join(str(f.snapshot.pid) for f in search.running)
        return f"no running esiwrap has pid {pid} (running: {others})"
    text = "no esiwrap is running"
    if pid is not None:
        text = f"no esiwrap with pid {pid} is running"
    text += f" (no live status file in {', '.join(search.looked_in)})"
    if search.stale:
        text += f"; ignored {len(search.stale)} left by exited processes: {', '.join(search.stale)}"
    if search.unreadable:
        text += f"; not status files: {', '.join(search.unreadable)}"
    return text


def build_systemd_unit_parser() -> argparse.ArgumentParser:
    from esiwrap.systemd import unit

    parser = _Parser(
        prog="esiwrap systemd-unit",
        usage="esiwrap systemd-unit [--env-dir DIR] [--esiwrap-path PATH]\n"
        "       esiwrap systemd-unit --install [JOB] [--setenv KEY=VALUE]... [--workdir DIR] "
        "[--force] [--dry-run] [--unit-dir DIR] [--env-dir DIR] -- COMMAND [ARGS...]",
        description="Print the esiwrap@.service template unit, or install it with a job's "
        "environment file (the command, esiwrap settings) and print the systemctl commands to run.",
    )
    parser.add_argument("--install", nargs="?", const="", metavar="JOB",
                        help="write the template and, with JOB, ENV_DIR/JOB.env and a drop-in with "
                        "the working directory; without JOB, the template only")
    parser.add_argument("--setenv", action="append", default=[], metavar="KEY=VALUE",
                        help="a variable for the job's environment file, e.g. "
                        "ESIWRAP_STOP_GRACE=60 (repeatable)")
    parser.add_argument("--workdir", metavar="DIR", help="the command's working directory (default: here)")
    parser.add_argument("--esiwrap-path", metavar="PATH",
                        help="the esiwrap executable the unit runs (default: this one)")
    parser.add_argument("--unit-dir", default=unit.DEFAULT_UNIT_DIR, metavar="DIR",
                        help=f"where the unit goes (default {unit.DEFAULT_UNIT_DIR})")
    parser.add_argument("--env-dir", default=unit.DEFAULT_ENV_DIR, metavar="DIR",
                        help=f"where job environment files go (default {unit.DEFAULT_ENV_DIR})")
    parser.add_argument("--force", action="store_true", help="replace files that differ")
    parser.add_argument("--dry-run", action="store_true", help="say what would be written; write nothing")
    return parser


def systemd_unit_command(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    from esiwrap.systemd import unit

    args, command = _split_command(argv)
    ns = build_systemd_unit_parser().parse_args(args)
    esiwrap_path = os.path.abspath(ns.esiwrap_path) if ns.esiwrap_path else _this_esiwrap(environ)
    env_dir = os.path.abspath(ns.env_dir)
    if ns.install is None:
        if command:
            fail("a command needs --install JOB; "
                 "e.g. esiwrap systemd-unit --install llama -- python train.py")
        print(unit.render_unit(esiwrap_path, env_dir), end="")
        return EXIT_OK
    name = ns.install or None
    if name is None and command:
        fail("a command needs a job name; e.g. esiwrap systemd-unit --install llama -- python train.py")
    workdir = os.path.abspath(ns.workdir or os.getcwd())
    resolved: list[str] = []
    if name is not None:
        resolved = unit.resolve_command(command or [], workdir, environ.get("PATH", os.defpath))
    plan = unit.plan_install(
        name=name, command=resolved, settings=_settings(ns.setenv), options=option_docs(),
        esiwrap_path=esiwrap_path, unit_dir=os.path.abspath(ns.unit_dir), env_dir=env_dir,
        workdir=workdir if name is not None else None,
    )
    written = unit.apply_install(plan, force=ns.force, dry_run=ns.dry_run)
    for item in written:
        print(f"{item.action:<14} {item.path}")
        print(item.diff, end="")
    if name is not None:
        print(f"command        {shlex.join(resolved)}  (in {workdir})")
    print("next:" if not ns.dry_run else "then:")
    for step in unit.next_steps(plan):
        print(f"  {step}")
    return EXIT_OK


def _this_esiwrap(environ: Mapping[str, str]) -> str:
    """The esiwrap executable next to this Python (a venv's bin/), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "esiwrap")
    if os.access(beside, os.X_OK):
        return os.path.abspath(beside)
    import shutil

    found = shutil.which("esiwrap", path=environ.get("PATH", os.defpath))
    if found is None:
        fail("cannot find the esiwrap executable; pass --esiwrap-path /opt/esiwrap/venv/bin/esiwrap")
    return os.path.abspath(found)


def _settings(pairs: Sequence[str]) -> dict[str, str]:
    """--setenv KEY=VALUE pairs; esiwrap's own options are checked like on the command line."""
    from esiwrap.systemd import unit

    by_env = {opt.env: opt for opt in ALL_RUN_OPTIONS}
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            fail(f"--setenv {pair!r}: expected KEY=VALUE; e.g. --setenv ESIWRAP_STOP_GRACE=60")
        unit.check_setting(key)
        option = by_env.get(key)
        if option is not None:
            resolve_options(argparse.Namespace(), [option], {key: value})
        elif key.startswith(PREFIX):
            print(f"esiwrap: warning: --setenv {key}: not an esiwrap option (a typo?); written anyway",
                  file=sys.stderr)
        settings[key] = value
    return settings


def option_docs() -> list[Any]:
    """Every run option as a job's environment file lists it."""
    from esiwrap.systemd.unit import OptionDoc

    return [OptionDoc(opt.env, "" if opt.default is None else opt.default_text, opt.help)
            for opt in ALL_RUN_OPTIONS]
