"""The names of esiwrap's log events: one home for what the supervisor writes and `report` reads.

README.md's Logs table documents each one with its fields.
"""

from __future__ import annotations

CHILD_STARTED = "child_started"
CHILD_STOPPING = "child_stopping"
CHILD_KILLED = "child_killed"
CHILD_EXITED = "child_exited"
COMMAND_FAILED = "command_failed"
DEADLINE_RESOLVED = "deadline_resolved"
DEADLINE_CHANGED = "deadline_changed"
DEADLINE_UNAVAILABLE = "deadline_unavailable"
DEADLINE_WITHDRAWN = "deadline_withdrawn"
DEADLINE_TOO_CLOSE = "deadline_too_close"
TRAINER_ATTACHED = "trainer_attached"
TRAINER_REJECTED = "trainer_rejected"
NO_TRAINER_ATTACHED = "no_trainer_attached"
STEP_OBSERVED = "step_observed"
SAVE_SCHEDULED = "save_scheduled"
STORAGE_PROBED = "storage_probed"
SAVE_REQUESTED = "save_requested"
SAVE_STARTED = "save_started"
SAVE_COMPLETED = "save_completed"
SAVE_FAILED = "save_failed"
SAVE_MISSED = "save_missed"
STOP_EXTENDED = "stop_extended"
STOP_BUDGET_TOO_SMALL = "stop_budget_too_small"
STATE_LOADED = "state_loaded"
STATE_IGNORED = "state_ignored"
STATE_NOT_SAVED = "state_not_saved"
TRAINING_CONTINUES = "training_continues"
SUPERVISOR_EXIT = "supervisor_exit"
SUPERVISOR_FAILED = "supervisor_failed"
SYSTEMD_NOTIFY_FAILED = "systemd_notify_failed"
SYSTEMD_NOTIFY_UNSUPPORTED = "systemd_notify_unsupported"
METRICS_SERVING = "metrics_serving"
OBSERVE_WRITE_FAILED = "observe_write_failed"
STATUS_FILE_UNAVAILABLE = "status_file_unavailable"

ALL = frozenset(value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str))
