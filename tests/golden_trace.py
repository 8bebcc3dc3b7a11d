"""The decision core's golden trace: every (input, now, actions) it saw, written out in order.

A refactor of `esiwrap.controller` must not change one decision. This drives the real controller
through the simulator's seeded traces (every family, at 1 h and 8 h, with the default policy and with
`--after-save linger`, `--after-save continue` and `--no-final-save`) and through seeded random input
sequences like those of the property tests (`test_controller_properties.py`), and writes each call
as one line: `handle`/`tick`/`finish`, the time, the input, and the actions (`repr`, so every field,
log fields included, in its order). Sections are digested apart (`tests/golden/controller.sha256`):
`tests/test_golden_trace.py` fails when one changes and names it.

    python tests/golden_trace.py --write trace.txt      # the whole text (to diff two commits)
    python tests/golden_trace.py --digests              # what the test compares
    python tests/golden_trace.py --update               # rewrite the digests after a decision change

A deliberate change of a decision (a policy change) rewrites the digests in the same commit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))
sys.path.insert(0, str(HERE))

from controller_driver import CHILD, Driver  # noqa: E402
from traces import FAMILIES, Params, generate  # noqa: E402

from esiwrap import controller as core  # noqa: E402
from esiwrap import replay as replay_module  # noqa: E402
from esiwrap.controller import Controller, ControllerConfig, Now  # noqa: E402
from esiwrap.options import RUN_OPTIONS, build_run_parser, controller_config, resolve_options  # noqa: E402
from esiwrap.policy import PolicyConfig  # noqa: E402

DIGESTS = HERE / "golden" / "controller.sha256"
CONFIGS = ("", "--after-save linger", "--after-save continue", "--no-final-save")
HORIZONS = {"1h": (3600.0, 3), "8h": (28_800.0, 1)}  # horizon: (seconds, runs per family)
RANDOM_SEQUENCES = 400


class Recorder:
    """Where the recording controller writes: the lines of the section being traced."""

    lines: ClassVar[list[str]] = []
    snapshots = False  # also write what `snapshot` says after each call


def show(actions: list[core.Action]) -> str:
    """The actions' reprs; an action without fields by its name (its default repr is an address)."""
    shown = (repr(a) if isinstance(a, tuple) else f"{type(a).__name__}()" for a in actions)
    return "[" + ", ".join(shown) + "]"


class RecordingController(Controller):
    """The real controller; each call also writes a line."""

    def handle(self, input_: core.Input, now: Now, *, fire_timers: bool = True) -> list[core.Action]:
        actions = super().handle(input_, now, fire_timers=fire_timers)
        Recorder.lines.append(f"H {now!r} {input_!r} -> {show(actions)}")
        self._snapshot(now)
        return actions

    def tick(self, now: Now, late_s: float | None = None) -> list[core.Action]:
        actions = super().tick(now, late_s)
        Recorder.lines.append(f"T {now!r} {late_s!r} -> {show(actions)}")
        self._snapshot(now)
        return actions

    def _snapshot(self, now: Now) -> None:
        if Recorder.snapshots:
            Recorder.lines.append(f"S {self.snapshot(now, 'golden', 1).to_json()}")

    def finish(self, now: Now) -> list[core.Action]:
        actions = super().finish(now)
        Recorder.lines.append(f"F {now!r} -> {show(actions)}")
        return actions


def _config(flags: str) -> ControllerConfig:
    return controller_config(resolve_options(build_run_parser().parse_args(flags.split()), RUN_OPTIONS, {}))


def simulator_sections() -> Iterator[tuple[str, Callable[[], None]]]:
    for horizon, (seconds, runs) in HORIZONS.items():
        params = Params(horizon_s=seconds)
        for flags in CONFIGS:
            config = _config(flags)
            for family in FAMILIES:
                for run in range(runs):
                    scenario = generate(family, run, 1, params)
                    yield (f"sim {horizon} {family} #{run} [{flags}]",
                           lambda scenario=scenario, config=config: replay_module.replay(scenario, config))


def random_sequence(seed: int) -> None:
    """Inputs in any order, as the property tests' machine sends them, from a seeded generator (so
    the sequence does not change with hypothesis's version)."""
    rng = random.Random(f"golden:{seed}")
    config = ControllerConfig(
        policy=PolicyConfig(redundant_s=rng.choice([0.0, 120.0]),
                            save_duration_s=rng.choice([1.0, 60.0, 600.0])),
        signal_child=rng.random() < 0.3, after_save=rng.choice(["stop", "linger", "continue"]),
        on_sigterm=rng.choice(["checkpoint", "forward"]), stop_grace_s=rng.choice([5.0, 30.0]),
    )
    driver = Driver(config)
    pids = [CHILD, 5001, 5002, 7777]
    child_gone = False
    for _ in range(60):
        if any(isinstance(a, core.Exit) for a in driver.actions):
            return
        rule = rng.choices(
            ["hello", "gone", "step", "begin", "end", "deadline", "signal", "time", "exit", "tree"],
            weights=[3, 1, 8, 2, 2, 2, 1, 8, 1, 1])[0]
        pid = rng.choice(pids)
        if rule == "hello" and not (pid == CHILD and child_gone):
            driver.feed(core.Hello(pid, saves=rng.random() < 0.8, wants_signal=rng.random() < 0.8,
                                   descendant=rng.random() < 0.9))
        elif rule == "gone":
            driver.feed(core.TrainerGone(pid))
        elif rule == "step":
            driver.feed(core.Step(pid, rng.randint(0, 50), rng.uniform(0.0, 900.0)))
        elif rule == "begin":
            driver.feed(core.SaveBegin(pid, rng.randint(0, 50)))
        elif rule == "end":
            driver.feed(core.SaveEnd(pid, rng.randint(0, 50), ok=rng.random() < 0.8,
                                     duration_s=rng.uniform(0.0, 900.0), path="/ckpt"))
        elif rule == "deadline":
            driver.deadline(rng.uniform(-300.0, 7200.0),
                            source=rng.choice(["cli", "env:MLP", "volcengine", "volcengine-spot"]))
        elif rule == "signal":
            name = rng.choice(["SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", "SIGUSR2"])
            driver.feed(core.SignalReceived(name))
        elif rule == "time":
            driver.advance(rng.uniform(0.0, 900.0))
        elif rule == "exit" and not child_gone:
            child_gone = True
            code = rng.choice([0, 1, None])
            driver.feed(core.ChildExited(CHILD, code, None if code is not None else "SIGKILL", 9))
        elif rule == "tree" and driver.controller.mode in (core.Mode.STOPPING, core.Mode.KILLING):
            driver.feed(core.TreeChecked(rng.choice([0, 1, 3])))


def sections() -> Iterator[tuple[str, Callable[[], None]]]:
    yield from simulator_sections()
    for seed in range(RANDOM_SEQUENCES):
        yield f"random #{seed}", lambda seed=seed: random_sequence(seed)


def traced() -> Iterator[tuple[str, list[str]]]:
    """Each section's name and its lines, the recording controller standing in for the real one."""
    import controller_driver

    saved = replay_module.Controller, controller_driver.Controller
    replay_module.Controller = controller_driver.Controller = RecordingController  # type: ignore[misc]
    try:
        for name, run in sections():
            Recorder.lines, Recorder.snapshots = [], name.startswith("random")
            run()
            yield name, Recorder.lines
    finally:
        replay_module.Controller, controller_driver.Controller = saved  # type: ignore[misc]


def digests() -> dict[str, str]:
    return {name: hashlib.sha256("\n".join(lines).encode()).hexdigest() for name, lines in traced()}


def format_digests(found: dict[str, str]) -> str:
    return "".join(f"{digest}  {name}\n" for name, digest in found.items())


def read_digests(path: Path = DIGESTS) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        digest, name = line.split("  ", 1)
        out[name] = digest
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="PATH", help="the whole trace, every section's lines")
    mode.add_argument("--digests", action="store_true", help="print each section's digest")
    mode.add_argument("--update", action="store_true", help=f"rewrite {DIGESTS.relative_to(HERE.parent)}")
    ns = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        print("golden_trace: run with PYTHONHASHSEED=0 (set iteration order)", file=sys.stderr)
        return 2
    if ns.write:
        with open(ns.write, "w") as out:
            for name, lines in traced():
                out.write(f"### {name}\n")
                out.writelines(line + "\n" for line in lines)
        return 0
    text = format_digests(digests())
    if ns.update:
        DIGESTS.parent.mkdir(exist_ok=True)
        DIGESTS.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

