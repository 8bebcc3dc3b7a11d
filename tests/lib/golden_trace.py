"""The decision core's golden trace: every call it answered, in production's order, written out.

A refactor of the decision core must not change one decision. This drives the real controller
with the supervisor's own runner (`esiwrap.core.runner`: every waiting input, then the due
timers, once), through the simulator's shell and the tests' driver, along the
simulator's seeded traces (every family, at 1 h and 8 h, with the default policy and with
`--after-save linger`, `--after-save continue` and `--no-final-save`) and through seeded random
input sequences like those of the property tests (`test_controller_properties.py`); then the
checkpoint's own decisions: some families' traces again with the simulator's world answering every
verification at once, valid (`verified` sections), and seeded random sequences that verify
(checkpoints valid, invalid, answered late or never) and that restore before the command starts.
Each call is written twice, apart:

    decisions   `H`/`T`/`F` (an input handled, the timers fired, the shell leaving), the time, the
                input, and the actions that are not log lines (`repr`: every field); after each
                call of a random section, the snapshot (`S`)
    logs        the same call's log lines, each field in its order

The golden copies are `tests/lib/golden/decisions.txt.xz` and `tests/lib/golden/logs.txt.xz`;
`tests/unit/test_golden_trace.py` compares each section and names the first call that differs, with
its golden and its new line.

    python tests/lib/golden_trace.py --write DIR     # the two traces as text (to diff two commits)
    python tests/lib/golden_trace.py --diff          # the first difference of each changed section
    python tests/lib/golden_trace.py --update        # rewrite the golden copies after a decision change

A deliberate change of a decision (a policy change) rewrites the golden copies in the same commit.
"""

from __future__ import annotations

import argparse
import lzma
import os
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
sys.path.insert(0, str(HERE))

import controller_driver  # noqa: E402
from controller_driver import CHILD, T0, Driver  # noqa: E402
from traces import FAMILIES, Params, generate  # noqa: E402

from esiwrap.cli.options import RUN_OPTIONS, build_run_parser, controller_config  # noqa: E402
from esiwrap.core import controller as core  # noqa: E402
from esiwrap.core import manifest as manifests  # noqa: E402
from esiwrap.core.controller import Checkpoint, Controller, ControllerConfig, Now  # noqa: E402
from esiwrap.core.controller.job import Job  # noqa: E402
from esiwrap.core.policy import PolicyConfig  # noqa: E402
from esiwrap.core.state import JobState  # noqa: E402
from esiwrap.optiontypes import resolve_options  # noqa: E402
from esiwrap.tools import replay as replay_module  # noqa: E402

GOLDEN = HERE / "golden"
KINDS = ("decisions", "logs")
CONFIGS = ("", "--after-save linger", "--after-save continue", "--no-final-save")
HORIZONS = {"1h": (3600.0, 3), "8h": (28_800.0, 1)}  # horizon: (seconds, runs per family)
RANDOM_SEQUENCES = 400
VERIFIED_FAMILIES = ("constant", "async", "resumed", "upload", "upload-resumed")
VERIFY_SEQUENCES = 150
RESTORE_SEQUENCES = 100


@dataclass
class Trace:
    """One section's calls: each as its decisions line and its logs line (same index)."""

    decisions: list[str]
    logs: list[str]


class Recorder:
    """Where the recording controller writes: the section being traced."""

    trace: ClassVar[Trace] = Trace([], [])
    snapshots = False  # also write what `snapshot` says after each call


def show(actions: list[core.Action]) -> str:
    """The actions' reprs; an action without fields by its name (its default repr is an address)."""
    shown = (repr(a) if isinstance(a, tuple) else f"{type(a).__name__}()" for a in actions)
    return "[" + ", ".join(shown) + "]"


def record(call: str, actions: list[core.Action]) -> None:
    logs = [a for a in actions if isinstance(a, core.Log)]
    Recorder.trace.decisions.append(f"{call} -> {show([a for a in actions if not isinstance(a, core.Log)])}")
    Recorder.trace.logs.append(show(list(logs)))


class RecordingController(Controller):
    """The real controller; each call also writes its lines."""

    def handle(self, input_: core.Input, now: Now) -> list[core.Action]:
        actions = super().handle(input_, now)
        record(f"H {now!r} {input_!r}", actions)
        self._snapshot(now)
        return actions

    def tick(self, now: Now, late_s: float | None = None) -> list[core.Action]:
        actions = super().tick(now, late_s)
        record(f"T {now!r} {late_s!r}", actions)
        self._snapshot(now)
        return actions

    def _snapshot(self, now: Now) -> None:
        if Recorder.snapshots:
            Recorder.trace.decisions.append(f"S {self.snapshot(now, 'golden', 1).to_json()}")
            Recorder.trace.logs.append("S")

    def finish(self, now: Now) -> list[core.Action]:
        actions = super().finish(now)
        record(f"F {now!r}", actions)
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


def verified_sections() -> Iterator[tuple[str, Callable[[], None]]]:
    """Some families again, in a world that answers every verification at once, valid."""
    config = _config("")
    for horizon, (seconds, _) in HORIZONS.items():
        for family in VERIFIED_FAMILIES:
            scenario = generate(family, 0, 1, Params(horizon_s=seconds))
            verified = replace(scenario, verify_s=[0.0] * len(scenario.steps))
            yield (f"sim {horizon} {family} #0 verified",
                   lambda verified=verified: replay_module.replay(verified, config))


def random_verify_sequence(seed: int) -> None:
    """Inputs in any order with verification on: the shell's answers valid, invalid, late, stale."""
    rng = random.Random(f"golden-verify:{seed}")
    uploads = rng.random() < 0.3
    config = ControllerConfig(
        policy=PolicyConfig(redundant_s=rng.choice([0.0, 120.0]), save_duration_s=rng.choice([1.0, 60.0]),
                            verify=True, verify_duration_s=rng.choice([0.5, 2.0, 30.0]), uploads=uploads),
        after_save=rng.choice(["stop", "linger", "continue"]), stop_grace_s=rng.choice([5.0, 30.0]),
        manifests=uploads)
    driver = Driver(config)
    asked: list[core.VerifyCheckpoint] = []
    for _ in range(70):
        if any(isinstance(a, core.Exit) for a in driver.actions):
            return
        asked = [a for a in driver.actions if isinstance(a, core.VerifyCheckpoint)] or asked
        rule = rng.choices(["hello", "step", "begin", "end", "deadline", "signal", "time", "exit", "tree",
                            "verified", "upload"], weights=[2, 8, 2, 3, 2, 1, 8, 1, 2, 5, 2])[0]
        if rule == "hello":
            driver.feed(core.Hello(CHILD))
        elif rule == "step":
            driver.feed(core.Step(CHILD, rng.randint(0, 50), rng.uniform(0.0, 600.0)))
        elif rule == "begin":
            driver.feed(core.SaveBegin(CHILD, rng.randint(0, 50)))
        elif rule == "end":
            step = rng.randint(0, 50)
            driver.feed(core.SaveEnd(CHILD, step, duration_s=rng.uniform(0.0, 600.0),
                                     path=rng.choice(["", f"/ckpt/{step}", "/ckpt/latest.pt"])))
        elif rule == "deadline":
            driver.deadline(rng.uniform(-60.0, 7200.0))
        elif rule == "signal":
            driver.feed(core.SignalReceived(rng.choice(["SIGTERM", "SIGINT", "SIGUSR1"])))
        elif rule == "time":
            driver.advance(rng.uniform(0.0, 600.0))
        elif rule == "exit":
            driver.feed(core.ChildExited(CHILD, rng.choice([0, 1, None]), None, 0))
        elif rule == "tree" and driver.controller.mode in (core.Mode.STOPPING, core.Mode.KILLING):
            driver.feed(core.TreeChecked(rng.choice([0, 1])))
        elif rule == "verified" and asked:
            check = rng.choice(asked[-2:])
            driver.feed(core.CheckpointVerified(check.step, check.path, rng.random() < 0.6, format="torch",
                                                problem="cut short", previous_gone=rng.random() < 0.1))
        elif rule == "upload" and uploads:
            driver.feed(rng.choice([core.UploadStarted(9001), core.UploadExited(9001, rng.choice([0, 1]))]))


def random_restore_sequence(seed: int) -> None:
    """Before the command starts, with --restore: a checkpoint known or found in manifests, here or
    not, its restore failing, coming back valid or not, cut off by the deadline or a signal."""
    rng = random.Random(f"golden-restore:{seed}")
    checkpoint = Checkpoint(rng.randint(1, 5000), T0 - 600.0, rng.choice(["/ckpt/global_step_9", ""]))
    state = JobState(steps=(10.0,) * 3, saves=(20.0,), updated_at=T0 - 60.0, checkpoint=checkpoint,
                     checkpoint_durable="upload") if rng.random() < 0.6 else None
    config = ControllerConfig(policy=PolicyConfig(verify=True, redundant_s=60.0), restore=True,
                              restore_manifests=rng.random() < 0.5, restore_optional=rng.random() < 0.3,
                              state_file="/shared/state.json")
    driver = Driver(start=False, controller=controller_driver.Controller(config, job=Job(state, T0)))
    driver.feed(core.Launch())
    for _ in range(25):
        if any(isinstance(a, (core.Exit, core.StartCommand)) for a in driver.actions):
            return
        rule = rng.choice(["deadline", "looked", "manifests", "started", "exited", "verified", "time",
                           "signal"])
        asked = [a for a in driver.actions if isinstance(a, core.VerifyCheckpoint)]
        if rule == "deadline":
            driver.deadline(rng.uniform(60.0, 3600.0))
        elif rule == "looked":
            driver.feed(core.CheckpointLooked(checkpoint.path, rng.random() < 0.3))
        elif rule == "manifests":
            step = rng.randint(1, 100)
            text = manifests.render(step, f"/ckpt/global_step_{step}", T0 - 100.0, run_id="r1")
            found = (manifests.parse(text, T0),) if rng.random() < 0.7 else ()
            driver.feed(core.ManifestsFetched(rng.choice([0, 0, 1]), manifests=found))
        elif rule == "started":
            driver.feed(core.RestoreStarted(6161))
        elif rule == "exited":
            driver.feed(core.RestoreExited(6161, rng.choice([0, 0, 1, None])))
        elif rule == "verified" and asked:
            driver.feed(core.CheckpointVerified(asked[-1].step, asked[-1].path, rng.random() < 0.6))
        elif rule == "time":
            driver.advance(rng.uniform(0.0, 120.0))
        elif rule == "signal":
            driver.feed(core.SignalReceived(rng.choice(["SIGTERM", "SIGUSR1", "SIGHUP"])))


def sections() -> Iterator[tuple[str, Callable[[], None]]]:
    yield from simulator_sections()
    for seed in range(RANDOM_SEQUENCES):
        yield f"random #{seed}", lambda seed=seed: random_sequence(seed)
    yield from verified_sections()
    for seed in range(VERIFY_SEQUENCES):
        yield f"random verify #{seed}", lambda seed=seed: random_verify_sequence(seed)
    for seed in range(RESTORE_SEQUENCES):
        yield f"random restore #{seed}", lambda seed=seed: random_restore_sequence(seed)


def traced() -> Iterator[tuple[str, Trace]]:
    """Each section's name and its trace, the recording controller standing in for the real one."""
    saved = replay_module.Controller, controller_driver.Controller
    replay_module.Controller = controller_driver.Controller = RecordingController  # type: ignore[misc]
    try:
        for name, run in sections():
            Recorder.trace, Recorder.snapshots = Trace([], []), name.startswith("random")
            run()
            yield name, Recorder.trace
    finally:
        replay_module.Controller, controller_driver.Controller = saved  # type: ignore[misc]


# ---------------------------------------------------------------------------------- the golden copies
def render(traces: Iterator[tuple[str, Trace]]) -> dict[str, str]:
    """Both traces as text: a `### section` line, then one line per call."""
    out: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for name, trace in traces:
        for kind in KINDS:
            out[kind].append(f"### {name}")
            out[kind].extend(getattr(trace, kind))
    return {kind: "\n".join(lines) + "\n" for kind, lines in out.items()}


def parse(text: str) -> dict[str, list[str]]:
    """Each section's lines, by name."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("### "):
            current = found.setdefault(line[4:], [])
        else:
            current.append(line)
    return found


def read_golden(kind: str) -> str:
    return lzma.decompress((GOLDEN / f"{kind}.txt.xz").read_bytes()).decode()


def write_golden(texts: dict[str, str]) -> None:
    GOLDEN.mkdir(exist_ok=True)
    for kind, text in texts.items():
        (GOLDEN / f"{kind}.txt.xz").write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))


@dataclass(frozen=True)
class Difference:
    kind: str  # decisions or logs
    section: str
    call: int  # 0-based: the first line that differs
    golden: str | None  # None: the section had no such line
    found: str | None

    def __str__(self) -> str:
        return (f"{self.kind}: section {self.section!r}, call {self.call}:\n"
                f"  golden: {_cut(self.golden)}\n  now:    {_cut(self.found)}")


def _cut(line: str | None, width: int = 600) -> str:
    if line is None:
        return "(no such call)"
    return line if len(line) <= width else line[:width] + " …"


def differences(golden: dict[str, str], found: dict[str, str]) -> list[Difference]:
    """The first differing call of every section that differs, decisions before logs."""
    out: list[Difference] = []
    for kind in KINDS:
        old, new = parse(golden[kind]), parse(found[kind])
        for section in [*old, *(s for s in new if s not in old)]:
            a, b = old.get(section), new.get(section)
            if a == b:
                continue
            a, b = a or [], b or []
            call = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                        min(len(a), len(b)))
            out.append(Difference(kind, section, call, a[call] if call < len(a) else None,
                                  b[call] if call < len(b) else None))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DIR", help="the traces as text: DIR/decisions.txt, DIR/logs.txt")
    mode.add_argument("--diff", action="store_true", help="the first difference of each changed section")
    mode.add_argument("--update", action="store_true", help=f"rewrite {GOLDEN.relative_to(HERE.parents[1])}/")
    ns = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        print("golden_trace: run with PYTHONHASHSEED=0 (set iteration order)", file=sys.stderr)
        return 2
    texts = render(traced())
    if ns.write:
        Path(ns.write).mkdir(parents=True, exist_ok=True)
        for kind, text in texts.items():
            (Path(ns.write) / f"{kind}.txt").write_text(text)
    elif ns.update:
        write_golden(texts)
    else:
        found = differences({kind: read_golden(kind) for kind in KINDS}, texts)
        print("\n".join(str(d) for d in found) or "no difference")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
