"""What goes into the decision core and what comes out of it: the inputs (what happened), the
actions (what to do), the configuration, the time, and the constants the parts share.

An input is what happened (a trainer's report, a signal, a deadline answer: the `Input` union);
"event" is kept for the log's event names (`esiwrap.events`). Inputs and actions are NamedTuples:
as light to make as a tuple, and cheap to define (esiwrap's start-up imports them all).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from esiwrap.choices import LogLevel
from esiwrap.core.config import ControllerConfig as ControllerConfig  # re-exported: the protocol's
from esiwrap.core.manifest import Manifest
from esiwrap.core.state import JobState
from esiwrap.core.values import Answer

KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the tree to vanish
# After the trainers stopped first (their own stop signal) have exited: how long the child (bash, a
# launcher that waits for its command) may take to exit by itself before it gets its stop signal.
LAUNCHER_EXIT_S = 2.0
STOP_TIMEOUT_MARGIN_S = 5.0  # asked of systemd on top of our own stop timeline
DEADLINE_CHANGE_S = 1.0  # smaller moves are the same deadline said twice
SAVE_WRITE_GRACE_FACTOR = 3.0  # a save being written may run this many estimates before it is cut off
UPLOAD_TERM_GRACE_S = 2.0  # an upload cut off gets SIGTERM, then SIGKILL this much later
UPLOAD_EXIT_MARGIN_S = 1.0  # ...and esiwrap is gone this much before the deadline
# A failed upload of the newest checkpoint is tried again as long as no newer checkpoint replaces
# it: after these waits, then waits that double up to UPLOAD_RETRY_MAX_S. Once the child has
# stopped, each wait is cut short so that an attempt of the expected length still ends before the
# cut-off; when none can, esiwrap gives up (exit 74).
UPLOAD_RETRY_S = (5.0, 30.0)  # the waits before the second and the third attempt
UPLOAD_RETRY_MAX_S = 300.0
# `--restore`: a failed attempt (its command failed, or what came back is not valid) is tried again
# after the upload's waits (5 s, then 30 s), RESTORE_ATTEMPTS attempts in all, each ending before the
# restore's cut-off (with a deadline: the latest moment the insurance save could still be signalled).
RESTORE_ATTEMPTS = 3
INVALID_RESAVES = 2  # an invalid checkpoint asks for a save at once, this many times in a row at most


NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


class Now(NamedTuple):
    wall: float  # epoch seconds: deadlines
    mono: float  # monotonic seconds: waits and grace periods


# ---------------------------------------------------------------------------------- inputs
class Launch(NamedTuple):
    """esiwrap is about to start the command: the job's history may say not to (the no-progress
    guard; `Exit` follows); with `--restore`, the checkpoint is looked for and brought back first
    (`LookForCheckpoint` or `FetchManifests` follows, and the shell waits for `StartCommand`) —
    else the shell starts it and `ChildStarted` follows."""


class ChildStarted(NamedTuple):
    pid: int
    argv: tuple[str, ...] = ()
    settings: Mapping[str, Any] = NO_FIELDS  # the run options, for the log
    host: str = ""  # the machine's name: which instance this run was on (`esiwrap report`)


class Hello(NamedTuple):
    pid: int
    rank: int = 0
    saves: bool = True
    wants_signal: bool = True
    stop_signal: str | None = None
    descendant: bool = True  # the shell checked: the process is in esiwrap's own tree
    fields: Mapping[str, Any] = NO_FIELDS
    checkpoint_bytes: float | None = None  # what this process writes of a checkpoint, if it said
    checkpoint_dir: str | None = None  # where its checkpoints go (the storage to probe)
    resumed_from: str | None = None  # the checkpoint it resumed from (its files are a measurement)
    nodes: int | None = None  # how many nodes its job spans, if it said (torchrun: world / local)
    sigterm_saves: bool = False  # it takes SIGTERM as a save request (in a Slurm job)
    cannot_save: str | None = None  # why it cannot save on request (with saves=False; the verl hook)
    sent_mono: float | None = None  # when it was sent, on the sender's monotonic clock (if stamped)


class CheckpointSize(NamedTuple):
    """A trainer says (again) how many bytes its part of a checkpoint holds."""

    pid: int
    checkpoint_bytes: float


class StorageProbed(NamedTuple):
    """The shell measured how fast the checkpoint's storage takes writes (a bounded, fsync'd write
    in the background, or the previous checkpoint's files)."""

    path: str
    bandwidth_bps: float | None  # None: the probe failed (`error` says why)
    written_bytes: float = 0.0  # what the probe wrote, or what the previous checkpoint holds
    seconds: float = 0.0
    source: str = "probe"  # or "previous checkpoint"
    error: str = ""


class TrainerGone(NamedTuple):
    """A trainer's process exited."""

    pid: int


class TrainerLeft(NamedTuple):
    """A trainer said bye: its process is ending, or `uninstall()` took its save handler away,
    and it ignores the save signal from now on. It is signalled no more. A hello of the same
    process sent before the bye and read after it (another client of the process) does not
    attach it again; one sent after it (`install()` again) does. Once the process has exited
    (`TrainerGone`), its pid may be another process's."""

    pid: int
    sent_mono: float | None = None  # when the bye was sent, on the sender's monotonic clock


class Step(NamedTuple):
    pid: int
    step: int
    duration_s: float
    delay_s: float | None = None  # how long the report took to reach esiwrap, where the shell knows


class SaveBegin(NamedTuple):
    pid: int
    step: int
    peer: bool = False  # another node's esiwrap asked for this save (multi-node torchrun)


class SaveSnapshot(NamedTuple):
    """An asynchronous save's blocking part is done: training goes on while the write continues."""

    pid: int
    step: int
    duration_s: float = 0.0
    peer: bool = False


class SaveEnd(NamedTuple):
    pid: int
    step: int
    ok: bool = True
    duration_s: float = 0.0
    path: str = ""
    error: str = ""
    peer: bool = False
    delay_s: float | None = None  # how long the report took to reach esiwrap, where the shell knows


class TrainingStart(NamedTuple):
    """Where the trainer's training starts: the step its state was at (verl: the global step after
    loading its checkpoint; 0 from scratch), with what it says about how it resumes."""

    pid: int
    step: int
    fields: Mapping[str, Any] = NO_FIELDS


class UploadStarted(NamedTuple):
    """The upload helper asked for by `StartUpload` runs."""

    pid: int


class UploadExited(NamedTuple):
    """The upload helper ended (code 0: the checkpoint is uploaded), or could not start (`error`)."""

    pid: int
    code: int | None  # None when killed by a signal or never started
    signal: str | None = None
    stderr: tuple[str, ...] = ()  # its last lines
    error: str = ""  # why it could not start


class FilesystemChecked(NamedTuple):
    """What holds a checkpoint's path (`esiwrap.shell.durability`): kind local, memory, network, fuse,
    cluster or unknown."""

    path: str
    kind: str
    fstype: str
    mount_point: str = ""
    source: str = ""


class CheckpointVerified(NamedTuple):
    """The verification asked for by `VerifyCheckpoint` ended: valid or not (`problem`, `fix`),
    what was checked, by what (`built-in`, `--verify`)."""

    step: int
    path: str
    ok: bool
    format: str = ""
    checked: str = ""
    problem: str = ""
    fix: str = ""
    bytes: int = 0
    files: int = 0
    read_bytes: int = 0
    by: str = "built-in"
    previous_gone: bool = False  # the checkpoint `VerifyCheckpoint.previous` named is no longer there


class CheckpointLooked(NamedTuple):
    """Whether the job's durable checkpoint is on this instance (`LookForCheckpoint`)."""

    path: str
    present: bool


class ManifestsFetched(NamedTuple):
    """The `--restore-manifests` command ended: its code, and the manifests it brought (those that
    are whole), and the files that were not (name, why)."""

    code: int | None
    signal: str | None = None
    manifests: tuple[Manifest, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()
    stderr: tuple[str, ...] = ()
    error: str = ""  # why it could not start


class RestoreStarted(NamedTuple):
    """The `--restore` command asked for by `StartRestore` runs."""

    pid: int


class RestoreExited(NamedTuple):
    """The `--restore` command ended (code 0: the checkpoint is back), or could not start (`error`)."""

    pid: int
    code: int | None
    signal: str | None = None
    stderr: tuple[str, ...] = ()
    error: str = ""


class DeadlineAnswers(NamedTuple):
    answers: tuple[Answer, ...]


class SignalReceived(NamedTuple):
    """A signal to esiwrap (never SIGCHLD: reaping is the shell's, reported as `ChildExited`)."""

    name: str  # "SIGTERM"


class ChildExited(NamedTuple):
    pid: int
    code: int | None  # None when killed by a signal
    signal: str | None = None
    signum: int = 0


class TreeChecked(NamedTuple):
    """While stopping, after every wake-up: how many processes of the child's tree are left."""

    remaining: int


Input = (
    Launch | ChildStarted | Hello | CheckpointSize | StorageProbed | TrainerGone | TrainerLeft | Step
    | SaveBegin | SaveSnapshot | SaveEnd | DeadlineAnswers | SignalReceived | ChildExited | TreeChecked
    | TrainingStart | UploadStarted | UploadExited | FilesystemChecked | CheckpointVerified | CheckpointLooked
    | ManifestsFetched | RestoreStarted | RestoreExited
)


# ---------------------------------------------------------------------------------- actions
class SendSignal(NamedTuple):
    pids: tuple[int, ...]
    signal: str


class StopChild(NamedTuple):
    """Remember the child's tree, then send the child its stop signal (None: only remember the
    tree; a KillTree follows, or the trainers stopped first get their own signal)."""

    signal: str | None


class KillTree:
    """SIGKILL to every remaining process of the child's tree."""


class TermLeftovers:
    """The child is gone: SIGTERM to what is left of its tree."""


class CheckTree:
    """While stopping, after every wake-up: reap, and report what is left of the child's tree
    (`TreeChecked`)."""


class KeepState(NamedTuple):
    """Write the job's state file (`--state-file`), if there is one, with this state (decided by
    `esiwrap.core.job`): as the run starts, every `HEARTBEAT_S` (its exposure so far), after every
    completed save and upload, as it ends, and once more as the shell leaves (`Controller.finish`)."""

    state: JobState


class Log(NamedTuple):
    level: LogLevel
    event: str
    fields: Mapping[str, Any]


class NotifyStopping:
    """Tell the service manager we are on our way out."""


class ExtendStopTimeout(NamedTuple):
    seconds: float


class ReleaseCapacity:
    """Exit 75 and the child's tree is gone: the run is done with this capacity, so the sources
    may let their platform go ahead (Azure `--azure-ack`: approve the scheduled event)."""


StopCause = Literal["deadline", "sigterm", "child", "peer", "by hand", ""]
"""Why a run stopped, for the job's history (`esiwrap.core.history.ending_of`): its deadline (the
planned saves are done, or it came), a SIGTERM from outside, the child's own end, another node's
save, a second Ctrl-C."""


class Exit(NamedTuple):
    code: int
    reason: str
    cause: StopCause = ""  # "" only where no stop began (never from the controller)


class ProbeStorage(NamedTuple):
    """Measure, off the loop, how fast `path`'s filesystem takes a bounded fsync'd write, and what
    the checkpoint `previous` (if any) holds and how long its files took to write; report each as
    StorageProbed."""

    path: str | None
    previous: str | None = None
    max_bytes: int | None = None  # write no more than this (the checkpoint's size, or a small default)


class StartUpload(NamedTuple):
    """Run the `--upload` command for this checkpoint (the shell reports UploadStarted or
    UploadExited)."""

    step: int
    path: str
    attempt: int = 1


class StopUpload(NamedTuple):
    """Send this signal to the running upload's process group (it is being cut off)."""

    signal: str


class ResolveDeadline(NamedTuple):
    """Ask every deadline source again, now (their answers come as `DeadlineAnswers`)."""

    why: str


class CheckFilesystem(NamedTuple):
    """Find out what holds this checkpoint path, off the loop (the shell reports FilesystemChecked)."""

    path: str


class RefuseMessage(NamedTuple):
    """A trainer's message is not believed (it changes nothing): say so. The shell names the
    sender (its command line) and keeps repeats down."""

    refused: Input
    reason: str


class VerifyCheckpoint(NamedTuple):
    """Check this checkpoint off the loop: the built-in check of its metadata (unless it is off),
    then the `--verify` command; the shell reports `CheckpointVerified`. `previous`: the newest
    valid checkpoint's path, to say whether it is still there."""

    step: int
    path: str
    previous: str = ""


class StopVerify(NamedTuple):
    """Give up the running verification: SIGKILL to its `--verify` command's process group; a
    built-in check still running on its thread is left to end, and its answer is not reported."""

    signal: str = "SIGKILL"


class WriteManifest(NamedTuple):
    """Write the checkpoint's manifest beside it before its upload (`esiwrap.core.manifest`): the
    next run finds the checkpoint, and the job's state, from it; `{manifest}` names the file."""

    step: int
    path: str
    written_at: float
    run_id: str
    bytes: int
    files: int
    format: str
    state: JobState


class LookForCheckpoint(NamedTuple):
    """Is this path there (off the loop: a stat can hang)? The shell reports `CheckpointLooked`;
    the command waits for `StartCommand`."""

    path: str


class FetchManifests(NamedTuple):
    """Run the `--restore-manifests` command into an empty directory and read the manifests it put
    there; the shell reports `ManifestsFetched`; the command waits for `StartCommand`."""

    attempt: int = 1


class StartRestore(NamedTuple):
    """Run the `--restore` command for this checkpoint (the shell reports RestoreStarted or
    RestoreExited)."""

    step: int
    path: str
    attempt: int = 1


class StopRestore(NamedTuple):
    """Send this signal to the running restore's (or manifests') process group: it is cut off."""

    signal: str


class StartCommand:
    """The checkpoint is back (or need not be): start the command now (after `Launch` held it)."""



TRAINER_REPORTS = (Step, SaveBegin, SaveSnapshot, SaveEnd, CheckpointSize, TrainingStart, TrainerLeft)
"""What only an attached trainer may say (or the child itself, with --signal-child)."""
# Why a message is refused: a process outside esiwrap's tree (the shell refuses its other messages
# for the same reason), one that is not attached, a save's end or snapshot with no begin.
NOT_IN_TREE = "not in esiwrap's process tree"
NOT_ATTACHED = "not attached: it never said hello (or it said bye)"
NEVER_BEGUN = "it sent no save_begin for this step"
SAID_BYE = "sent before the process said bye, read after it"  # a stale hello: no attach again

Action = (
    SendSignal | StopChild | KillTree | TermLeftovers | CheckTree | Log | NotifyStopping | ExtendStopTimeout
    | KeepState | ReleaseCapacity | Exit | ProbeStorage | StartUpload | StopUpload | CheckFilesystem
    | RefuseMessage | ResolveDeadline | VerifyCheckpoint | StopVerify | WriteManifest | LookForCheckpoint
    | FetchManifests | StartRestore | StopRestore | StartCommand
)
PROBE_REPEAT_S = 6 * 3600.0  # while no save is measured, probe the storage again this often
