#!/usr/bin/env python3
"""The documentation's picture of a real run, made by running one:

    docs/images/timeline-run.jsonl  the JSON log of the demo's CPU trainer (examples/tiny_trainer.py)
                                    under esiwrap with a deadline 40 s away, `--log-level debug` so
                                    that every step shows; its paths and host name made neutral
                                    (/ckpt, /job, gpu-node-1)
    docs/images/timeline.svg        `esiwrap report LOG --svg` of that log, on the report page
                                    (docs/observe/report.md)

    .venv/bin/python scripts/gen_pictures.py            # run the trainer (under a minute), write both
    .venv/bin/python scripts/gen_pictures.py --render   # only draw the SVG again from the committed log

The run needs torch (the demo's extra). tests/unit/test_reference_docs.py draws the SVG again from the
committed log and fails when it differs from the committed one: a change to the timeline's drawing
means running `--render` (the run itself is needed only when the log should show something new).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
LOG = IMAGES / "timeline-run.jsonl"
SVG = IMAGES / "timeline.svg"
HOST = "gpu-node-1"
# The demo's settings (scripts/demo.sh) with a nearer deadline and a faster step.
RUN_OPTIONS = ("--deadline", "+40s", "--redundant-time", "10", "--save-duration", "2", "--final-margin", "3",
               "--local-checkpoints-survive", "--log-level", "debug")
TRAINER = ("python", "examples/tiny_trainer.py", "--step-seconds", "0.5")
EXIT_CHECKPOINTED = 75


def esiwrap(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 300) -> int:
    """`python -m esiwrap ARGS` with this checkout's esiwrap."""
    environ = dict(os.environ if env is None else env)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "esiwrap", *args], cwd=cwd, env=environ, timeout=timeout,
                          check=False).returncode


def run_demo() -> None:
    """Run the trainer under esiwrap in a scratch directory and keep its log, made neutral."""
    with tempfile.TemporaryDirectory(prefix="esiwrap-picture-") as scratch:
        job = Path(scratch).resolve()
        ckpt = job / "ckpt"
        ckpt.mkdir()
        log = job / "esiwrap.jsonl"
        env = dict(os.environ)  # `python` in the command is this interpreter, found on PATH
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        code = esiwrap(*RUN_OPTIONS, "--state-file", str(ckpt / "esiwrap-state.json"), "--log-file", str(log),
                       "--", *TRAINER, "--ckpt-dir", str(ckpt), env=env)
        if code != EXIT_CHECKPOINTED:
            msg = f"esiwrap exited {code}, not {EXIT_CHECKPOINTED}: see its output above; the log is not kept"
            raise SystemExit(msg)
        places = {str(ckpt): "/ckpt", str(job): "/job", str(ROOT): "/srv/esiwrap"}
        lines = [neutral(json.loads(line), places) for line in log.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    text = "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines)
    left = leftovers(text, [*places, str(Path.home()), sys.prefix, socket.gethostname()])
    if left:
        msg = f"the log still names {', '.join(left)} after making it neutral; nothing written"
        raise SystemExit(msg)
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text(text, encoding="utf-8")
    print(f"wrote {LOG.relative_to(ROOT)} ({len(lines)} lines)")


def neutral(value: Any, places: dict[str, str]) -> Any:
    """`value` (a log line, or any part of one) with each scratch path replaced and the host named
    `gpu-node-1`."""
    if isinstance(value, dict):
        return {key: neutral(item, places) for key, item in value.items()}
    if isinstance(value, list):
        return [neutral(item, places) for item in value]
    if not isinstance(value, str):
        return value
    if value in {socket.gethostname(), socket.getfqdn()}:
        return HOST
    for place, name in places.items():  # the longest first: the checkpoints are inside the job
        value = value.replace(place, name)
    return value


def leftovers(text: str, names: Sequence[str]) -> list[str]:
    """Which of `names` (paths, the host name) `text` still holds, a host name as a whole word."""
    return [name for name in names
            if name and re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text)]


def render() -> None:
    code = esiwrap("report", str(LOG), "--svg", str(SVG))
    if code != 0:
        msg = f"esiwrap report exited {code}"
        raise SystemExit(msg)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true",
                        help="only draw docs/images/timeline.svg again from the committed log")
    args = parser.parse_args(argv)
    if not args.render:
        run_demo()
    render()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
