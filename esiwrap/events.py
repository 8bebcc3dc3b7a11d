"""The names of esiwrap's log events: one home for what the supervisor writes and `report` reads.

Each event is declared with its topic, when it is logged and its fields; the events reference
(`docs/reference/events.md`) is written from these by `scripts/gen_reference.py`, and a test fails
when the committed page is not what they say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EventDoc:
    name: str
    topic: str  # one of TOPICS: the events reference's headings
    when: str  # when it is logged, one phrase
    fields: str  # its fields beyond timestamp, level, event and run_id (Markdown)


COMMAND = "The command and esiwrap"
DEADLINES = "Deadlines"
TRAINERS = "Trainers"
SAVES = "Saves"
VERIFY = "Verification"
UPLOADS = "Uploads"
STATE = "State and resumes"
RESTORES = "Restores"
STOPPING = "Stopping"
OUTSIDE = "systemd, metrics and status"
SLURM = "Slurm"
TOPICS = (COMMAND, DEADLINES, TRAINERS, SAVES, VERIFY, UPLOADS, STATE, RESTORES, STOPPING, OUTSIDE, SLURM)

DOCS: dict[str, EventDoc] = {}


def _event(name: str, topic: str, when: str, fields: str) -> str:
    DOCS[name] = EventDoc(name, topic, when, fields)
    return name


# ---------------------------------------------------------------------------- the command
CHILD_STARTED = _event(
    "child_started", COMMAND, "the command started",
    "pid, argv, host (the machine's name: which instance)")
SETTINGS = _event(
    "settings", COMMAND, "once, just after `child_started`: the run's options",
    "settings (the run options that shape decisions, by flag: what `report --what-if` starts from)")
COMMAND_FAILED = _event(
    "command_failed", COMMAND, "the command could not be started",
    "reason (the command was not found or is not executable: exit 127/126)")
CHILD_EXITED = _event(
    "child_exited", COMMAND, "the command ended",
    "pid, code, signal (hint on an unexpected SIGKILL; on a death by the save signal esiwrap sent it: "
    "how long before, and that it had no handler for it)")
SUPERVISOR_EXIT = _event(
    "supervisor_exit", COMMAND, "esiwrap exits",
    "code, reason, last_step, checkpoint_step (the last completed), durable_step (the last "
    "durable: verified, and with `--upload` uploaded), lateness ({\"timers\": {p99_s, max_s}, \"reports\": "
    "{p99_s, max_s}}: how late esiwrap's loop woke for its timers and how long trainer reports took "
    "to reach it, over the run)")
SUPERVISOR_FAILED = _event(
    "supervisor_failed", COMMAND, "a bug in esiwrap (error level)",
    "error, exception (the child gets its stop signal, exit 1)")

# ---------------------------------------------------------------------------- deadlines
DEADLINE_RESOLVED = _event(
    "deadline_resolved", DEADLINES, "a source's first deadline",
    "source, deadline, remaining_s, raw, lead_s, capacity (its kind, when a source said), notice_s "
    "(on capacity a source watches for a notice on every node: how long a notice is) "
    "(+ `volcengine`: instance_id, "
    "scheduled_instance_id, region, expired_at; spot: notice, action; `slurm`: job, via "
    "(`SLURM_JOB_END_TIME` or `squeue`), restart_count after a requeue; `azure`: event_id, "
    "event_type, event_status, resources, description, event_source, duration_s, incarnation, vm; "
    "`gcp`: notice, assumed; another node's: node_id, address)")
DEADLINE_CHANGED = _event(
    "deadline_changed", DEADLINES, "the ruling deadline moved",
    "old, new, source, remaining_s, raw, capacity, notice_s (+ the same detail as `deadline_resolved`)")
DEADLINE_WITHDRAWN = _event(
    "deadline_withdrawn", DEADLINES, "what a source said no longer counts",
    "source, reason (a Ray node left the cluster, an Azure scheduled event was cancelled or is "
    "over, a GCP notice went back). When a source takes back its own ruling deadline and no other "
    "source knows one, none rules: nothing is planned until a new one comes (a node that left keeps "
    "the last deadline)")
EARLY_WARNING = _event(
    "early_warning", DEADLINES, "a risk that is no deadline (once per new warning)",
    "source, reason, action (`save now`, or why not: `none: a save is under way`, `none: the "
    "latest step is saved`, `none: no trainer attached`, `none: stopping`): e.g. an EC2 rebalance "
    "recommendation")
DEADLINE_UNAVAILABLE = _event(
    "deadline_unavailable", DEADLINES, "a source could not answer (again only when the reason changes)",
    "source, reason (info level when the source simply does not apply)")
CLOCK_JUMPED = _event(
    "clock_jumped", DEADLINES,
    "the wall clock moved more than 2 s more (or less) than the monotonic clock between two of "
    "esiwrap's wake-ups (warning): the deadline is on the wall clock, so the plan follows it",
    "jump_s (+ forward, - back), direction, wall_expected (where the wall clock should be), wall_now, "
    "monotonic_elapsed_s, likely_cause (forward: the machine was paused or snapshotted, or the clock "
    "stepped; back: the clock stepped)")
DEADLINE_PASSED_ALIVE = _event(
    "deadline_passed_alive", DEADLINES,
    "the deadline passed with no checkpoint while esiwrap and the trainer still run (a clock jump, a "
    "late wake-up, a save that ran long): a last-chance save, waited for up to --stop-grace (warning)",
    "late_s (how far past the deadline), deadline, clock_jump (jump_s, at; when one came), action")
DEADLINE_OVERSTAYED = _event(
    "deadline_overstayed", DEADLINES,
    "esiwrap still runs a minute past its deadline: the source may be wrong; it is asked again at once "
    "(warning)", "deadline, source, overstay_s, action")
DEADLINE_RECHECKED = _event(
    "deadline_rechecked", DEADLINES, "what the sources said when asked again after an overstay",
    "answers (source, deadline or reason, each)")
DEADLINE_TOO_CLOSE = _event(
    "deadline_too_close", DEADLINES, "the insurance save no longer fits (warning): it is requested at once",
    "remaining_s, needed_s")
CAPACITY_RELEASED = _event(
    "capacity_released", DEADLINES, "exit 75, the child's tree gone: a source told its platform",
    "source, ok, detail (e.g. `--azure-ack`'s `approved scheduled event … (Reboot)`; a failure is "
    "a warning and changes nothing else)")

# ---------------------------------------------------------------------------- trainers
TRAINER_ATTACHED = _event(
    "trainer_attached", TRAINERS, "a trainer process said hello",
    "pid, rank, world_size, saves, integration, … (with checkpoint_bytes, checkpoint_dir, "
    "resumed_from, nodes when the trainer said them; verl's loop, verl_version, trainer, boundary "
    "(the call its steps are reported at) and checkpoint_estimate (how the size was estimated), or "
    "cannot_save with `saves: false`; in a Slurm job also `sigterm: save` and its `stop_signal`)")
TRAINER_CANNOT_SAVE = _event(
    "trainer_cannot_save", TRAINERS,
    "once per process: a trainer said it cannot save when esiwrap asks (warning; the verl hook, for a "
    "training loop with no step boundary it can use)",
    "pid, reason (what it is and what to do; a save esiwrap asks for is then missed: exit 76 with this "
    "reason, unless another trainer saves)")
TRAINER_LEFT = _event(
    "trainer_left", TRAINERS,
    "a trainer said bye: its process is ending (the library says it at exit), or it called `uninstall()`",
    "pid (it gets no save signal any more, and ignores it, until it says hello again)")
MESSAGE_REFUSED = _event(
    "message_refused", TRAINERS,
    "a message on the trainer channel is not believed and changes nothing (warning; a sender's first "
    "3 for one reason, then one line a minute at most, and one at exit for what was not logged)",
    "pid (the sender, as the kernel names it), cmdline (its command line, cut to 200 characters, where "
    "/proc shows it), message (its type, where known), claimed_pid (what its `pid` field says), "
    "reason (not a message and why; not in esiwrap's process tree; its pid field names another "
    "process; not attached; no save_begin for this step; not a plausible node answer; its process "
    "ended before esiwrap read it), suppressed "
    "(how many like it, same sender and reason, were refused since the previous line without one). "
    "See [who may speak on the channel](../trainer.md#who-may-speak-on-the-channel)")
CHANNEL_UNVERIFIED = _event(
    "channel_unverified", TRAINERS,
    "once at start, where the system does not tell who sent a datagram (no `SO_PASSCRED`: not Linux)",
    "reason (a message's `pid` field is believed, still held to esiwrap's process tree)")
NO_TRAINER_ATTACHED = _event(
    "no_trainer_attached", TRAINERS,
    "a save was due and no trainer attached by the end of the attach window (`save_requested`'s "
    "`attach_by`): the child is stopped (exit 76); also a save asked for by hand with nobody to take it",
    "action (stop, or ignored), grace_s (the stop's, up to the deadline), attached_once")
TRAINER_LATE = _event(
    "trainer_late", TRAINERS,
    "the first trainer said hello after the attach window closed and its stop began (warning)",
    "pid, reason (the exit's reason from now on: slow to start, not never attached)")
STEP_OBSERVED = _event(
    "step_observed", TRAINERS, "every step boundary (debug level: `--log-level debug`)",
    "step, duration_s, delivery_s (how long the report took to reach esiwrap, from the `sent_mono` "
    "stamp the trainer library puts on every message)")
STORAGE_PROBED = _event(
    "storage_probed", TRAINERS, "the checkpoint storage's write speed was measured",
    "path, source (`probe`, or `previous checkpoint`), bandwidth_mb_s, written_bytes (the probe's "
    "write, or the previous checkpoint's bytes), seconds; or error (a warning: no prior from it)")

# ---------------------------------------------------------------------------- saves
SAVE_SCHEDULED = _event(
    "save_scheduled", SAVES, "a save was planned, or its moment moved by more than 5 s",
    "kind (calibration/periodic/insurance/final), signal_at, in_s, step_estimate_s, "
    "save_estimate_s, reserve_s (the slack kept before the deadline: `--redundant-time` for "
    "insurance, `--final-margin` for final saves, 0 for the others), lateness_s (added to the "
    "slack: esiwrap's own lateness on this node), why (one phrase: the rule that "
    "planned it and what the estimate rests on: a measured save, an earlier run's, `prior 700s from "
    "140 GB at 200 MB/s (probe)`, or a guess; for a periodic save, the interruption rate it assumed "
    "and where that came from)")
SAVE_REQUESTED = _event(
    "save_requested", SAVES, "the save signal was sent",
    "reason (deadline/sigterm/manual/peer/early_warning/invalid; deadline for every planned save; peer: "
    "a save another node's esiwrap asked for, seen in the trainer's messages, multi-node torchrun; "
    "early_warning: after an `early_warning`; invalid: the last checkpoint failed its checks), kind, "
    "remaining_s (null without a deadline), signal, pids; for a planned save also planned_at, late_s "
    "(the moment the signal went out minus planned_at), step_estimate_s, save_estimate_s, why (the "
    "plan when it fired)")
SAVE_STARTED = _event(
    "save_started", SAVES, "a trainer began writing a checkpoint",
    "step, pid, requested")
SAVE_COMPLETED = _event(
    "save_completed", SAVES, "the trainer says the checkpoint is complete (acknowledged); it counts once "
    "verified (`checkpoint_verified`)",
    "step, kind, duration_s, path, remaining_s, requested")
SAVE_FAILED = _event(
    "save_failed", SAVES, "the trainer reported a failed save; the next boundary tries again",
    "step, pid, error")
SAVE_MISSED = _event(
    "save_missed", SAVES, "a save asked for was not acknowledged in time (and on the way to exit 76: why)",
    "remaining_s, reason; on the way to exit 76 also last_plan (kind, signal_at, the estimates, "
    "reserve_s, lateness_s, why), signal (reason, requested_at, late_s, pids, step_reports_since), "
    "late (timers_max_s, reports_max_s, last_step_report_s_ago) and never_came (what the save "
    "waited for and did not get, the deciding one first: no hello, no save asked for, nobody to "
    "signal, no step boundary after the signal, steps without a save, a save begun and never "
    "ended, a failed save)")
TRAINING_CONTINUES = _event(
    "training_continues", SAVES, "after the last save that fits, the trainer trains on",
    "reason (`--after-save continue`, or linger: \"no further save fits…\" with stop_at, in_s)")
CHECKPOINT_NOT_DURABLE = _event(
    "checkpoint_not_durable", SAVES,
    "once, at the first completed save: the checkpoint is on a local disk and there is no `--upload`",
    "path, filesystem, mount_point, device, fix")

# ---------------------------------------------------------------------------- verification
CHECKPOINT_VERIFIED = _event(
    "checkpoint_verified", VERIFY, "a completed checkpoint passed its checks: it counts from now on",
    "step, path, format (verl, hf-trainer, dcp, directory, safetensors, lightning, torch, unknown), checked "
    "(what was checked, in words), seconds (the whole verification, as esiwrap waited for it), bytes, "
    "files, read_bytes (what the built-in check read), by (`built-in`, `--verify`, or both), remaining_s")
CHECKPOINT_INVALID = _event(
    "checkpoint_invalid", VERIFY, "a completed checkpoint failed its checks, or its verification did not end "
    "in time (error): it never counts",
    "step, path, problem (which file, entry or offset; or the `--verify` command's exit and last stderr "
    "line; or `not verified: …` when it was cut off), fix, format, checked, seconds, by, durable_step (the "
    "newest valid checkpoint, which stays the durable one; null: none of this run), action (`save again "
    "now`, or why not)")
CHECKPOINT_NOT_VERIFIED = _event(
    "checkpoint_not_verified", VERIFY, "once: a checkpoint with no path and no `--verify` command cannot be "
    "checked (warning); it counts as the trainer said",
    "step, fix (report the path: `saving(step, path)`)")
PREVIOUS_CHECKPOINT_DELETED = _event(
    "previous_checkpoint_deleted", VERIFY, "once: the last valid checkpoint was deleted (all of it, or "
    "files of it: verl's rotation) before the next one was verified (warning)",
    "path (the one deleted), step, new_step, new_path, fix (keep it until the new one counts: verl's "
    "`trainer.max_actor_ckpt_to_keep` of 2 or more; write to a new path, then switch)")

# ---------------------------------------------------------------------------- uploads
UPLOAD_WITHOUT_PATH = _event(
    "upload_without_path", UPLOADS,
    "at the start (warning): the `--upload` command names neither `{path}` nor "
    "`$ESIWRAP_CHECKPOINT_PATH`, so it copies the same thing after every save",
    "upload, fix (right for a script that reads `ESIWRAP_CHECKPOINT_PATH` itself, or for a "
    "directory that holds every checkpoint)")
UPLOAD_STARTED = _event(
    "upload_started", UPLOADS, "`--upload`: the command runs for this checkpoint (once it was verified)",
    "step, path, pid, attempt, upload_estimate_s, remaining_s")
UPLOAD_COMPLETED = _event(
    "upload_completed", UPLOADS, "the checkpoint is durable",
    "step, path, duration_s, attempt, remaining_s")
UPLOAD_FAILED = _event(
    "upload_failed", UPLOADS, "an upload failed, could not start or was cut off",
    "step, path, code, signal, duration_s, attempt, stderr (its last lines), remaining_s; error (it "
    "could not start), reason (`cut off: …` when esiwrap stopped it)")
UPLOAD_SKIPPED = _event(
    "upload_skipped", UPLOADS,
    "a newer checkpoint completed while another upload ran: this one is never uploaded",
    "step, path, superseded_by, reason")
UPLOAD_RETRY_PLANNED = _event(
    "upload_retry_planned", UPLOADS, "a failed upload will be tried again",
    "step, path, attempt (the one planned), in_s, reason (`backoff`, or, once the child has "
    "stopped, `the latest start that still ends before the cut-off`), expected_s (how long an "
    "attempt is expected to take), remaining_s; at a stop also cutoff_in_s")
UPLOAD_GIVEN_UP = _event(
    "upload_given_up", UPLOADS, "no further upload attempt can end before the cut-off (warning): exit 74",
    "step, path, attempts, expected_s, cutoff_in_s, reason")

# ---------------------------------------------------------------------------- state and resumes
STATE_LOADED = _event(
    "state_loaded", STATE, "`--state-file` was read at the start",
    "path, steps, saves, longest_save_s, uploads, longest_upload_s, checkpoint_step, runs (the "
    "job's history: earlier runs recorded), age_s (or note: no state file yet)")
STATE_IGNORED = _event(
    "state_ignored", STATE, "the state file was not used (warning)",
    "path, reason (corrupt, not an esiwrap state file, stale, unreadable)")
STATE_NOT_SAVED = _event(
    "state_not_saved", STATE, "the state file could not be written (once; training goes on)",
    "path, error")
STATE_LOCK_TAKEN_OVER = _event(
    "state_lock_taken_over", STATE,
    "`--state-file`'s lock was left by a run that is gone: taken over (warning)",
    "path, holder_pid, holder_host, holder_run_id, holder_started_at, holder_refreshed_at, why (its "
    "process is gone; or its host has not refreshed the lock), recorded_as (how its open record ends in "
    "the job's history: `killed` when its esiwrap died on this machine, which lived on; else "
    "`interrupted`)")
STATE_LOCK_FAILED = _event(
    "state_lock_failed", STATE,
    "`--state-file`'s lock file could not be made: the run goes on without (warning)",
    "path, error, note")
RESUMED = _event(
    "resumed", STATE, "the trainer started from the durable checkpoint the state file names",
    "checkpoint_step, start_step, steps_redone, path, checkpoint_at")
NO_PROGRESS = _event(
    "no_progress", STATE, "the job's last `--max-no-progress-runs` runs did not advance its durable "
    "step: this run is not started, exit 78 (error)",
    "path, limit, runs (each: run_id, hours, ending, start_step, end_step, saves, uploads, "
    "uploads_failed), steps, cause (slot shorter than a step plus a save; resume failing; uploads "
    "failing), fix")
RESUME_MISSED = _event(
    "resume_missed", STATE, "the trainer started from scratch or further back (warning)",
    "checkpoint_step, start_step, steps_redone, path, checkpoint_at, started, causes")

# ---------------------------------------------------------------------------- restores
RESTORE_SKIPPED = _event(
    "restore_skipped", RESTORES, "`--restore`: nothing to bring back before the command starts",
    "reason (the job has no durable checkpoint yet; it is on this instance already, with step and path; no "
    "manifest was found: a warning)")
MANIFEST_FOUND = _event(
    "manifest_found", RESTORES, "`--restore-manifests`: the newest complete manifest names the checkpoint to "
    "restore",
    "step, path, written (when), written_by (the run_id of the run that wrote it), manifests (how many "
    "were read), rejected (each file not used, and why: incomplete, corrupt, another format), state "
    "(whether it brought the job's state)")
RESTORE_STARTED = _event(
    "restore_started", RESTORES, "`--restore`: the command runs to bring the checkpoint back",
    "step, path, pid, attempt, expected_s (the longest restore measured, if any), cutoff_in_s (how long it "
    "may take; null without a deadline), cutoff_for (the save that must still fit before the deadline: `the "
    "insurance save`, or in a slot already too short for it `the final save`)")
RESTORED = _event(
    "restored", RESTORES, "the checkpoint is back and verified: the command starts",
    "step, path, seconds (the restore and its verification), bytes, files, format, attempt")
RESTORE_FAILED = _event(
    "restore_failed", RESTORES, "a restore attempt failed, what came back is not valid, or no attempt fits "
    "(error)",
    "step, path, attempt, code, signal, stderr (its last lines), problem, fix, action (`retry in N s`, `exit "
    "66`, or `start the command without it (--restore-optional)`)")
MANIFEST_NOT_WRITTEN = _event(
    "manifest_not_written", UPLOADS, "the manifest could not be written beside the checkpoint (warning): it "
    "is written to a local directory instead",
    "path, error, written_to")

# ---------------------------------------------------------------------------- stopping
CHILD_STOPPING = _event(
    "child_stopping", STOPPING, "the stop sequence began",
    "signal (the child's), grace_s, reason; first ([{pid, signal}]: the trainers below the child that "
    "asked for a stop signal of their own get it first, and the child gets `signal` only once they "
    "have exited; see [the stop sequence](signals.md#the-stop-sequence))")
CHILD_STOP_SIGNALLED = _event(
    "child_stop_signalled", STOPPING,
    "the trainers stopped first have exited, and the child has not exited by itself 2 s later: it gets "
    "its stop signal now",
    "pid, signal, reason")
STOP_SIGNAL_NOT_HONOURED = _event(
    "stop_signal_not_honoured", STOPPING,
    "once per process: a trainer asked for a stop signal esiwrap cannot give it (warning)",
    "pid, asked (the signals it asked for), used (what it will get, or null), reason (its hello came "
    "from outside esiwrap's process tree, which esiwrap never signals; one process asked for two "
    "different stop signals: the latest is used)")
CHILD_KILLED = _event(
    "child_killed", STOPPING, "what was left of the tree after `--stop-grace` got SIGKILL",
    "signal, pids")
STOP_EXTENDED = _event(
    "stop_extended", STOPPING, "a save is being written when the stop wait ends",
    "until_s, reason")
STOP_BUDGET_TOO_SMALL = _event(
    "stop_budget_too_small", STOPPING,
    "at the first hello, again when a measured step or save makes the stop need a fifth more",
    "budget_s, needed_s, step_s, save_s, stop_grace_s, fix")

# ---------------------------------------------------------------------------- the outside views
SYSTEMD_NOTIFY_FAILED = _event(
    "systemd_notify_failed", OUTSIDE, "once: `$NOTIFY_SOCKET` did not take a notification",
    "error")
SYSTEMD_NOTIFY_UNSUPPORTED = _event(
    "systemd_notify_unsupported", OUTSIDE,
    "a `$NOTIFY_SOCKET` that is neither a path nor `@name`, e.g. `vsock:`: no notifications",
    "socket")
METRICS_SERVING = _event(
    "metrics_serving", OUTSIDE, "`--metrics-port`: where the endpoint listens",
    "url, address, port")
OBSERVE_WRITE_FAILED = _event(
    "observe_write_failed", OUTSIDE,
    "the metrics or status file could not be written (once per error; the run goes on)",
    "path, error")
STATUS_FILE_UNAVAILABLE = _event(
    "status_file_unavailable", OUTSIDE,
    "no directory for the default status file: `esiwrap status` will not see this run",
    "looked_in, fix")

# ---------------------------------------------------------------------------- slurm
SLURM_REQUEUED = _event(
    "slurm_requeued", SLURM, "`--slurm-requeue` put the job back in the queue",
    "job, state (`RUNNING`, or `COMPLETING` on the time limit), restart_count (the next run's "
    "`SLURM_RESTART_COUNT`)")
SLURM_REQUEUE_FAILED = _event(
    "slurm_requeue_failed", SLURM, "the requeue failed (esiwrap still exits 75)",
    "job, reason (scontrol's error and what to change)")
SLURM_REQUEUE_SKIPPED = _event(
    "slurm_requeue_skipped", SLURM, "the job was not requeued",
    "job, state, reason (the job is being ended by someone else: scancel, preemption, an admin's "
    "requeue; or not the task with `SLURM_PROCID` 0)")

ALL = frozenset(DOCS)
