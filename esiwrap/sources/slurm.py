"""Source `slurm`: the job's end time (its time limit), and the requeue that resumes the job.

    SLURM_JOB_END_TIME (Slurm 23.02 and later: the first answer, no subprocess)
    squeue -h -j <job> -o "%T %e"   with SLURM_TIME_FORMAT=%s   (every later answer)

`scontrol update JobId=… TimeLimit=…` moves the end, so the source asks squeue again every
`--refresh`, at most `SLURM_REFRESH_S` apart (the variable holds the end known at launch only).

What Slurm does at the end (22.05, measured with this project's test cluster): slurmctld checks
limits every 30 s, so the kill comes 0-30 s after the end time; every process of the job then
gets SIGCONT and SIGTERM, and SIGKILL `KillWait` later; when the batch script itself ends, what is
left of the job is killed at once. esiwrap plans against the end time itself, so a job it stops
ends before Slurm's check can call it "cancelled due to time limit".

Off Slurm (no `SLURM_JOB_ID`) `build` starts no source for a run (no thread, no log line);
`esiwrap deadline` still shows it, with the reason. This module is read by every `esiwrap` start
(the registry gathers its `OPTIONS`): `subprocess` is imported when a command runs. Every
failure becomes a `SourceUnavailable` whose reason names what to check; nothing raises past it.
The Slurm commands run with the environment given to the source (PATH finds squeue and
scontrol); their exit status is not relied on while the supervisor reaps (it may collect them
first), only what they print.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from esiwrap import events as ev
from esiwrap.core.values import CapacityKind, Deadline
from esiwrap.envvars import TRAINER_SIGTERM_ENV, TRAINER_SIGTERM_SAVE
from esiwrap.errors import SourceUnavailable
from esiwrap.optiontypes import Option, boolean
from esiwrap.sources.base import Source, SourceSetup
from esiwrap.times import implausible

JOB_ID_ENV = "SLURM_JOB_ID"
ARRAY_JOB_ID_ENV = "SLURM_ARRAY_JOB_ID"
ARRAY_TASK_ID_ENV = "SLURM_ARRAY_TASK_ID"
END_TIME_ENV = "SLURM_JOB_END_TIME"  # Slurm 23.02+: the end projected at launch
RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"  # set from the first requeue on: 1, 2, …

# A TimeLimit update should reach the plan within a minute: Slurm enforces limits every 30 s,
# and one squeue a minute per job is a light load for slurmctld (one RPC each).
SLURM_REFRESH_S = 60.0
SQUEUE_TIMEOUT_S = 10.0  # slurmctld answers in milliseconds; a down one takes squeue ~18 s to admit
EXIT_TIMEOUT_S = 5.0  # each Slurm command at exit: the job's end is near, and no step waits longer
NOT_IN_SLURM = f"not in a Slurm job ({JOB_ID_ENV} is not set)"

NAMES: tuple[str, ...] = ("slurm",)
REQUEUE = Option(
    "--slurm-requeue", boolean, False, "true", "requeue the Slurm job after its checkpoint",
    section="platforms", see="platforms/slurm.md#requeue",
    doc="In a Slurm job, after a stop with a completed checkpoint, once the trainer is gone: "
        "`scontrol requeue` the job (an array task as `<array job id>_<task id>`) while it is "
        "still running or ending on its time limit, then exit 75 (`slurm_requeued`). A job someone "
        "else is ending (`scancel`, preemption) and every esiwrap but the one with `SLURM_PROCID` 0 "
        "are left alone (`slurm_requeue_skipped`); a requeue that fails is one "
        "`slurm_requeue_failed` line, and esiwrap still exits 75.")
OPTIONS: tuple[Option, ...] = (REQUEUE,)

_JOB_ID = re.compile(r"^\d+$")
# squeue's %e: "NONE" for a job without a time limit (--time=UNLIMITED), "N/A" for no end time,
# "Unknown" for an unset one (slurm_make_time_str); otherwise SLURM_TIME_FORMAT=%s makes it epoch
# seconds.
_NO_LIMIT = frozenset({"NONE", "UNLIMITED", "INFINITE"})
_NO_END = frozenset({"N/A", "UNKNOWN"})


@dataclass(frozen=True)
class SlurmJob:
    """This job, as Slurm's variables name it; `ref` is what squeue and scontrol take."""

    job_id: str
    array_job_id: str | None = None
    array_task_id: str | None = None
    restart_count: int = 0

    @property
    def ref(self) -> str:
        """`<array job id>_<task id>` for an array task (the array's own id would name every
        task of it to scontrol requeue), else the job id."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SlurmJob | None:
        """The job esiwrap runs in, or None outside Slurm. Raises SourceUnavailable for a
        `SLURM_JOB_ID` that is not a job id."""
        job_id = environ.get(JOB_ID_ENV, "").strip()
        if not job_id:
            return None
        if not _JOB_ID.match(job_id):
            msg = f"{JOB_ID_ENV}={job_id!r} is not a Slurm job id (digits)"
            raise SourceUnavailable(msg)
        array_job = environ.get(ARRAY_JOB_ID_ENV, "").strip()
        array_task = environ.get(ARRAY_TASK_ID_ENV, "").strip()
        is_array = bool(_JOB_ID.match(array_job) and _JOB_ID.match(array_task))
        return cls(job_id, array_job if is_array else None, array_task if is_array else None,
                   _count(environ.get(RESTART_COUNT_ENV, "")))


def _count(text: str) -> int:
    return int(text.strip()) if text.strip().isdigit() else 0


class SlurmError(Exception):
    """A Slurm command could not answer; the message says what to check."""


def run_slurm(argv: Sequence[str], environ: Mapping[str, str], timeout_s: float) -> str:
    """What a Slurm client command printed on stdout, or SlurmError with the reason.

    Judged by its output, not its exit status: under the supervisor, its reaper may collect the
    process before `subprocess` does, and the status then reads 0. Slurm's clients print their
    answer on stdout and their errors (`slurm_load_jobs error: …`) on stderr."""
    import subprocess

    env = {**environ, "SLURM_TIME_FORMAT": "%s"}
    command = " ".join(argv)
    try:
        done = subprocess.run(list(argv), env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout_s, check=False)
    except FileNotFoundError:
        msg = f"{argv[0]} is not on PATH ({JOB_ID_ENV} is set, but Slurm's client commands are missing)"
        raise SlurmError(msg) from None
    except subprocess.TimeoutExpired:
        msg = f"{command} did not answer within {timeout_s:g}s; is slurmctld up? (scontrol ping)"
        raise SlurmError(msg) from None
    except OSError as exc:
        msg = f"{command} could not run: {exc.strerror or exc}"
        raise SlurmError(msg) from None
    error = _last_line(done.stderr)
    if done.returncode != 0 or (error and not done.stdout.strip()):
        msg = f"{command} failed: {error or f'exit status {done.returncode}'}"
        raise SlurmError(msg)
    return done.stdout


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def parse_end_time(text: str, job: str, now: float) -> float:
    """The end time in squeue's `%T %e` (state, then epoch seconds with SLURM_TIME_FORMAT=%s), or
    SourceUnavailable saying why there is none. Only a running job has an end to plan for: once
    Slurm ends a job (scancel, the time limit) squeue's end is the moment it began to, and the
    SIGKILL comes KillWait later; the deadline known before stands."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        msg = f"squeue does not know job {job} (it has ended, or belongs to another cluster)"
        raise SourceUnavailable(msg)
    if len(lines) > 1:
        msg = f"squeue answered {len(lines)} lines for job {job}, expected one: {lines[:3]!r}"
        raise SourceUnavailable(msg)
    state, _, value = lines[0].partition(" ")
    value = value.strip()
    if state != "RUNNING":
        msg = (f"job {job} is {state[:40]}, not running: Slurm is ending or holding it "
               f"(squeue: {lines[0][:80]!r})")
        raise SourceUnavailable(msg)
    if value.upper() in _NO_LIMIT:
        msg = f"job {job} has no time limit (squeue: {value}): there is no end to plan for"
        raise SourceUnavailable(msg, expected=True)
    if value.upper() in _NO_END:
        msg = f"job {job} has no end time yet (squeue: {value})"
        raise SourceUnavailable(msg)
    return _epoch(value, f"squeue's end time for job {job}", now)


def _epoch(value: str, what: str, now: float) -> float:
    if not value.isdigit():
        msg = (f"{what} is {value[:80]!r}, not epoch seconds "
               "(SLURM_TIME_FORMAT=%s was ignored: a wrapper around squeue?)")
        raise SourceUnavailable(msg)
    at = float(value)
    problem = implausible(at, now)
    if problem is not None:
        msg = f"{what} {value!r} is implausible: {problem}"
        raise SourceUnavailable(msg)
    return at


def build(name: str, setup: SourceSetup) -> list[Source]:
    """The source, where SLURM_JOB_ID is set (or to explain why not)."""
    if not setup.explain and not setup.environ.get(JOB_ID_ENV, "").strip():
        return []
    return [SlurmSource(setup.environ, setup.refresh_s)]


class SlurmSource:
    """The job's end time; asked again every `period_s` because a TimeLimit update moves it."""

    name = "slurm"

    def __init__(self, environ: Mapping[str, str], refresh_s: float = SLURM_REFRESH_S,
                 timeout_s: float = SQUEUE_TIMEOUT_S) -> None:
        self.environ = dict(environ)
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._asked = False
        try:
            self.job, self._job_problem = SlurmJob.from_env(environ), None
        except SourceUnavailable as exc:
            self.job, self._job_problem = None, exc

    @property
    def capacity(self) -> CapacityKind | None:
        """A batch job's limit: a known end, not a preemption; outside a job, nothing to say."""
        return "reserved" if self.job is not None else None

    @property
    def period_s(self) -> float | None:
        if self.job is None:
            return None  # outside a Slurm job nothing will change
        return min(self.refresh_s, SLURM_REFRESH_S)

    def resolve(self, now: float) -> Deadline:
        if self._job_problem is not None:
            raise self._job_problem
        if self.job is None:
            raise SourceUnavailable(NOT_IN_SLURM, expected=True)
        first, self._asked = not self._asked, True
        env_end = self.environ.get(END_TIME_ENV, "").strip()
        if first and env_end:
            try:
                at = _epoch(env_end, END_TIME_ENV, now)
            except SourceUnavailable:
                pass  # squeue may still know; its answer (or failure) is the one to report
            else:
                return self._deadline(at, env_end, END_TIME_ENV)
        try:
            out = run_slurm(["squeue", "-h", "-j", self.job.ref, "-o", "%T %e"], self.environ, self.timeout_s)
        except SlurmError as exc:
            raise SourceUnavailable(str(exc)) from None
        at = parse_end_time(out, self.job.ref, now)
        return self._deadline(at, out.strip().partition(" ")[2].strip(), "squeue")

    def _deadline(self, at: float, raw: str, via: str) -> Deadline:
        assert self.job is not None
        detail = {"job": self.job.ref, "via": via}
        if self.job.restart_count:
            detail["restart_count"] = str(self.job.restart_count)
        return Deadline(at=at, source=self.name, raw=raw, detail=detail, capacity=self.capacity)


# ---------------------------------------------------------------------------------- requeue
LogNote = tuple[str, str, dict[str, Any]]  # level, event, fields

# scontrol's error (slurm_strerror) -> what to change
_REQUEUE_HINTS = {
    "presently disabled": "the job cannot be requeued: submit it with sbatch --requeue (or set JobRequeue=1)",
    "only batch jobs": "only batch jobs can be requeued: submit the script with sbatch",
    "access/permission denied": "this user may not requeue the job",
}


def requeue_refusal(state: str, reason: str, procid: str = "") -> str | None:
    """Why esiwrap must leave the job's fate to Slurm, or None when it requeues: the job still
    runs, or ends on its time limit. A job that is already ending for another reason (scancel,
    preemption, an admin's requeue) is not brought back. With several esiwraps in one job
    (`srun esiwrap …`), only the task with SLURM_PROCID 0 requeues."""
    if procid.strip() not in ("", "0"):
        return f"SLURM_PROCID={procid.strip()}: the task with SLURM_PROCID 0 requeues the job"
    if state == "RUNNING":
        return None
    if state in ("COMPLETING", "TIMEOUT") and reason == "TimeLimit":
        return None
    return (f"the job is {state} (reason {reason or 'none'}): cancelled, preempted or requeued "
            "by someone else, so Slurm decides what follows")


def requeue(environ: Mapping[str, str], timeout_s: float = EXIT_TIMEOUT_S) -> LogNote:
    """`scontrol requeue` this job (after a completed checkpoint), as the log line that says
    what came of it. Never raises. Slurm signals the job's processes (esiwrap too) right after
    it accepts the request: call it last."""
    try:
        job = SlurmJob.from_env(environ)
    except SourceUnavailable as exc:
        return "warning", ev.SLURM_REQUEUE_FAILED, {"job": None, "reason": str(exc)}
    if job is None:
        return "warning", ev.SLURM_REQUEUE_FAILED, {"job": None, "reason": NOT_IN_SLURM}
    try:
        out = run_slurm(["squeue", "-h", "-j", job.ref, "-o", "%T|%r"], environ, timeout_s)
    except SlurmError as exc:
        return "warning", ev.SLURM_REQUEUE_FAILED, {"job": job.ref, "reason": str(exc)}
    state, _, reason = out.strip().partition("|")
    refusal = requeue_refusal(state.strip(), reason.strip(), environ.get("SLURM_PROCID", ""))
    if refusal is not None:
        return "info", ev.SLURM_REQUEUE_SKIPPED, {"job": job.ref, "state": state.strip() or None,
                                                  "reason": refusal}
    try:
        run_slurm(["scontrol", "requeue", job.ref], environ, timeout_s)
    except SlurmError as exc:
        return "warning", ev.SLURM_REQUEUE_FAILED, {"job": job.ref, "reason": _with_hint(str(exc))}
    return "info", ev.SLURM_REQUEUED, {"job": job.ref, "state": state.strip(),
                                       "restart_count": job.restart_count + 1}


def _with_hint(reason: str) -> str:
    lowered = reason.lower()
    for needle, hint in _REQUEUE_HINTS.items():
        if needle in lowered:
            return f"{reason}; {hint}"
    return reason


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What esiwrap adds to the command's environment inside a Slurm job: Slurm sends SIGTERM to
    every process of the job, so the trainer library turns one sent to it into a save request
    (esiwrap stops it with another signal). A value the caller set is kept."""
    if not environ.get(JOB_ID_ENV, "").strip() or TRAINER_SIGTERM_ENV in environ:
        return {}
    return {TRAINER_SIGTERM_ENV: TRAINER_SIGTERM_SAVE}


def requeue_expecting_sigterm(environ: Mapping[str, str]) -> LogNote:
    """`requeue` at esiwrap's exit (main thread). Once Slurm has accepted it, the SIGTERM it sends
    every process of the job (measured: ~12 ms later) would only cut esiwrap's last lines and turn
    its exit 75 into 143: esiwrap ignores it from then on."""
    import signal

    note = requeue(environ)
    if note[1] == ev.SLURM_REQUEUED:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return note
