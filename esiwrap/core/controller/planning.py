"""The plan: which save comes next against the deadline, and when its signal goes (the policy,
`esiwrap.core.policy`, decides; this part keeps the plan, counts the deadline's saves and logs)."""

from __future__ import annotations

from typing import Any, Literal

from esiwrap import events as ev
from esiwrap.choices import AfterSave
from esiwrap.core.controller.modes import Mode
from esiwrap.core.controller.outbox import Outbox, rounded
from esiwrap.core.controller.protocol import KILL_WAIT_S, Now
from esiwrap.core.controller.timers import Timer
from esiwrap.core.policy import (
    Observations,
    PolicyConfig,
    SavePlan,
    moved_enough,
    needed_s,
    replan,
    save_estimate_s,
)
from esiwrap.core.values import Deadline
from esiwrap.times import iso_utc

AfterLastSave = Literal["await upload", "await verify", "continue", "linger", "stop"]


class Planner:
    def __init__(self, out: Outbox, obs: Observations, policy: PolicyConfig, stop_grace_s: float,
                 after_save: AfterSave) -> None:
        self._out = out
        self._obs = obs
        self._policy = policy
        self._stop_grace_s = stop_grace_s
        self._after_save = after_save
        self.plan: SavePlan | None = None
        # Insurance and final saves acknowledged against the current deadline (the policy's
        # `saves_done`); back to 0 when a renewal opens a new stretch to insure.
        self.saves_done = 0
        self.awaits_upload = False  # no further save fits while this upload runs: decide at its end
        self._logged_signal_at: float | None = None
        self._warned_too_close = False
        self._jump_note = ""  # the next plan logged says it follows a clock jump

    def after_jump(self, words: str) -> None:
        """The wall clock jumped: the next plan is logged (moved or not), and says so."""
        self._logged_signal_at, self._jump_note = None, f"after {words}: "

    def replan(self, deadline: Deadline, now: Now, remaining_s: float | None) -> SavePlan | None:
        """The next save's plan against the deadline, logged when it moved; None: no further save."""
        plan = replan(deadline.at, self._obs, self._policy, self.saves_done, self.plan, now.wall)
        if plan is None:
            return None
        self.plan = plan
        # Too close: the insurance save should have been asked for a step ago or more (a plan that
        # falls due just now, as a step report arrives on time, is not a warning).
        late_s = now.wall - plan.nominal_at
        too_late = late_s > max(1.0, plan.step_estimate_s)
        if plan.kind == "insurance" and too_late and not self._warned_too_close:
            self._warned_too_close = True
            self._out.log("warning", ev.DEADLINE_TOO_CLOSE, remaining_s=remaining_s,
                          needed_s=rounded(needed_s(plan)))
        # The log shows the plan while steps keep their usual length; the timer may come earlier
        # when a step runs long, and that is logged when the signal is sent.
        if moved_enough(self._logged_signal_at, plan.nominal_at):
            self._logged_signal_at = plan.nominal_at
            self._out.log(
                "info", ev.SAVE_SCHEDULED, kind=plan.kind, signal_at=iso_utc(plan.nominal_at),
                in_s=rounded(plan.nominal_at - now.wall), step_estimate_s=rounded(plan.step_estimate_s),
                save_estimate_s=rounded(plan.save_estimate_s), reserve_s=rounded(plan.reserve_s),
                lateness_s=rounded(plan.lateness_s), why=self._jump_note + plan.why,
            )
            self._jump_note = ""
        return plan

    def after_last_save(self, deadline: Deadline | None, now: Now, *, upload_running: bool,
                        verify_running: bool = False) -> AfterLastSave:
        """No further save is planned: what now. With `--after-save stop`, stop; with `linger`,
        train on until the stop must begin to end before the deadline (nothing trained now can be
        saved, but a deadline that moves later is followed); with `continue`, train on for good.
        While an upload runs, it is the measurement (or the wait) that kept a further save out of
        the plan: decide again when it ends, training on meanwhile. So while the last checkpoint is
        verified: an invalid one is saved again before the stop."""
        self.plan = None
        stop_at = self.latest_stop_at(deadline)
        self.awaits_upload = (upload_running or verify_running) and stop_at is not None and stop_at > now.wall
        if self.awaits_upload:
            return "await upload" if upload_running else "await verify"
        if self._after_save == "continue":
            self._out.log("info", ev.TRAINING_CONTINUES, reason="--after-save continue")
            return "continue"
        if self._after_save == "stop" or stop_at is None or stop_at <= now.wall:
            return "stop"
        self._out.log("info", ev.TRAINING_CONTINUES, reason="no further save fits; training goes on in case "
                      "the deadline moves later", stop_at=iso_utc(stop_at), in_s=rounded(stop_at - now.wall))
        return "linger"

    def stopped(self) -> None:
        self.plan = None

    def upload_ended(self) -> None:
        self.awaits_upload = False

    def acknowledged(self, kind: str) -> None:
        """A deadline save is done: the next plan is a new save (always logged)."""
        if kind in ("insurance", "final"):
            self.saves_done += 1
        self.plan = None
        self._logged_signal_at = None

    def renewed(self) -> None:
        """A later deadline while training went on after the last save: plan against it afresh."""
        self.saves_done = 0

    def reopen(self) -> None:
        """A renewal after a save leaves room for a new insurance save: insure the new stretch too."""
        self.saves_done, self.plan = 0, None
        self._warned_too_close = False

    def forget(self) -> None:
        """No deadline any more: a new one is planned afresh (a new insurance save)."""
        self.plan, self._logged_signal_at = None, None
        self.saves_done, self._warned_too_close = 0, False

    def view(self, mode: Mode) -> dict[str, Any]:
        """The next save (while training with nothing asked for), and what a save is expected to take."""
        plan = self.plan if mode is Mode.RUNNING else None
        return {"next_save_at": plan.nominal_at if plan else None,
                "next_save_kind": plan.kind if plan else None, "next_save_reason": plan.why if plan else None,
                "save_estimate_s": plan.save_estimate_s if plan else save_estimate_s(self._obs, self._policy)}

    def latest_stop_at(self, deadline: Deadline | None) -> float | None:
        """When the stop sequence must begin for esiwrap to exit before the deadline."""
        if deadline is None:
            return None
        return deadline.at - self._stop_grace_s - KILL_WAIT_S

    def timers(self, mode: Mode, deadline: Deadline | None) -> list[Timer]:
        stop_at = self.latest_stop_at(deadline)
        if mode is Mode.CONTINUING and self._after_save == "linger":
            return [] if stop_at is None else [Timer("linger", "wall", stop_at)]
        if mode is not Mode.RUNNING or deadline is None:
            return []
        timers = [] if self.plan is None else [Timer("save signal", "wall", self.plan.signal_at)]
        if self.awaits_upload and stop_at is not None:
            timers.append(Timer("upload decision", "wall", stop_at))  # the upload did not end in time
        return timers
