"""The recipe of docs/running/verl-on-volcengine-esi.md, everything but the cloud: the container's
start.sh, the unchanged run_qwen2-7b.sh behind `bash` (run, not exec'd), a real verl Ray driver,
the checkpoint uploaded to an S3-compatible store on loopback by upload-to-tos.sh with the real
`aws` CLI, its manifest last, exit 75; then the next instance: an empty disk (no checkpoint, no
state file) and the deadline in MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP, as the guide's
install script gives it: esiwrap's --restore-manifests finds the job's checkpoint in the store,
--restore brings it back (restore-from-tos.sh) and verifies it, verl resumes from it, and the
deadline's save ends the run in exit 75.

What stands in for what the container has: `python3` on PATH runs tests/lib/verl_driver.py for
`-m verl.trainer.main_ppo` (its TaskRunner runs verl's real V1 loop on CPU, the step a sleep)
and the real Python for anything else; moto's S3 server for TOS (path-style addressing on
127.0.0.1, where TOS needs virtual-hosted); SIGTERM to esiwrap for `docker stop`; a directory
for the instance's disk, removed between the runs: only the store outlives it. Docker itself is
not run here (no engine): test_the_dockerfile_* checks what of the Dockerfile can be checked
without one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from esiwrap_harness import PYTHON, ROOT, EsiwrapRun, event_time, processes_with_marker, wait_until
from install_commands import COMMANDS
from ray_cluster import ray_env
from s3_store import AWS, S3Store, store_with_bucket

from esiwrap.errors import EXIT_CHECKPOINTED

RECIPE = ROOT / "examples" / "verl-volcengine"
DRIVER = ROOT / "tests" / "lib" / "verl_driver.py"
BUCKET = "grpo-bucket"
JOB = "grpo-qwen2-7b"
RAY_TIMEOUT_S = 240.0
MLP = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

# `python3 -m verl.trainer.main_ppo ARGS` -> the CPU driver with the same overrides, at the same pid
PYTHON3_SHIM = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "verl.trainer.main_ppo" ]; then
    shift 2
    exec {python} {driver} --main-ppo "$@"
fi
exec {python} "$@"
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Ray's Unix socket paths must stay under 108 bytes: a short directory, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="esr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store(short_tmp: Path) -> Iterator[S3Store]:
    with store_with_bucket(short_tmp, BUCKET) as s3:
        yield s3


def container_env(tmp: Path, store: S3Store) -> dict[str, str]:
    """What the unit's grpo.env and the image's ENV give the container, pointed at loopback."""
    shims = tmp / "bin"
    shims.mkdir(exist_ok=True)
    python3 = shims / "python3"
    python3.write_text(PYTHON3_SHIM.format(python=shlex.quote(PYTHON), driver=shlex.quote(str(DRIVER))))
    python3.chmod(0o755)
    return {
        **ray_env(tmp), **store.env("recipe"),
        "PATH": f"{shims}:{Path(PYTHON).parent}:{os.environ['PATH']}",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "GRPO_DIR": str(RECIPE), "CKPT_DIR": str(tmp / "instance" / "ckpt"), "AWS": AWS,
        "TOS_BUCKET": BUCKET, "TOS_ENDPOINT": store.url, "JOB": JOB,
        # esiwrap's settings, as grpo.env gives them (a deadline far off: the stop is `docker stop`)
        "ESIWRAP_DEADLINE": "+600s", "ESIWRAP_REDUNDANT_TIME": "60", "ESIWRAP_SAVE_DURATION": "2",
        "ESIWRAP_FINAL_SAVE": "false", "ESIWRAP_LOG_LEVEL": "debug", "ESIWRAP_SOURCES": "cli,env",
        "ESIWRAP_STOP_GRACE": "60",  # the state file on the instance's disk, as grpo.env has it
        "ESIWRAP_STATE_FILE": str(tmp / "instance" / "ckpt" / "esiwrap-state.json"),
        "VERL_DRIVER_PID_FILE": str(tmp / "taskrunner.pid"), "VERL_DRIVER_STEP_SECONDS": "0.5",
    }


def start_container(tmp: Path, env: dict[str, str], runs: list[EsiwrapRun]) -> EsiwrapRun:
    """`docker run IMAGE`: the image's ENTRYPOINT, start.sh, which execs esiwrap (same pid)."""
    run = EsiwrapRun([], env=env, cwd=str(tmp), launcher=("bash", str(RECIPE / "start.sh")))
    runs.append(run)
    return run


def docker_stop(run: EsiwrapRun, after_step: int) -> int:
    run.wait_stdout(f"step {after_step}\n", RAY_TIMEOUT_S)
    run.proc.send_signal(signal.SIGTERM)
    code = run.finish(timeout=RAY_TIMEOUT_S)
    return code


def test_the_recipe_behind_bash_saves_uploads_stops_with_sigint_and_resumes_on_the_next_instance(
        short_tmp: Path, store: S3Store, runs: list[EsiwrapRun]) -> None:
    """Run 1 (`docker stop`): the driver below bash asked for SIGINT; at the stop it gets SIGINT
    first and shuts Ray down (not SIGTERM, Ray's abort), bash exits after it by itself and gets no
    signal; the save esiwrap asked for is uploaded (checkpoint, then its manifest), exit 75. Run 2,
    on an empty disk, with the deadline the guide's install script gives the container
    (MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP): the manifest names the checkpoint, it comes
    back from the store and is verified, verl resumes from it (`resumed`, no step redone), the
    deadline's save is taken and uploaded, and esiwrap exits 75 before the deadline."""
    env = container_env(short_tmp, store)
    first = start_container(short_tmp, env, runs)
    code = docker_stop(first, after_step=3)
    assert code == EXIT_CHECKPOINTED, (first.names(), first.other_lines[-30:])
    assert first.first("restore_skipped")  # the job's first run: no manifest in the store yet
    assert first.names().index("restore_skipped") < first.names().index("child_started")
    bash = first.first("child_started")
    assert bash["argv"][:2] == ["bash", str(RECIPE / "run_qwen2-7b.sh")]
    driver = next(e for e in first.events
                  if e["event"] == "trainer_attached" and e.get("role") == "ray-driver")
    assert driver["pid"] != bash["pid"] and driver["stop_signal"] == "SIGINT"
    assert first.first("save_requested")["pids"] == [driver["pid"]]
    saved = first.first("save_completed")
    assert saved["requested"] is True
    stopping = first.first("child_stopping")
    assert stopping["signal"] == "SIGTERM"
    assert stopping["first"] == [{"pid": driver["pid"], "signal": "SIGINT"}]
    assert b"driver: SIGINT, shutting Ray down" in first.stdout
    bash_end = first.first("child_exited")  # bash exited by itself, with the driver's status
    assert bash_end["signal"] is None and "child_stop_signalled" not in first.names()
    assert first.first("upload_completed")["step"] == saved["step"]
    step = saved["step"]
    keys = store.keys(BUCKET)
    assert f"{JOB}/global_step_{step}/actor/model_world_size_1_rank_0.pt" in keys
    manifest = json.loads(store.read(BUCKET, f"{JOB}/manifests/global_step_{step}.json"))
    assert (manifest["step"], manifest["verified"]) == (step, "verl")
    assert wait_until(lambda: not processes_with_marker(str(short_tmp / "ray")), timeout=30)

    shutil.rmtree(short_tmp / "instance")  # the next time slot: a new instance, an empty disk
    # Its end is the deadline, as the guide's install script puts it into the container (far
    # enough for Ray to start on a busy node; the insurance save is planned 270 s before it).
    deadline = int(time.time()) + 300
    slot = {k: v for k, v in env.items() if k != "ESIWRAP_DEADLINE"}  # sources: cli, env
    slot.update({MLP: str(deadline), "ESIWRAP_REDUNDANT_TIME": "270"})
    second = start_container(short_tmp, slot, runs)
    code = second.finish(timeout=RAY_TIMEOUT_S + 60)
    assert code == EXIT_CHECKPOINTED, (second.names(), second.other_lines[-30:])
    resolved = second.first("deadline_resolved")
    assert (resolved["source"], resolved["raw"]) == ("env:MLP", str(deadline))
    assert second.first("save_requested")["reason"] == "deadline"
    assert event_time(second.first("supervisor_exit")) < deadline
    found = second.first("manifest_found")
    assert found["step"] == step
    restored = second.first("restored")
    assert restored["step"] == step and restored["path"].endswith(f"/global_step_{step}")
    assert second.names().index("restored") < second.names().index("child_started")
    resumed = second.first("resumed")
    assert (resumed["checkpoint_step"], resumed["start_step"], resumed["steps_redone"]) == (step, step, 0)
    assert second.first("step_observed")["step"] > step
    again = second.first("save_completed")["step"]
    assert again > step and second.first("upload_completed")["step"] == again
    assert f"{JOB}/manifests/global_step_{again}.json" in store.keys(BUCKET)


# ---------------------------------------------------------------------------------- the Dockerfile
def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of examples/verl-volcengine/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (RECIPE / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def test_the_dockerfiles_pip_lines_are_install_commands_the_suite_knows() -> None:
    """Every `pip install` the image runs is one tests/lib/install_commands.py knows (run by
    test_wheel.py, or named with why it cannot run here), and none names verl or torch: the
    image keeps its verl."""
    pips = []
    for instruction, rest in dockerfile():
        if instruction == "RUN":
            for part in rest.split("&&"):
                match = re.search(r"(?:\S*/)?pip3? install\b.*", part)
                if match:
                    pips.append(re.sub(r"^\S*/(pip3? install)", r"\1", match.group(0).strip()))
    assert pips and all(pip in COMMANDS for pip in pips), pips
    assert not [p for p in pips if re.search(r"\b(verl|torch)\b(?!\])", p.replace("./esiwrap", ""))]


def test_the_dockerfile_copies_what_the_checkout_has_and_starts_esiwrap_as_pid_1() -> None:
    """Built from the directory holding the checkout (named esiwrap): every COPY source exists
    there; the base image is the user's own (no default); the entrypoint is start.sh in exec form,
    copied in, and it execs esiwrap; AWS_CONFIG_FILE is the TOS config the image holds."""
    context = {"esiwrap": ROOT}
    steps = dockerfile()
    assert steps[0] == ("ARG", "BASE_IMAGE") and steps[1] == ("FROM", "${BASE_IMAGE}")
    copied: list[str] = []
    for instruction, rest in steps:
        if instruction == "COPY":
            *sources, target = rest.split()
            for source in sources:
                top, _, below = source.partition("/")
                matches = list(context[top].glob(below)) if below else [context[top]]
                assert matches, f"COPY {source}: nothing in the checkout"
                copied += [f"{target.rstrip('/')}/{m.name}" for m in matches if below]
    entrypoint = json.loads(dict(steps)["ENTRYPOINT"])
    assert entrypoint == ["/opt/grpo/start.sh"] and entrypoint[0] in copied
    assert "/opt/grpo/tos-aws-config" in copied
    assert "AWS_CONFIG_FILE=/opt/grpo/tos-aws-config" in dict(steps)["ENV"]
    assert "/opt/grpo/grpo.env" not in copied  # its keys stay on the host
    assert re.search(r"^exec esiwrap ", (RECIPE / "start.sh").read_text(), re.MULTILINE)


def test_the_recipes_scripts_parse_and_its_aws_config_says_virtual_hosted(tmp_path: Path) -> None:
    """`bash -n` for each script; the real aws CLI reads tos-aws-config as TOS needs it."""
    for script in sorted(RECIPE.glob("*.sh")):
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
        assert os.access(script, os.X_OK), script
    env = {**os.environ, "AWS_CONFIG_FILE": str(RECIPE / "tos-aws-config"), "HOME": str(tmp_path)}
    got = subprocess.run([AWS, "configure", "get", "default.s3.addressing_style"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    assert got.stdout.strip() == "virtual"


def test_the_units_environment_file_reads_the_same_for_systemd_and_docker() -> None:
    """grpo.env is both the unit's EnvironmentFile= and `docker run --env-file`: plain KEY=value
    lines (docker keeps quotes as part of the value), and the unit passes it to the container and
    counts 75 as success."""
    for line in (RECIPE / "grpo.env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", key) and not re.search(r"[\"' ]", value), line
    unit = (RECIPE / "esiwrap-grpo.service").read_text()
    assert "--env-file /etc/esiwrap/grpo.env" in unit and "EnvironmentFile=/etc/esiwrap/grpo.env" in unit
    assert re.search(r"^SuccessExitStatus=75$", unit, re.MULTILINE)
    assert re.search(r"^KillMode=mixed$", unit, re.MULTILINE)
