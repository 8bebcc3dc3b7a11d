"""The documented Kubernetes Job and SkyPilot task (docs/platforms/), as far as this machine allows: the Job's
container command and environment run as PID 1 of a PID namespace (`unshare --pid --fork
--mount-proc`, as a container runtime starts it), the kubelet's SIGTERM is a checkpoint and an
exit 75 inside `terminationGracePeriodSeconds`, and that exit is the one the Job's
podFailurePolicy and the SkyPilot task recover from."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from esiwrap_harness import PYTHON, ROOT, TINY_TRAINER, EsiwrapRun
from pid_namespace import AS_PID_1, pid_1_on_the_host

from esiwrap.errors import EXIT_CHECKPOINTED, EXIT_USAGE

PAGES = {"kubernetes-job": "kubernetes.md", "skypilot-task": "skypilot.md"}


def docs_yaml(marker: str) -> Any:
    """The YAML block that follows `<!-- marker` in its platform page."""
    text = (ROOT / "docs" / "platforms" / PAGES[marker]).read_text(encoding="utf-8")
    after = text.split(f"<!-- {marker}", 1)[1]
    return yaml.safe_load(after.split("```yaml\n", 1)[1].split("```", 1)[0])


@pytest.mark.system
def test_the_documented_job_checkpoints_on_sigterm_within_its_grace_period(tmp_path: Path) -> None:
    """The Job's container, its `python train.py` standing in for the tiny trainer: as PID 1,
    the SIGTERM the kubelet sends is a save, then exit 75 well before the grace period's SIGKILL;
    the declared stop budget is the pod's grace period and holds the checkpoint."""
    job = docs_yaml("kubernetes-job")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    grace_s = float(pod["terminationGracePeriodSeconds"])
    env = {item["name"]: str(item["value"]) for item in container["env"]}
    assert float(env["ESIWRAP_STOP_BUDGET"]) == grace_s
    assert float(env["ESIWRAP_STOP_GRACE"]) < grace_s
    assert container["command"] == ["esiwrap"]
    args = container["args"]
    options, image_command = args[: args.index("--")], args[args.index("--") + 1:]
    assert image_command[:2] == ["python", "train.py"]
    trainer = [PYTHON, str(TINY_TRAINER), "--ckpt-dir", str(tmp_path), "--step-seconds", "0.1"]
    run = EsiwrapRun([*options, "--log-level", "debug", "--", *trainer], env=env, launcher=AS_PID_1)
    try:
        run.wait_event("trainer_attached", 60)
        run.wait_event("step_observed", 30)
        pid_1 = pid_1_on_the_host(run)
        sent = time.monotonic()
        os.kill(pid_1, signal.SIGTERM)  # what the kubelet's runtime sends the container's PID 1
        code = run.finish(grace_s)  # the kubelet's SIGKILL would come after this long
        took_s = time.monotonic() - sent
    finally:
        run.kill()
    assert code == EXIT_CHECKPOINTED and took_s < grace_s
    assert run.first("save_completed")["kind"] == "sigterm"
    assert "stop_budget_too_small" not in run.names()
    assert (tmp_path / "latest.pt").exists()
    assert job_action(job, code) == "Ignore"  # a replacement pod starts and resumes
    assert job_action(job, EXIT_USAGE) == "FailJob"
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it


def job_action(job: dict[str, Any], code: int) -> str | None:
    """What the Job's podFailurePolicy does with the trainer container's exit code."""
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        on = rule.get("onExitCodes")
        if on and on["operator"] == "In" and code in on["values"]:
            return str(rule["action"])
    return None


def test_the_documented_skypilot_task_recovers_on_exit_75() -> None:
    """The task's keys are SkyPilot's own (resources.job_recovery: strategy,
    max_restarts_on_errors, recover_on_exit_codes) and 75 is among the codes it recovers on."""
    task = docs_yaml("skypilot-task")
    recovery = task["resources"]["job_recovery"]
    assert set(recovery) <= {"strategy", "max_restarts_on_errors", "recover_on_exit_codes"}
    assert EXIT_CHECKPOINTED in recovery["recover_on_exit_codes"]
    assert task["run"].strip().startswith("esiwrap ")
    assert task["envs"]["ESIWRAP_SOURCES"].split(",")[:2] == ["cli", "env"]
