"""One row of scripts/verl_compat.sh's table: the zero-code check of the verl installed in this
Python, through each loop it has, and what the hook makes of each of its trainer classes.

    python tests/lib/verl_compat_row.py [--pins TEXT] [--timeout 300] [--json FILE]

Prints one Markdown table row (the header is `HEADER`); with `--json`, writes every run's result.
Run with the venv's Python and esiwrap importable (scripts/verl_compat.sh puts this checkout on
PYTHONPATH).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verl_zero_code import LOOPS, run

HEADER = ("| verl | pins beyond `torch==2.13.0` | legacy `RayPPOTrainer` (`main_ppo`) | V1 (`main_ppo`, "
          "`use_v1`) | `main_ppo_sync` | recipe-style subclass | subclass with no boundary | "
          "trainer classes the hook finds |\n|---|---|---|---|---|---|---|---|")
LOOP_MODULES = {"v1": "verl.trainer.ppo.v1", "sync": "verl.trainer.main_ppo_sync"}
# verl's modules that define PPO trainer classes, in the versions that have them
TRAINER_MODULES = (
    "verl.trainer.ppo.ray_trainer",
    "verl.experimental.separation.ray_trainer",
    "verl.experimental.one_step_off_policy.ray_trainer",
    "verl.experimental.fully_async_policy.fully_async_trainer",
    "verl.experimental.fully_async_policy.fully_async_rollouter",
    "verl.trainer.main_ppo_sync",
    "verl.trainer.ppo.v1.trainer_base",
)


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def trainer_classes() -> list[str]:
    """Each trainer class with a `fit` this verl ships, and what the hook makes of it: the step
    boundary its `fit` reaches, or `cannot save` (it saves, reaches none: a warning), or
    `not a saver` (a rollouter: nothing said)."""
    os.environ["ESIWRAP_RELAY"] = "verl-compat"  # the hook as in a Ray worker of esiwrap's job
    from esiwrap.integrations import ray_relay
    from esiwrap.integrations import verl as hook

    ray_relay.prepare_worker()
    found = []
    for name in TRAINER_MODULES:
        if not has(name):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception as exc:  # a module that needs what a CPU venv lacks
            found.append(f"{name.rsplit('.', 1)[-1]}: import fails ({type(exc).__name__})")
            continue
        for value in list(vars(module).values()):
            cls = getattr(value, "__ray_actor_class__", value)
            if isinstance(cls, type) and cls.__module__ == name and callable(getattr(cls, "fit", None)):
                boundary, saves = hook.fit_reaches(cls)
                if name == hook.VERL_V1_MODULE:
                    boundary = "on_step_end"  # the V1 loop's own, whatever else its fit names
                wrapped = getattr(getattr(cls, "_save_checkpoint", None), hook.PATCHED, False)
                what = boundary or ("cannot save" if saves else "not a saver")
                unwrapped = "" if wrapped or not saves else " (save unwrapped!)"
                found.append(f"`{cls.__name__}`: {what}{unwrapped}")
    return found


def cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "—"
    if result["loop"] == "nosave":
        detail = f"exit {result['exit']}, {len(result['cannot_save'])} warning"
    else:
        saved = [s["step"] for s in result["saves_completed"] if s["requested"]]
        boundary = result["hello"][0]["boundary"] if result["hello"] else "no hello"
        detail = f"exit {result['exit']}, saved step {saved[0] if saved else '-'} at `{boundary}`"
    return f"**{result['verdict']}** ({detail}, {result['seconds']:.0f} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pins", default="", help="what the venv needed beyond verl, for the row")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="write every run's result here")
    parser.add_argument("--loops", default=",".join(LOOPS), help="the loops to run, where this verl has them")
    args = parser.parse_args()
    import verl

    results: dict[str, dict[str, Any] | None] = {}
    for loop in LOOPS:
        wanted = loop in args.loops.split(",")
        results[loop] = run(loop, args.timeout) if wanted and has(LOOP_MODULES.get(loop, "verl")) else None
    classes = trainer_classes()
    if args.json:
        Path(args.json).write_text(json.dumps({"verl": verl.__version__, "results": results,
                                               "classes": classes}, indent=1))
    cells = [cell(results[loop]) for loop in LOOPS]
    print(f"| {verl.__version__} | {args.pins or '—'} | {' | '.join(cells)} | {'<br>'.join(classes)} |")
    return 0 if all(r is None or r["verdict"] == "PASS" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
