"""Advice for people, decided nowhere else: a stop budget too small for a checkpoint, and whether
the trainer resumed from the checkpoint an earlier run left (`--state-file`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from esiwrap import events as ev
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.values import Checkpoint
from esiwrap.times import iso_utc


class Advisories:
    def __init__(self, out: Outbox, stop_budget_s: float | None, resume_from: Checkpoint | None) -> None:
        self._out = out
        self._budget_s = stop_budget_s  # what the platform gives a stop before SIGKILL, if declared
        self._budget_warned_s = 0.0  # the stop needed this long when --stop-budget was last warned
        self.resume_from = resume_from  # the durable checkpoint an earlier run recorded (state file)
        self._resume_checked = False

    def check_stop_budget(self, step_s: float, save_s: float, stop_grace_s: float) -> None:
        """A stop the platform cuts short (SIGKILL after `--stop-budget`) loses the checkpoint
        being written: warn when the rest of a step, a save and `--stop-grace` do not fit in it,
        again only when what is needed grows by a fifth."""
        budget = self._budget_s
        if budget is None:
            return
        needed = step_s + save_s + stop_grace_s
        if needed <= budget or needed <= self._budget_warned_s * 1.2:
            return
        self._budget_warned_s = needed
        self._out.log(
            "warning", ev.STOP_BUDGET_TOO_SMALL, budget_s=rounded(budget), needed_s=rounded(needed),
            step_s=rounded(step_s), save_s=rounded(save_s), stop_grace_s=rounded(stop_grace_s),
            fix=f"raise the platform's stop budget to at least {math.ceil(needed)} s (docker stop -t, "
            "terminationGracePeriodSeconds, TimeoutStopSec) and --stop-budget with it, or lower "
            "--stop-grace if the trainer exits sooner")

    def check_resume(self, start_step: int, fields: Mapping[str, Any]) -> None:
        """Did the trainer start from the checkpoint an earlier run left? Asked once."""
        if self._resume_checked:
            return
        self._resume_checked = True
        checkpoint = self.resume_from
        if checkpoint is None:
            return
        redone = max(0, checkpoint.step - start_step)
        facts = {"checkpoint_step": checkpoint.step, "start_step": start_step, "steps_redone": redone,
                 "path": checkpoint.path or None, "checkpoint_at": iso_utc(checkpoint.completed_at)}
        if redone == 0:
            self._out.log("info", ev.RESUMED, **facts)
            return
        where = "from scratch" if start_step == 0 else f"from step {start_step}, before it"
        self._out.log("warning", ev.RESUME_MISSED, **facts, started=where,
                      causes=resume_causes(checkpoint, fields))


def resume_causes(checkpoint: Checkpoint, fields: Mapping[str, Any]) -> list[str]:
    """Why a trainer may not have resumed from `checkpoint`, from what it said of itself."""
    path = checkpoint.path or "where the last run wrote it"
    if fields.get("integration") == "verl" or "resume_mode" in fields:
        return _verl_resume_causes(checkpoint, path, fields)
    return [f"the trainer did not load the checkpoint of step {checkpoint.step} ({path}): check the "
            "path it resumes from", "the checkpoint must be on this instance: copy it back from where "
            "--upload put it before the trainer starts (--restore CMD does it)"]


def _verl_resume_causes(checkpoint: Checkpoint, path: str, fields: Mapping[str, Any]) -> list[str]:
    mode, folder = fields.get("resume_mode"), fields.get("default_local_dir")
    causes = []
    if mode == "disable":
        causes.append("trainer.resume_mode=disable: verl starts from scratch; set trainer.resume_mode=auto")
    elif mode == "resume_path":
        causes.append(f"trainer.resume_mode=resume_path: trainer.resume_from_path "
                      f"({fields.get('resume_from_path')}) is not the checkpoint of step "
                      f"{checkpoint.step} ({path})")
    causes.append(f"trainer.default_local_dir ({folder or '?'}) must be the directory that holds "
                  f"global_step_{checkpoint.step} and latest_checkpointed_iteration.txt "
                  f"({path}), on this instance")
    return causes
