"""The run options of `esiwrap [OPTIONS] -- COMMAND`: one table, read by the command line, `--help`,
the environment (`ESIWRAP_<NAME>`; the flag wins), the systemd job file, a Ray node's watch, the
simulator and `esiwrap report --what-if`.

    SOURCE_OPTIONS   --deadline, --sources, --refresh, then each deadline source's own (declared
                     beside the source, gathered by `esiwrap.sources.registry`)
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
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from esiwrap import __version__
from esiwrap.choices import AFTER_SAVE, LOG_FORMATS, LOG_LEVELS, ON_SIGTERM, VERIFY_BUILTIN
from esiwrap.core.config import ControllerConfig
from esiwrap.core.policy import PolicyConfig
from esiwrap.envvars import CHECKPOINT_PATH_ENV, MANIFEST_DIR_ENV
from esiwrap.errors import UsageError
from esiwrap.optiontypes import (
    SECTIONS,
    Option,
    as_given,
    boolean,
    choice,
    file_in_existing_dir,
    port,
    positive_int,
    resolve_options,
    seconds,
)
from esiwrap.signals import signal_label, signal_number
from esiwrap.sources.registry import SOURCE_OPTIONS

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


def _runs(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        msg = "must be a number of runs, 0 (off) or more"
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


UPLOAD_EXAMPLE = "--upload 'aws s3 cp --recursive {path} s3://bucket/job/{step}/'"
_CHECKPOINT_VARIABLE = re.compile(r"\$\{?" + CHECKPOINT_PATH_ENV + r"\b")




def _unbalanced_brace(command: str) -> str | None:
    """Where the braces of a command do not pair up (`{path` left open, a `}` with no `{`)."""
    opened: list[int] = []
    for at, char in enumerate(command):
        if char == "{":
            opened.append(at)
        elif char == "}":
            if not opened:
                return f"a '}}' with no '{{' before it (character {at + 1})"
            opened.pop()
    if opened:
        return f"unclosed '{{' (character {opened[-1] + 1})"
    return None


def upload_names_checkpoint(command: str) -> bool:
    """The `--upload` command says which checkpoint to copy: `{path}`, or the variable the upload
    command gets (`$ESIWRAP_CHECKPOINT_PATH`). Without either it copies the same thing each time:
    right for a script that reads the variable itself or for a fixed directory, wrong otherwise
    (`upload_without_path`)."""
    return "{path}" in command or _CHECKPOINT_VARIABLE.search(command) is not None


def _template_problem(command: str, allowed: tuple[str, ...]) -> str | None:
    """What is wrong with a helper command's template, or None: empty, a brace left open, or a
    placeholder other than its own (`${VAR}` is the shell's)."""
    if not command:
        return "empty command"
    problem = _unbalanced_brace(command)
    if problem is not None:
        return f"{problem}: a placeholder is {' or '.join(f'{{{name}}}' for name in allowed)}"
    unknown = sorted({m for m in re.findall(r"(?<!\$)\{(\w*)\}", command) if m not in allowed})
    if unknown:
        names = ", ".join(f"{{{name}}}" for name in allowed)
        return f"unknown placeholder {{{unknown[0]}}}: the command may use {names} ({{path}} shell-quoted)" \
            if "path" in allowed else f"unknown placeholder {{{unknown[0]}}}: the command may use {names}"
    return None


def _command(flag: str, allowed: tuple[str, ...], example: str,
             needs: tuple[str, ...] = ()) -> Callable[[str], str]:
    """A helper command's template (`--verify`, `--restore`, `--restore-manifests`), by the rules
    of --upload's: only its own placeholders, braces and quotes that close, and the ones it cannot
    do without."""
    def parse(text: str) -> str:
        command = text.strip()
        problem = _template_problem(command, allowed)
        if problem is not None:
            msg = f"{problem}; e.g. {flag} {example}"
            raise ValueError(msg)
        try:
            shlex.split(command)
        except ValueError as exc:
            msg = f"{str(exc).lower()}: close it, or quote the whole command once; e.g. {flag} {example}"
            raise ValueError(msg) from None
        if needs and not any(need in command for need in needs):
            msg = f"it must name where to put them, {needs[0]} (or ${needs[1]}); e.g. {flag} {example}"
            raise ValueError(msg)
        return command

    return parse


_upload_command = _command("--upload", ("path", "step", "manifest"), UPLOAD_EXAMPLE.removeprefix("--upload "))
"""`--upload`: refused when it is empty, when a brace or a quote is left open (`cp {path /x/` would
fail only at the first upload, as exit 74), or when it names another placeholder."""

VERIFY_EXAMPLE = "'python check_ckpt.py {path} --step {step}'"
RESTORE_EXAMPLE = "'aws s3 cp --recursive s3://bucket/job/{step}/ckpt/ {path}'"
MANIFESTS_EXAMPLE = ("'aws s3 cp --recursive s3://bucket/job/ {dir} --exclude \"*\" "
                     "--include \"*/esiwrap-manifest.*.json\"'")


def _signal_parser(allowed: Sequence[str]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        signum = signal_number(text)
        if signum is None or signal_label(signum) not in allowed:
            msg = f"must be one of {', '.join(allowed)}"
            raise ValueError(msg)
        return signum

    return parse


def _address(text: str) -> str:
    from esiwrap.shell.endpoint import parse_address

    return parse_address(text)


def _status_file(text: str) -> str:
    if text.strip().lower() in ("auto", "none"):
        return text.strip().lower()
    return file_in_existing_dir(text)


# ---------------------------------------------------------------------------------- the core's defaults
POLICY, CONTROLLER = PolicyConfig(), ControllerConfig()
"""The decision core's own defaults: each run option of the core takes its default from here (the
one home of each: `esiwrap.core.config`), and `controller_config` builds the configuration back."""
# Which option sets which field (the option's `dest` -> the field); `--signal`, `--stop-signal`
# (a number, the field's label), `--upload` (uploads and manifests: whether it is set), `--verify`,
# `--verify-builtin` (verify: either is on), `--restore`, `--restore-manifests` (whether set) and
# `--state-file` (also the probe's directory) are converted on the way.
POLICY_FIELDS: Mapping[str, str] = {
    "redundant_time": "redundant_s", "save_duration": "save_duration_s",
    "unmeasured_factor": "unmeasured_factor", "interruption_rate": "interruption_rate_per_day",
    "step_window": "step_window", "step_quantile": "step_quantile", "final_save": "final_save",
    "final_margin": "final_margin_s", "upload_duration": "upload_duration_s",
    "verify_duration": "verify_duration_s",
}
CONTROLLER_FIELDS: Mapping[str, str] = {
    "stop_grace": "stop_grace_s", "after_save": "after_save", "on_sigterm": "on_sigterm",
    "signal_child": "signal_child", "stop_budget": "stop_budget_s", "probe_storage": "probe_storage",
    "local_checkpoints_survive": "local_checkpoints_survive", "state_file": "state_file",
    "max_no_progress_runs": "max_no_progress_runs", "restore_optional": "restore_optional",
}


# ---------------------------------------------------------------------------------- the tables
FIRST_SAVE = "policy.md#before-the-first-save-the-checkpoints-size-and-the-storages-speed"
RUN_OPTIONS = (
    Option("--redundant-time", seconds, POLICY.redundant_s,
           "120", "slack before the deadline: insurance save",
           section="policy", see="policy.md",
           doc="The insurance save, the one that must not fail, is planned to end this long before "
               "the deadline (its `reserve_s`), with the high step quantile and the conservative "
               "save estimate."),
    Option("--save-duration", seconds, POLICY.save_duration_s,
           "60", "save time guessed until one is measured",
           section="policy", see=FIRST_SAVE,
           doc="Used only while no save is measured and no prior is known (the checkpoint's size "
               "over the storage's probed speed): the insurance save then assumes this times "
               "`--unmeasured-factor`."),
    Option("--unmeasured-factor", _factor, POLICY.unmeasured_factor,
           "6", "the safety factor on a guessed save time",
           section="policy", value_name="FACTOR", see="policy.md", advanced=True,
           doc="Until a save is measured (and with no prior), the insurance save assumes "
               "`--save-duration` × this, and an upload `--upload-duration` × this. A guess that is "
               "too short misses the deadline; one that is too long only takes the first checkpoint "
               "earlier."),
    Option("--interruption-rate", _rate, POLICY.interruption_rate_per_day,
           "1", "interruptions a day, for periodic saves",
           show=lambda value: "auto" if value is None else f"{value:g}",
           section="policy",
           advanced=True, see="policy.md#how-often-capacity-is-interrupted-the-periodic-cadence",
           value_name="RATE",
           doc="Interruptions a day that come with less warning than a step plus a save, guarded "
               "against with periodic saves at Young/Daly's interval `sqrt(2 × save cost / rate)`. "
               "`0` turns periodic saves off; `auto`: by the capacity's kind (spot, reserved, "
               "unknown) and the job's nodes."),
    Option("--state-file", _state_file, CONTROLLER.state_file, "/mnt/checkpoints/job/esiwrap-state.json",
           "the job's memory across runs", section="uploads", value_name="PATH",
           see="uploads-and-resumes.md#remembered-across-runs-state-file",
           doc="Keep the job's measured step intervals, save and upload durations and its last "
               "durable checkpoint in this small JSON file, next to the checkpoints on storage that "
               "outlives the instance. The next run plans with them from its first save and checks "
               "that the trainer resumed from that checkpoint (`resumed`, `resume_missed`). Its "
               "directory must exist. One live run per state file: a run holds `<file>.lock`; a second "
               "run on it exits 2, naming the holder."),
    Option("--max-no-progress-runs", _runs, CONTROLLER.max_no_progress_runs,
           "3", "stop a job whose runs make no progress",
           section="uploads", value_name="N",
           see="uploads-and-resumes.md#a-job-that-makes-no-progress-is-stopped",
           doc="With `--state-file`: after N consecutive runs of the job whose durable step did not "
               "advance, the next run does not start its command: it logs `no_progress` (the runs, "
               "the steps, the likely cause and the fix) and exits 78, which `--slurm-requeue` does "
               "not requeue and the systemd unit does not restart. A run it stopped ends the count, "
               "so a job started again after the fix runs. `0` turns the guard off."),
    Option("--probe-storage", boolean, CONTROLLER.probe_storage,
           "false", "measure the checkpoint storage's speed",
           section="policy", see=FIRST_SAVE,
           doc="Before the first save, write a bounded temporary file (at most 1 GiB or 2 s, removed "
               "after) to the checkpoint directory's filesystem, from a thread of esiwrap's own, so "
               "that the first save is planned from the checkpoint's size over this speed "
               "(`storage_probed`)."),
    Option("--upload", _upload_command, None, UPLOAD_EXAMPLE.removeprefix("--upload "),
           "copy each checkpoint off the instance", section="uploads", value_name="CMD",
           see="uploads-and-resumes.md#uploads-exit-75-means-resumable-elsewhere",
           doc="After each completed save, run this shell command with `{path}` (the checkpoint, "
               "shell-quoted) and `{step}`; exit status 0 means uploaded. The upload counts in the "
               "plan: exit 75 only once the last checkpoint's upload completed, 74 when it did "
               "not. An empty command, a brace or a quote left open, or another placeholder is "
               "exit 2 before the command starts; a command that names neither `{path}` nor "
               "`$ESIWRAP_CHECKPOINT_PATH` is a warning at the start (`upload_without_path`)."),
    Option("--upload-duration", seconds, POLICY.upload_duration_s,
           "600", "upload time guessed until one is measured",
           section="uploads",
           advanced=True, see="uploads-and-resumes.md#uploads-exit-75-means-resumable-elsewhere",
           doc="Until an upload is measured (in this run, or by an earlier one in `--state-file`), "
               "plans count on this times `--unmeasured-factor`."),
    Option("--local-checkpoints-survive", boolean, CONTROLLER.local_checkpoints_survive,
           "true", "this local disk outlives the instance",
           section="uploads",
           advanced=True, see="uploads-and-resumes.md#a-checkpoint-that-dies-with-the-instance-is-named",
           doc="No `checkpoint_not_durable` warning for a checkpoint on a local disk: for a "
               "persistent volume that moves with the job, or a machine that runs the next run too."),
    Option("--verify-builtin", choice(VERIFY_BUILTIN), "auto", "none",
           "esiwrap's own check of each checkpoint", VERIFY_BUILTIN, section="uploads", advanced=True,
           see="uploads-and-resumes.md#verified-before-it-counts",
           doc="`auto`: after each save, check the checkpoint from its metadata, by its format (torch, "
               "safetensors, DCP, verl, Hugging Face Trainer, Lightning; any other: not empty, and its "
               "size holds still), on a thread of esiwrap's own; it counts (exit 75, its upload) only "
               "once valid (`checkpoint_verified`, `checkpoint_invalid`). `none`: no built-in check."),
    Option("--verify", _command("--verify", ("path", "step"), VERIFY_EXAMPLE), None, VERIFY_EXAMPLE,
           "your own check of each checkpoint", section="uploads", value_name="CMD",
           see="uploads-and-resumes.md#verified-before-it-counts",
           doc="After the built-in check, run this shell command with `{path}` (shell-quoted) and `{step}`; "
               "exit status 0 means the checkpoint is valid. It runs as esiwrap's child, beside "
               "training; its time is measured and planned for."),
    Option("--verify-duration", seconds, POLICY.verify_duration_s, "120",
           "--verify's time guessed until measured",
           section="uploads", advanced=True, see="uploads-and-resumes.md#verified-before-it-counts",
           doc="Until a verification is measured (in this run, or by an earlier one in `--state-file`), "
               "plans count on this times `--unmeasured-factor` for a `--verify` command. The built-in "
               "check alone is counted from its first measurement: it reads metadata only, "
               "milliseconds (half a second for a format it does not know)."),
    Option("--restore", _command("--restore", ("path", "step"), RESTORE_EXAMPLE), None, RESTORE_EXAMPLE,
           "copy the checkpoint back if it is missing", section="uploads", value_name="CMD",
           see="uploads-and-resumes.md#the-way-back-restore",
           doc="When the job's last durable checkpoint (from `--state-file`, or found by "
               "`--restore-manifests`) is not on this instance, run this shell command with `{path}` "
               "(where it was, shell-quoted) and `{step}` before the command starts; what comes back "
               "is verified (`restored`). A failed restore is tried 3 times, within the deadline's "
               "plan; then esiwrap exits 66 and the command never starts from scratch silently."),
    Option("--restore-manifests", _command("--restore-manifests", ("dir",), MANIFESTS_EXAMPLE,
                                           needs=("{dir}", MANIFEST_DIR_ENV)),
           None, MANIFESTS_EXAMPLE, "copy the job's manifests into {dir}",
           section="uploads", value_name="CMD", see="uploads-and-resumes.md#only-a-bucket-survives-manifests",
           doc="With `--restore` and no checkpoint known (no state file on this instance): run this shell "
               "command to copy the job's manifests (written beside each checkpoint, uploaded by "
               "`--upload` with `{manifest}`) into the empty directory `{dir}`; the newest complete "
               "one names the checkpoint to restore and brings the job's state back."),
    Option("--restore-optional", boolean, CONTROLLER.restore_optional, "true",
           "a failed restore lets the command start",
           section="uploads", advanced=True, see="uploads-and-resumes.md#the-way-back-restore",
           doc="When `--restore` cannot bring the checkpoint back, start the command anyway (it "
               "starts from whatever it finds: from scratch, as `resume_missed` will say) instead of "
               "exiting 66."),
    Option("--step-window", positive_int, POLICY.step_window,
           "100", "step intervals remembered", section="policy",
           see="policy.md", value_name="N", advanced=True,
           doc="How many recent boundary-to-boundary step intervals the step estimate is taken from."),
    Option("--step-quantile", _quantile, POLICY.step_quantile,
           "0.99 or max", "quantile of the window taken as a step",
           section="policy", see="policy.md", value_name="Q", advanced=True,
           doc="The quantile of the step window the insurance save's step estimate is (`max`: the "
               "longest). Final saves take the quantile that gives the most expected progress."),
    Option("--final-save", boolean, POLICY.final_save, "true", "keep training after the insurance save",
           section="policy", see="policy.md",
           doc="After the insurance save, keep training and save again at the last step boundary that "
               "still fits (`--final-margin` before the deadline), again after each. Turn it off for "
               "torchrun across nodes: the first save any node asks for ends the job everywhere."),
    Option("--final-margin", seconds, POLICY.final_margin_s,
           "5", "slack before the deadline: final saves", section="policy",
           see="policy.md",
           doc="A final save is planned to end this long before the deadline; a trainer that needs "
               "longer to exit needs more."),
    Option("--after-save", choice(AFTER_SAVE), CONTROLLER.after_save,
           "stop", "what follows the last planned save",
           AFTER_SAVE, section="stopping", see="policy.md",
           doc="Once the last planned save is acknowledged: `stop` the child; `linger`: let it train "
               "until the stop must begin (`--stop-grace` + 5 s before the deadline; a deadline that "
               "moves later is followed); `continue`: leave it running."),
    Option("--stop-grace", seconds, CONTROLLER.stop_grace_s, "30", "seconds from stop signal to SIGKILL",
           section="stopping", see="reference/signals.md",
           doc="From the stop signal to SIGKILL of what is left of the child's tree; also how long "
               "esiwrap waits for a save's acknowledgement after SIGTERM (while a save is being "
               "written, up to 3× its estimate, never past the deadline)."),
    Option("--stop-budget", seconds, CONTROLLER.stop_budget_s,
           "30", "what the platform gives a stop", section="stopping", advanced=True,
           see="running/container.md",
           doc="Seconds the platform gives a stop before its own SIGKILL (`docker stop`: 10; "
               "Kubernetes: `terminationGracePeriodSeconds`, 30 by default; Slurm: `KillWait`). "
               "esiwrap warns (`stop_budget_too_small`) when a step, a save and `--stop-grace` do "
               "not fit in it."),
    Option("--on-sigterm", choice(ON_SIGTERM), CONTROLLER.on_sigterm,
           "checkpoint", "SIGTERM: save first, or forward",
           ON_SIGTERM, section="stopping", see="reference/signals.md",
           doc="`checkpoint`: a SIGTERM to esiwrap asks for one save at the next step boundary "
               "(unless the latest step is saved), waits for it, then stops the child (exit 75 when "
               "it completed); `forward`: it is passed on to the child."),
    Option("--signal", _signal_parser(SAVE_SIGNALS), signal_number(CONTROLLER.save_signal),
           "SIGUSR1", "the save signal",
           SAVE_SIGNALS, show=signal_label, section="stopping", see="trainer.md", value_name="SIG",
           doc="Sent to the trainers that said hello, and exported to the command as "
               "`ESIWRAP_SIGNAL`. SIGUSR2 for stacks that use SIGUSR1 themselves (Lightning's Slurm "
               "auto-requeue)."),
    Option("--signal-child", boolean, CONTROLLER.signal_child,
           "true", "signal the direct child, which handles it",
           section="stopping", see="trainer.md", advanced=True,
           doc="Also send the save signal to the direct child when it handles the signal itself "
               "without the trainer library (no hello)."),
    Option("--stop-signal", _signal_parser(STOP_SIGNALS), signal_number(CONTROLLER.stop_signal), "SIGTERM",
           "the child's stop signal", STOP_SIGNALS, show=signal_label, section="stopping",
           see="reference/signals.md#the-stop-sequence", value_name="SIG", advanced=True,
           doc="Sent to the child to stop it (a trainer may ask for another in its hello: a Ray "
               "driver asks for SIGINT). A trainer below the child that asked for its own signal "
               "gets it first, and the child this one once that trainer has exited; then SIGTERM to "
               "what is left of its tree, and SIGKILL after `--stop-grace`."),
)

LOG_OPTIONS = (
    Option("--log-file", as_given, None, "/var/log/esiwrap/job.jsonl", "also write JSON lines here",
           section="observe", see="observe/logs.md", value_name="PATH",
           doc="Checked before the command starts: a missing directory, a directory, or a place "
               "esiwrap may not write is one line and exit 2. On storage that outlives the instance "
               "it keeps `esiwrap report` possible after the instance is gone."),
    Option("--log-format", choice(LOG_FORMATS), None, "json", "json or console", LOG_FORMATS,
           section="observe", see="observe/logs.md",
           doc="`json`: one object per line, the default when stderr is not a terminal; `console`: "
               "readable lines (needs structlog). Under systemd's journal, always JSON."),
    Option("--log-level", choice(LOG_LEVELS), "info", "info", "debug, info, warning or error", LOG_LEVELS,
           section="observe", value_name="LEVEL", see="observe/logs.md",
           doc="`debug` adds `step_observed` for every step: the report's per-step figures, the "
               "timeline's steps and exact `--what-if` replays need it."),
)

OBSERVE_OPTIONS = (
    Option("--metrics-file", file_in_existing_dir, None, "/var/lib/node_exporter/textfile/esiwrap.prom",
           "write Prometheus metrics here", section="observe", see="observe/metrics.md",
           value_name="PATH",
           doc="The Prometheus text format, rewritten atomically on every change, as "
               "node_exporter's textfile collector wants (the name ends in `.prom`); its directory "
               "must exist. Removed when esiwrap exits."),
    Option("--metrics-port", port, None, "9478", "serve Prometheus metrics on this port", section="observe",
           see="observe/metrics.md", value_name="PORT",
           doc="`GET /metrics`, `/status` and `/`, served from esiwrap's own loop; `0` takes any free "
               "port (logged as `metrics_serving`). A port in use is exit 2 before the command "
               "starts."),
    Option("--metrics-address", _address, "127.0.0.1", "0.0.0.0", "where the metrics port listens",
           section="observe", see="observe/metrics.md", value_name="ADDR", advanced=True,
           doc="A numeric IPv4 or IPv6 address (`0.0.0.0`, `::` for every interface) or `localhost`."),
    Option("--status-file", _status_file, "auto", "/run/esiwrap/job.json", "where `esiwrap status` finds it",
           section="observe", see="observe/metrics.md#esiwrap-status", value_name="PATH|auto|none",
           doc="`auto`: `$XDG_RUNTIME_DIR/esiwrap/<pid>.json`, else `/run/esiwrap/<pid>.json` as "
               "root, else `/tmp/esiwrap-<uid>/<pid>.json`; `none`: no file. Removed when esiwrap "
               "exits."),
)

ALL_RUN_OPTIONS = SOURCE_OPTIONS + RUN_OPTIONS + LOG_OPTIONS + OBSERVE_OPTIONS
BOOLEAN_FLAGS = {opt.flag for opt in ALL_RUN_OPTIONS if opt.parse is boolean}  # also as --no-X
# off by default: --no-X not in --help
QUIET_NEGATIVES = {"--signal-child", "--local-checkpoints-survive", "--restore-optional"}
# Every long option of a run, and whether it takes a value (the command splitter must know).
RUN_FLAGS: dict[str, bool] = {
    **{opt.flag: opt.flag not in BOOLEAN_FLAGS for opt in ALL_RUN_OPTIONS},
    **{"--no-" + flag[2:]: False for flag in BOOLEAN_FLAGS},
    "--help": False, "--help-all": False, "--version": False,
}


# ---------------------------------------------------------------------------------- resolution
def policy_config(values: Mapping[str, Any]) -> PolicyConfig:
    """The plan's part of the core's configuration, from the run options' values."""
    return PolicyConfig(uploads=values["upload"] is not None,
                        verify=values["verify_builtin"] != "none" or values["verify"] is not None,
                        verify_command=values["verify"] is not None,
                        **{field: values[dest] for dest, field in POLICY_FIELDS.items()})


def controller_config(values: Mapping[str, Any]) -> ControllerConfig:
    """The decision core's configuration from the run options' values: what the supervisor, the
    simulator and `--what-if` all run with."""
    return ControllerConfig(
        policy=policy_config(values),
        save_signal=signal_label(values["signal"]),
        stop_signal=signal_label(values["stop_signal"]),
        # the state file lives next to the checkpoints: its storage, when no trainer names one
        probe_dir=os.path.dirname(values["state_file"]) if values["state_file"] else None,
        restore=values["restore"] is not None,
        restore_manifests=values["restore_manifests"] is not None,
        manifests=values["upload"] is not None,  # each upload's manifest beside its checkpoint
        **{field: values[dest] for dest, field in CONTROLLER_FIELDS.items()},
    )


def check_combinations(values: Mapping[str, Any]) -> None:
    """Options that mean nothing without another: one line naming both (UsageError)."""
    if values["restore_manifests"] is not None and values["restore"] is None:
        msg = ("--restore-manifests finds the checkpoint for --restore: give --restore CMD too; e.g. "
               f"--restore {RESTORE_EXAMPLE}")
        raise UsageError(msg)


def config_with(settings: Mapping[str, Any], options: str) -> ControllerConfig:
    """The controller's configuration of a run whose settings (flag -> value) its log holds
    (defaults where it has none), with `options` (run options as on a command line) on top: what
    `esiwrap report --what-if` replays with. A bad option is a UsageError naming it."""
    try:
        words = shlex.split(options)
    except ValueError as exc:
        msg = f"--what-if {options!r}: {exc}; quote like a shell, e.g. --what-if '--redundant-time 60'"
        raise UsageError(msg) from None
    parser = build_run_parser()

    def refuse(message: str) -> NoReturn:
        msg = f"--what-if {options!r}: {message}; e.g. --what-if '--redundant-time 60'"
        raise UsageError(msg)

    parser.error = refuse  # type: ignore[method-assign]
    ns = parser.parse_args(words)
    if ns.command:
        msg = f"--what-if {options!r}: only esiwrap's run options, no command"
        raise UsageError(msg)
    given = {opt.dest for opt in RUN_OPTIONS if getattr(ns, opt.dest, None) is not None}
    try:
        values = resolve_options(ns, RUN_OPTIONS, {})
    except UsageError as exc:
        msg = f"--what-if {options!r}: {exc}"
        raise UsageError(msg) from None
    for opt in RUN_OPTIONS:
        if opt.dest not in given and opt.flag in settings:
            values[opt.dest] = settings[opt.flag]
    return controller_config(values)


# ---------------------------------------------------------------------------------- argparse
HELP_ALL = "--help-all"
SUBCOMMANDS = ("deadline", "report", "status", "systemd-unit", "docs")
DOCS_COMMAND = "esiwrap docs"  # where the documentation is, however esiwrap was installed
# What most runs set (docs/getting-started.md: the deadline or its source, then the state file, the
# upload and the log on storage that outlives the instance), first in `esiwrap --help`.
START_HERE = ("--deadline", "--sources", "--state-file", "--upload", "--log-file")
_SECTION = {section.key: section for section in SECTIONS}
EXIT_CODES = ("Exit codes: the child's own; 75 stopped after a verified checkpoint (with --upload: and "
              "its upload); 74 with --upload, the last valid checkpoint is on local storage only (its "
              "upload did not finish); 76 no valid checkpoint before the deadline; 78 not started, the "
              "job's last runs made no progress (--max-no-progress-runs); 66 not started, --restore "
              "could not bring the checkpoint back; 2 usage; 126/127 command not executable/not found; "
              "1 esiwrap failed.")
SHORT_EXIT_CODES = ("Exit: the child's own; 75 checkpointed, resume elsewhere (--upload: once uploaded); "
                    "74 checkpointed, its upload unfinished; 76 no valid checkpoint before the deadline; 78 "
                    "not started: no progress in the last runs; 66 not started: --restore failed; 2 usage; "
                    "126/127 not executable/found; 1 esiwrap failed.")


def in_short_help(opt: Option) -> bool:
    """Listed by `esiwrap --help`: neither a platform's own setting nor a knob the defaults fit
    (those are in `--help-all`)."""
    return _SECTION[opt.section].in_help and not opt.advanced


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
    every option it adds, and shutil brings the compression modules along (start-up time). The help
    column starts far enough right that most flags and their values fit before it."""

    def __init__(self, prog: str) -> None:
        width = _terminal_columns() - 2
        super().__init__(prog, width=width, max_help_position=min(36, width // 2))

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _Switch) and len(action.option_strings) == 2:
            return "--[no-]" + action.option_strings[0][2:]  # --[no-]final-save
        return super()._format_action_invocation(action)


class _ShortFormatter(_Formatter):
    """`esiwrap --help`: the help column close enough to the flags that a line and its default fit
    80 columns (a longer flag puts its help on the next line)."""

    def __init__(self, prog: str) -> None:
        width = _terminal_columns() - 1
        argparse.HelpFormatter.__init__(self, prog, width=width, max_help_position=min(32, width // 2))


class _DescribedFormatter(_Formatter):
    """`--help-all`: each option's text on the lines below it, across the width."""

    def __init__(self, prog: str) -> None:
        argparse.HelpFormatter.__init__(self, prog, width=_terminal_columns() - 2, max_help_position=8)


def _terminal_columns() -> int:
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        pass
    try:
        return max(40, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        return 80


class _Switch(argparse.Action):
    """`--X` and `--no-X` of a boolean option: the value is kept as text ("true"/"false") and parsed
    like `ESIWRAP_X` would be, so an unset switch stays None (the variable, then the default)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        negative = option_string is not None and option_string.startswith("--no-")
        setattr(namespace, self.dest, "false" if negative else "true")


class _HelpAll(argparse.Action):
    """`--help-all`: the run options with their descriptions, variables and defaults; exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        build_run_parser(full=True).print_help()
        parser.exit()


def plain_text(markdown: str) -> str:
    """A description as a terminal shows it: `code` and [links](page) without their marks."""
    return re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", markdown).replace("`", "")


def has_default(opt: Option) -> bool:
    """A default worth a word (`--deadline`'s none is no value at all; `--interruption-rate`'s
    `auto` is one)."""
    return opt.default is not None or opt.show is not None


def option_help(opt: Option, *, full: bool) -> str:
    """The short line with the default in brackets (`--help`), or the line, the description, the
    variable and the default."""
    if not full:
        text = f"{opt.help} [{opt.default_text}]" if has_default(opt) else opt.help
        return text.replace("%", "%%")
    text = f"{opt.help}. {plain_text(opt.doc)} [env {opt.env}; default {opt.default_text}]"
    return text.replace("%", "%%")


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Sequence[Option],
                *, full: bool = True, listed: bool = True) -> None:
    """Each option as a flag with its help (`full`: also its description, variable and default); a
    boolean also as --no-X, in the same entry. Not `listed`: parsed all the same, shown nowhere."""
    for opt in options:
        text = option_help(opt, full=full) if listed else argparse.SUPPRESS
        if opt.flag in BOOLEAN_FLAGS:
            negative = "--no-" + opt.flag[2:]
            if opt.flag in QUIET_NEGATIVES:  # off by default: --no-X works, but says nothing new
                parser.add_argument(opt.flag, dest=opt.dest, action=_Switch, help=text)
                parser.add_argument(negative, dest=opt.dest, action=_Switch, help=argparse.SUPPRESS)
            else:
                parser.add_argument(opt.flag, negative, dest=opt.dest, action=_Switch, help=text)
        else:
            parser.add_argument(opt.flag, dest=opt.dest, metavar=opt.metavar, help=text)


def build_run_parser(*, full: bool = False) -> argparse.ArgumentParser:
    """`esiwrap [OPTIONS] -- COMMAND`: every run option, `--version`, `--help-all` and the command.
    Its help (`esiwrap --help`, one screen): the options most runs set first (`START_HERE`), then
    each section's others but the platforms' own settings and the `advanced` knobs, each with its
    default. `full`: the help `--help-all` prints, every option in its section, described."""
    def listed(text: str) -> str:  # --help names these in its usage lines instead
        return text if full else argparse.SUPPRESS

    parser = OptionParser(
        prog="esiwrap",
        add_help=False,
        formatter_class=_DescribedFormatter if full else _ShortFormatter,
        usage="esiwrap [OPTIONS] -- COMMAND [ARGS...]\n"
        f"       esiwrap {{{','.join(SUBCOMMANDS)}}} ...\n"
        f"       esiwrap {HELP_ALL} | --version",
        description="Run COMMAND and checkpoint it at the last safe moment before the capacity it "
        "runs on is reclaimed." + (f" {EXIT_CODES}" if full else ""),
        epilog=f"Every option is also a variable, ESIWRAP_<NAME> (--stop-grace 60 is "
        f"ESIWRAP_STOP_GRACE=60); the flag wins. All of it, with examples: {DOCS_COMMAND}." if full else
        f"{SHORT_EXIT_CODES} In [brackets]: the default. Every option is also ESIWRAP_<NAME>; {HELP_ALL} "
        f"describes each, the platforms' settings too; {DOCS_COMMAND} says where the documentation is.",
    )
    parser.add_argument("-h", "--help", action="help", help=listed("show this help message and exit"))
    parser.add_argument("--version", action="version", version=f"esiwrap {__version__}",
                        help=listed("show program's version number and exit"))
    parser.add_argument(HELP_ALL, action=_HelpAll,
                        help=listed("every option, described, with its variable and default"))
    if not full:
        start = parser.add_argument_group("start here")
        add_options(start, [opt for flag in START_HERE for opt in ALL_RUN_OPTIONS if opt.flag == flag],
                    full=False)
    for section in SECTIONS:
        options = [opt for opt in ALL_RUN_OPTIONS if opt.section == section.key]
        if full:
            add_options(parser.add_argument_group(section.title, section.summary), options)
            continue
        shown = [opt for opt in options if in_short_help(opt) and opt.flag not in START_HERE]
        if shown:
            add_options(parser.add_argument_group(section.title), shown, full=False)
        add_options(parser, [opt for opt in options if not in_short_help(opt)], listed=False)
    parser.add_argument("command", nargs=argparse.REMAINDER, help=listed("the training command"))
    return parser
