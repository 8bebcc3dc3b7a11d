"""What the decision core's actions do, in a world: one method per action, dispatched from one table.

The controller says what to do (`esiwrap.core.controller.protocol`'s actions); a world says how.
Three worlds implement `Effects`: the real processes (`esiwrap.shell.supervisor`), the simulated
clock (`esiwrap.tools.replay`, the simulator and `esiwrap report --what-if`) and the tests' record
of what was asked. `EFFECTS` is the one table from an action's type to its method, and
`carry_out` the one dispatch; a test holds that every action has its method, as gunicorn's
arbiter has a `handle_<signame>` for each signal it takes.

A method may feed the runner the inputs that follow from what it did (an upload started, the
tree checked): they are applied after the actions at hand, in order.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping

from esiwrap.core.controller.protocol import (
    Action,
    CheckFilesystem,
    CheckTree,
    Exit,
    ExtendStopTimeout,
    FetchManifests,
    KeepState,
    KillTree,
    Log,
    LookForCheckpoint,
    NotifyStopping,
    ProbeStorage,
    RefuseMessage,
    ReleaseCapacity,
    ResolveDeadline,
    SendSignal,
    StartCommand,
    StartRestore,
    StartUpload,
    StopChild,
    StopRestore,
    StopUpload,
    StopVerify,
    TermLeftovers,
    VerifyCheckpoint,
    WriteManifest,
)


class Effects(abc.ABC):
    """A world's way of carrying out each action (every method is the world's to write)."""

    @abc.abstractmethod
    def log(self, action: Log) -> None: ...

    @abc.abstractmethod
    def send_signal(self, action: SendSignal) -> None: ...

    @abc.abstractmethod
    def stop_child(self, action: StopChild) -> None: ...

    @abc.abstractmethod
    def kill_tree(self, action: KillTree) -> None: ...

    @abc.abstractmethod
    def term_leftovers(self, action: TermLeftovers) -> None: ...

    @abc.abstractmethod
    def check_tree(self, action: CheckTree) -> None: ...

    @abc.abstractmethod
    def keep_state(self, action: KeepState) -> None: ...

    @abc.abstractmethod
    def notify_stopping(self, action: NotifyStopping) -> None: ...

    @abc.abstractmethod
    def extend_stop_timeout(self, action: ExtendStopTimeout) -> None: ...

    @abc.abstractmethod
    def probe_storage(self, action: ProbeStorage) -> None: ...

    @abc.abstractmethod
    def start_upload(self, action: StartUpload) -> None: ...

    @abc.abstractmethod
    def stop_upload(self, action: StopUpload) -> None: ...

    @abc.abstractmethod
    def check_filesystem(self, action: CheckFilesystem) -> None: ...

    @abc.abstractmethod
    def release_capacity(self, action: ReleaseCapacity) -> None: ...

    @abc.abstractmethod
    def resolve_deadline(self, action: ResolveDeadline) -> None: ...

    @abc.abstractmethod
    def refuse_message(self, action: RefuseMessage) -> None: ...

    @abc.abstractmethod
    def exit(self, action: Exit) -> None:
        """The run is over: the world stops driving the core (the supervisor leaves its loop)."""

    @abc.abstractmethod
    def verify_checkpoint(self, action: VerifyCheckpoint) -> None: ...

    @abc.abstractmethod
    def stop_verify(self, action: StopVerify) -> None: ...

    @abc.abstractmethod
    def write_manifest(self, action: WriteManifest) -> None: ...

    @abc.abstractmethod
    def look_for_checkpoint(self, action: LookForCheckpoint) -> None: ...

    @abc.abstractmethod
    def fetch_manifests(self, action: FetchManifests) -> None: ...

    @abc.abstractmethod
    def start_restore(self, action: StartRestore) -> None: ...

    @abc.abstractmethod
    def stop_restore(self, action: StopRestore) -> None: ...

    @abc.abstractmethod
    def start_command(self, action: StartCommand) -> None:
        """The command may start now (it waited for the checkpoint to come back)."""


EFFECTS: Mapping[type[Action], str] = {
    Log: "log",
    SendSignal: "send_signal",
    StopChild: "stop_child",
    KillTree: "kill_tree",
    TermLeftovers: "term_leftovers",
    CheckTree: "check_tree",
    KeepState: "keep_state",
    NotifyStopping: "notify_stopping",
    ExtendStopTimeout: "extend_stop_timeout",
    ProbeStorage: "probe_storage",
    StartUpload: "start_upload",
    StopUpload: "stop_upload",
    CheckFilesystem: "check_filesystem",
    ReleaseCapacity: "release_capacity",
    ResolveDeadline: "resolve_deadline",
    RefuseMessage: "refuse_message",
    Exit: "exit",
    VerifyCheckpoint: "verify_checkpoint",
    StopVerify: "stop_verify",
    WriteManifest: "write_manifest",
    LookForCheckpoint: "look_for_checkpoint",
    FetchManifests: "fetch_manifests",
    StartRestore: "start_restore",
    StopRestore: "stop_restore",
    StartCommand: "start_command",
}
"""Each action's method of `Effects`: the one table every world is dispatched through."""


def carry_out(effects: Effects, action: Action) -> None:
    """Do what `action` says in `effects`' world. Anything that is not an action is the caller's
    bug: TypeError at once."""
    name = EFFECTS.get(type(action))
    if name is None:
        msg = f"not an action of the controller: {action!r}"
        raise TypeError(msg)
    getattr(effects, name)(action)
