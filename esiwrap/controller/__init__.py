"""The decision core: what the supervisor does, as a pure state machine.

Inputs go in with the time, actions come out; nothing here does I/O or reads a clock, so the
supervisor (`esiwrap.supervisor`, the I/O shell), the policy simulator (`benchmarks/simulate.py`)
and the property tests all drive this same code. `protocol` holds the inputs, actions and
configuration; `core` the `Controller`.
"""

from esiwrap.controller.core import (
    Controller,
    SaveRequest,
    StopState,
    Trainer,
    UploadRun,
    checkpoint_path,
    upload_retry_wait_s,
)
from esiwrap.controller.modes import Mode
from esiwrap.controller.protocol import (
    DEADLINE_CHANGE_S,
    KILL_WAIT_S,
    NO_FIELDS,
    PROBE_REPEAT_S,
    SAVE_WRITE_GRACE_FACTOR,
    STOP_TIMEOUT_MARGIN_S,
    TRAINER_REPORTS,
    UPLOAD_EXIT_MARGIN_S,
    UPLOAD_RETRY_MAX_S,
    UPLOAD_RETRY_S,
    UPLOAD_TERM_GRACE_S,
    Action,
    CheckFilesystem,
    Checkpoint,
    CheckpointSize,
    CheckTree,
    ChildExited,
    ChildStarted,
    ControllerConfig,
    DeadlineAnswers,
    Exit,
    ExtendStopTimeout,
    FilesystemChecked,
    Hello,
    Input,
    KeepState,
    KillTree,
    Log,
    NotifyStopping,
    Now,
    ProbeStorage,
    ReleaseCapacity,
    SaveBegin,
    SaveEnd,
    SaveSnapshot,
    SendSignal,
    SignalReceived,
    StartUpload,
    Step,
    StopChild,
    StopUpload,
    StorageProbed,
    TermLeftovers,
    TrainerGone,
    TrainingStart,
    TreeChecked,
    UploadExited,
    UploadStarted,
)

__all__ = [
    "DEADLINE_CHANGE_S", "KILL_WAIT_S", "NO_FIELDS", "PROBE_REPEAT_S", "SAVE_WRITE_GRACE_FACTOR",
    "STOP_TIMEOUT_MARGIN_S", "TRAINER_REPORTS", "UPLOAD_EXIT_MARGIN_S", "UPLOAD_RETRY_MAX_S",
    "UPLOAD_RETRY_S", "UPLOAD_TERM_GRACE_S", "Action", "CheckFilesystem", "CheckTree", "Checkpoint",
    "CheckpointSize", "ChildExited", "ChildStarted", "Controller", "ControllerConfig",
    "DeadlineAnswers", "Exit", "ExtendStopTimeout", "FilesystemChecked", "Hello", "Input", "KeepState",
    "KillTree", "Log", "Mode", "NotifyStopping", "Now", "ProbeStorage", "ReleaseCapacity", "SaveBegin",
    "SaveEnd", "SaveRequest", "SaveSnapshot", "SendSignal", "SignalReceived", "StartUpload", "Step",
    "StopChild", "StopState", "StopUpload", "StorageProbed", "TermLeftovers", "Trainer", "TrainerGone",
    "TrainingStart", "TreeChecked", "UploadExited", "UploadRun", "UploadStarted", "checkpoint_path",
    "upload_retry_wait_s",
]
