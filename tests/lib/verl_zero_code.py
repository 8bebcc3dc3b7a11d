"""The zero-code check for one verl install and one loop: `esiwrap -- python tests/lib/verl_driver.py
--loop L` on a local Ray cluster, with no change to verl and nothing of esiwrap in the driver.

    python tests/lib/verl_zero_code.py --loop legacy|v1|sync|recipe|nosave [--timeout 300] [--keep]

Run it with the Python of the verl install under test (esiwrap importable there: installed, or on
PYTHONPATH); it prints one JSON line: the verdict and what esiwrap saw (the loop's hello, the
save asked for and completed, the steps, warnings), the exit code and what is on disk.

* A loop the hook can save (every loop but `nosave`): SIGTERM to esiwrap (a spot notice) once the
  driver printed `step 3`, with a far deadline. PASS: exit 75, exactly one completed save that
  esiwrap asked for, verl's tracker file naming its step, the loop's hello saying it saves.
* `nosave` (a `fit` that reaches no step boundary): a deadline 90 s away, planned for. PASS: one
  `trainer_cannot_save` warning naming the trainer, the hello saying `saves: false`, and exit 76
  whose reason is that warning's.

tests/system/integrations/test_verl_versions.py runs it on the installed verl; scripts/verl_compat.sh
on each verl in a venv of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).resolve().parent / "verl_driver.py"
LOOPS = ("legacy", "v1", "sync", "recipe", "nosave")
EXIT_CHECKPOINTED, EXIT_SAVE_MISSED = 75, 76  # esiwrap.errors' (this file runs without esiwrap too)


def command(loop: str, tmp: Path, python: str) -> list[str]:
    if loop == "nosave":  # esiwrap plans the save: 90 s ahead, 60 s of margin, then the deadline
        timing = ["--deadline", "+90s", "--redundant-time", "60", "--stop-grace", "5"]
    else:
        timing = ["--deadline", "+600s", "--redundant-time", "60"]
    return [python, "-m", "esiwrap", *timing, "--save-duration", "2", "--no-final-save",
            "--log-level", "debug", "--", python, str(DRIVER), "--loop", loop,
            "--ckpt-dir", str(tmp / "ckpt"), "--pid-file", str(tmp / "taskrunner.pid"),
            "--step-seconds", "0.5", "--save-freq", "-1"]


def environment(tmp: Path) -> dict[str, str]:
    """Ray's files in `tmp`, no cloud asked, esiwrap from where this Python finds it (a PYTHONPATH
    given to this process is passed on: the driver and its workers import the same esiwrap)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ESIWRAP_", "RAY_RUNTIME_ENV", "MLP_"))}
    (tmp / "home").mkdir()
    (tmp / "ray").mkdir()
    env.update(HOME=str(tmp / "home"), RAY_TMPDIR=str(tmp / "ray"), RAY_AUTH_MODE="disabled",
               RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", ESIWRAP_SOURCES="cli,env",
               PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    return env


def run(loop: str, timeout: float, python: str = sys.executable, keep: bool = False) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="esz-", dir="/tmp"))  # Ray's socket paths: keep it short
    started = time.monotonic()
    code: int | str = "timeout"
    signalled_at = None
    with open(tmp / "stderr.txt", "wb") as err, open(tmp / "stdout.txt", "wb") as out:
        proc = subprocess.Popen(command(loop, tmp, python), stdout=out, stderr=err, env=environment(tmp),
                                cwd=str(tmp), start_new_session=True)
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                code = proc.returncode
                break
            if loop != "nosave" and signalled_at is None and b"step 3\n" in (tmp / "stdout.txt").read_bytes():
                proc.send_signal(signal.SIGTERM)  # a spot notice, to esiwrap only
                signalled_at = round(time.monotonic() - started, 1)
            time.sleep(0.5)  # polling files a child writes: the content is the event
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    result = summary(loop, tmp, code, signalled_at, round(time.monotonic() - started, 1))
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def summary(loop: str, tmp: Path, code: int | str, signalled_at: float | None,
            seconds: float) -> dict[str, Any]:
    events, other = [], []
    for line in (tmp / "stderr.txt").read_text(errors="replace").splitlines():
        try:
            found = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        (events if isinstance(found, dict) and "event" in found else other).append(found)
    loop_hellos = [e for e in events if e["event"] == "trainer_attached" and e.get("loop")]
    completed = [e for e in events if e["event"] == "save_completed"]
    tracker = tmp / "ckpt" / "latest_checkpointed_iteration.txt"
    cannot = [e for e in events if e["event"] == "trainer_cannot_save"]
    exits = [e for e in events if e["event"] == "supervisor_exit"]
    result: dict[str, Any] = {
        "loop": loop, "exit": code, "seconds": seconds, "sigterm_at_s": signalled_at,
        "verl": loop_hellos[0].get("verl_version") if loop_hellos else None,
        "hello": [{k: e.get(k) for k in ("loop", "trainer", "saves", "boundary")} for e in loop_hellos],
        "saves_completed": [{k: e.get(k) for k in ("step", "requested")} for e in completed],
        "tracker": tracker.read_text() if tracker.exists() else None,
        "steps_seen": sum(1 for e in events if e["event"] == "step_observed"),
        "cannot_save": [e.get("reason") for e in cannot],
        "exit_reason": exits[-1].get("reason") if exits else None,
        "warnings": [f"{e['event']}: {str(e.get('reason', ''))[:200]}" for e in events
                     if e.get("level") in ("warning", "error") and e["event"] != "checkpoint_not_durable"],
        "stderr_tail": [str(x)[:300] for x in other if "arning" not in str(x)][-8:],
        "dir": str(tmp),
    }
    result["verdict"] = "PASS" if verdict(result) else "FAIL"
    return result


def verdict(r: dict[str, Any]) -> bool:
    if r["loop"] == "nosave":
        return (r["exit"] == EXIT_SAVE_MISSED and len(r["cannot_save"]) == 1
                and all(h["saves"] is False for h in r["hello"])
                and r["cannot_save"][0] in (r["exit_reason"] or ""))
    requested = [s for s in r["saves_completed"] if s["requested"]]
    return (r["exit"] == EXIT_CHECKPOINTED and len(requested) == 1
            and r["tracker"] == str(requested[0]["step"])
            and bool(r["hello"]) and all(h["saves"] for h in r["hello"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=LOOPS, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, checkpoints)")
    args = parser.parse_args()
    print(json.dumps(run(args.loop, args.timeout, keep=args.keep)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
