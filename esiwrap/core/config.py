"""The decision core's configuration, and the one home of its defaults.

Every default a run option of the core has is written here, once: the option registry
(`esiwrap.cli.options`) takes each option's default from these fields, and builds the
configuration back from the options' values; a test holds that the two agree for every field.
`PolicyConfig` (`esiwrap.core.policy`) is the plan's part of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from esiwrap.choices import AfterSave, OnSigterm
from esiwrap.core.policy import PolicyConfig


@dataclass(frozen=True)
class ControllerConfig:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    save_signal: str = "SIGUSR1"
    stop_signal: str = "SIGTERM"
    stop_grace_s: float = 30.0
    after_save: AfterSave = "stop"
    on_sigterm: OnSigterm = "checkpoint"
    signal_child: bool = False
    stop_budget_s: float | None = None  # what the platform gives a stop before SIGKILL, if declared
    probe_storage: bool = True  # measure the checkpoint storage's speed before the first save
    probe_dir: str | None = None  # where to probe when no trainer names its checkpoint directory
    local_checkpoints_survive: bool = False  # no checkpoint_not_durable warning for a local disk
    state_file: str | None = None  # `--state-file`: the job's state is kept there (its name, for the log)
    max_no_progress_runs: int = 3  # `--max-no-progress-runs`: the guard (0: off)
    restore: bool = False  # `--restore`: bring the job's durable checkpoint back before the command starts
    restore_manifests: bool = False  # `--restore-manifests`: with no checkpoint known, find it in manifests
    restore_optional: bool = False  # `--restore-optional`: a restore that fails lets the command start
    manifests: bool = False  # write a manifest beside each checkpoint before its upload (`--upload`)

    @property
    def uploads(self) -> bool:
        """`--upload` is set: a checkpoint is durable once its upload completed."""
        return self.policy.uploads

    @property
    def verifies(self) -> bool:
        """A checkpoint counts once verified (the built-in check, `--verify`)."""
        return self.policy.verify
