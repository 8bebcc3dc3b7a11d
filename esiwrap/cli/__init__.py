"""Command line: `esiwrap [OPTIONS] -- COMMAND...`, `esiwrap deadline`, and the other subcommands.

The run options (their table, parsers and resolution: flag, else `ESIWRAP_<NAME>`, else default)
are `esiwrap.cli.options`; here the argv is split into options and command, the subcommands parse
theirs, and every bad input ends with exit 2 and one line naming the input, the bad value and a
good example (`fail`). Only the entry points (`_console`, `__main__`) import this module.
"""

from __future__ import annotations

import argparse
import difflib
import gc
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from esiwrap.cli.options import (
    ALL_RUN_OPTIONS,
    RUN_FLAGS,
    RUN_OPTIONS,
    SUBCOMMANDS,
    UPLOAD_EXAMPLE,
    OptionParser,
    add_options,
    build_run_parser,
    check_combinations,
    config_with,
    controller_config,
    upload_names_checkpoint,
)
from esiwrap.core.values import Answer, winner
from esiwrap.envvars import CHECKPOINT_PATH_ENV, COMMAND_ENV, LOG_FILE_ENV, PREFIX, STATUS_FILE_ENV
from esiwrap.errors import (
    EXIT_FAILURE,
    EXIT_NO_DEADLINE,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_USAGE,
    EsiwrapError,
    UsageError,
)
from esiwrap.optiontypes import resolve_options
from esiwrap.sources import slurm
from esiwrap.sources.chain import ask_all
from esiwrap.sources.registry import SOURCE_OPTIONS, build_sources

if TYPE_CHECKING:
    from esiwrap.core.values import Deadline
    from esiwrap.integrations.ray_nodes import NodeAnswers



def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    print(f"esiwrap: {message}", file=sys.stderr)
    raise SystemExit(code)


def build_deadline_parser() -> argparse.ArgumentParser:
    parser = OptionParser(prog="esiwrap deadline",
                     description="Ask every deadline source, print what each said and the winner. "
                     "Exit 0 when a deadline is known, 3 when none.")
    parser.add_argument("--json", action="store_true", help="one JSON object for machines")
    parser.add_argument("--cluster", action="store_true",
                        help="ask every node of a Ray cluster instead, each with its own sources and "
                        "settings (its environment): one line per node")
    parser.add_argument("--address", metavar="HOST:PORT",
                        help="the Ray cluster for --cluster (default: RAY_ADDRESS, else the one "
                        "started on this machine)")
    add_options(parser, SOURCE_OPTIONS)
    return parser


def supervisor_config(command: Sequence[str], values: Mapping[str, Any], run_id: str = "") -> Any:
    """The supervisor's settings from the run options: the controller's (`options.controller_config`,
    what the simulator and `--what-if` run too) and the shell's own."""
    from esiwrap.shell.supervisor import SupervisorConfig

    return SupervisorConfig(
        argv=list(command),
        controller=controller_config(values),
        run_id=run_id,
        settings={opt.flag: values[opt.dest] for opt in RUN_OPTIONS},
        upload=values["upload"],
        verify=values["verify"],
        verify_builtin=values["verify_builtin"] != "none",
        restore=values["restore"],
        restore_manifests=values["restore_manifests"],
    )


def observe_settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> Any:
    """What `esiwrap.shell.observe.Observer` needs: the status file resolved to a path (or None)."""
    from esiwrap.shell import statusfile
    from esiwrap.shell.observe import ObserveSettings

    status_file = values["status_file"]
    if status_file == "auto":
        status_file = statusfile.default_status_file(environ, os.getpid(), os.getuid())
        if status_file is None:
            from esiwrap import events
            from esiwrap.shell.log import get_logger

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
    if command and list(argv[len(args):len(args) + 1]) != ["--"]:
        _refuse_subcommand_after_options(command[0], args, environ)
    if not command:
        command = _command_from_env(environ)
    if not command:
        fail("no command given; e.g. esiwrap --deadline +2h -- python train.py")
    values = resolve_options(ns, ALL_RUN_OPTIONS, environ)
    check_combinations(values)

    from esiwrap.shell import log
    from esiwrap.shell.supervisor import Supervisor

    resume_gc()  # everything supervision needs is loaded

    log_label = "--log-file" if ns.log_file is not None else LOG_FILE_ENV
    log_file = values["log_file"]
    if log_file is not None:
        check_log_file(log_file, log_label)
    run_id = log.new_run_id()
    try:
        log.configure(run_id, level=values["log_level"], fmt=values["log_format"], log_file=log_file,
                      background=True)
    except OSError as exc:  # what the check above could not foresee (a full disk, a race)
        fail(f"{log_label} {log_file!r}: cannot open it ({exc.strerror or exc}); choose a writable file")
    warn_upload_without_path(values["upload"])
    config = supervisor_config(command, values, run_id)
    sources = build_sources(values["sources"], values, environ, time.time())
    before_exit = None
    if environ.get(slurm.JOB_ID_ENV):  # the trainer is told to survive Slurm's SIGTERM to it
        config = replace(config, child_env=slurm.child_environment(environ))
    if values[slurm.REQUEUE.dest]:
        before_exit = partial(slurm.requeue_expecting_sigterm, environ)
    return Supervisor(config, sources, environ, observe=observe_settings(values, environ),
                      before_checkpointed_exit=before_exit).run()


def warn_upload_without_path(upload: str | None) -> None:
    """An `--upload` command that names no checkpoint copies the same thing after every save: said
    once, at the start (a script that reads ESIWRAP_CHECKPOINT_PATH itself is right to)."""
    if upload is None or upload_names_checkpoint(upload):
        return
    from esiwrap import events
    from esiwrap.shell.log import get_logger

    get_logger().warning(events.UPLOAD_WITHOUT_PATH, upload=upload,
                         fix=f"put {{path}} where the checkpoint goes (shell-quoted for you), or read "
                         f"${CHECKPOINT_PATH_ENV} in the script; e.g. {UPLOAD_EXAMPLE}")


def deadline_command(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    ns = build_deadline_parser().parse_args(list(argv))
    if ns.cluster:
        return cluster_deadline_command(ns.address or environ.get("RAY_ADDRESS", "").strip(), ns.json)
    if ns.address:
        fail("--address is for --cluster; e.g. esiwrap deadline --cluster --address 10.0.0.5:6379")
    values = resolve_options(ns, SOURCE_OPTIONS, environ)
    now = time.time()
    sources = build_sources(values["sources"], values, environ, now, explain=True)
    answers = ask_all(sources, now)
    best = winner(answers)
    if ns.json:
        print(json.dumps(_deadline_report(answers, best, now), indent=2))
    else:
        _print_deadline_table(answers, best, now)
    return EXIT_OK if best is not None else EXIT_NO_DEADLINE


def _deadline_report(answers: Sequence[Answer], best: Any, now: float) -> dict[str, Any]:
    def one(answer: Answer) -> dict[str, Any]:
        known: dict[str, str] = {"capacity": answer.capacity} if answer.capacity else {}
        if answer.early_warning:
            known["early_warning"] = answer.early_warning
        if answer.deadline is None:
            return {"source": answer.source, "ok": False, "reason": answer.reason, **known}
        d = answer.deadline
        return {"source": answer.source, "ok": True, "deadline": d.iso(), "epoch": d.at,
                "raw": d.raw, "lead_s": d.lead_s, "remaining_s": round(d.at - now, 3), **d.detail, **known}

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
    known = RUN_FLAGS
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
    from esiwrap.shell.process import which

    if which(word, environ.get("PATH", os.defpath)) is None:
        fail(f"'{word}' is neither a subcommand nor a command on PATH; did you mean `{close[0]}`? "
             f"(a command goes after --, e.g. esiwrap -- python train.py)")


def _refuse_subcommand_after_options(word: str, options: Sequence[str], environ: Mapping[str, str]) -> None:
    """`esiwrap --sources env:MLP deadline`: a subcommand's name after run options, and no such
    command on PATH, is the subcommand with its options in the wrong place (not a training
    command that would end in 127)."""
    if word not in SUBCOMMANDS:
        return
    from esiwrap.shell.process import which

    if which(word, environ.get("PATH", os.defpath)) is None:
        fail(f"'{word}' is a subcommand: its options go after it, e.g. esiwrap {word} "
             f"{' '.join(shlex.quote(o) for o in options)} (a command goes after --)")


def resume_gc() -> None:
    """Start-up is over (`esiwrap._console` turned the collector off while the modules loaded):
    what exists now stays, so the collector skips it from here on."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _subcommand(name: str, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    from esiwrap.shell import early

    early.release(redeliver=True)  # no supervisor here: Ctrl-C and SIGTERM act as in any program
    resume_gc()
    if name == "deadline":
        return deadline_command(argv, environ)
    if name == "report":
        return report_command(argv)
    if name == "status":
        return status_command(argv, environ)
    if name == "systemd-unit":
        return systemd_unit_command(argv, environ)
    if name == "docs":
        return docs_command(argv)
    fail(f"'{name}' is not available in this version")


def docs_command(argv: Sequence[str]) -> int:
    """`esiwrap docs`: where the documentation is (the checkout's docs/, the folder esiwrap was
    installed from, or the package's Documentation URL), else what the terminal offers."""
    from pathlib import Path

    from esiwrap import __version__
    from esiwrap.tools import docs

    OptionParser(prog="esiwrap docs",
                 description="Where esiwrap's documentation is: the docs/ folder of the checkout esiwrap "
                 "runs from or was installed from (scripts/docs.sh there serves it as a site), else "
                 "what to read instead. The wheel does not carry it.").parse_args(list(argv))
    print(docs.render(docs.locate(Path(__file__).resolve().parent.parent), __version__), end="")
    return EXIT_OK


def build_report_parser() -> argparse.ArgumentParser:
    parser = OptionParser(prog="esiwrap report",
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
    from esiwrap.tools import report

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
        from esiwrap.tools import whatif

        print(f"run {run.run_id}")
        print(whatif.render(replayed) if not isinstance(replayed, str) else f"  what if   {replayed}")
    return EXIT_OK


def _what_ifs(events: Sequence[Sequence[Any]], options: str) -> list[Any]:
    """Each run replayed with `options`; a run that cannot be replayed gets its reason instead. A
    bad option is one line and exit 2."""
    from esiwrap.tools import whatif

    results: list[Any] = []
    for run in events:
        try:
            results.append(whatif.what_if(list(run), options, config_with))
        except whatif.WhatIfError as exc:
            if str(exc).startswith("--what-if"):
                fail(str(exc))
            results.append(str(exc))
    return results


def _write_timelines(ns: argparse.Namespace, events: Sequence[Sequence[Any]], skipped: int) -> None:
    from esiwrap.tools import timeline

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

    parser = OptionParser(prog="esiwrap status",
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
    from esiwrap.tools import status

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
    from esiwrap.shell.systemd import unit

    parser = OptionParser(
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
    from esiwrap.shell.systemd import unit

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
    from esiwrap.shell.systemd import unit

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
    from esiwrap.shell.systemd.unit import OptionDoc

    # an option with no default is left empty, unless its default has a word (`auto`)
    return [OptionDoc(opt.env, "" if opt.default is None and opt.show is None else opt.default_text, opt.help)
            for opt in ALL_RUN_OPTIONS]
