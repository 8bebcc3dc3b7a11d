"""esiwrap's end of the trainer channel: who sent each datagram, whether it may speak, what it says.

The socket is a datagram socket in a directory only esiwrap's user can enter (another user's
process cannot send). Who sent a datagram is the kernel's answer, not the message's `pid` field:
`SO_PASSCRED` on the socket makes every datagram carry its sender's credentials
(`SCM_CREDENTIALS`: pid, uid, gid, the pid as esiwrap's pid namespace sees it), read with
`recvmsg`. What the bytes say is `esiwrap.trainer.wire`'s to decode. Then (docs/trainer.md, "Who
may speak on the channel"):

* a datagram that is not a message is refused;
* a message whose `pid` field is not its sender is refused, unless its sender said hello as a
  relay (`relay: true`, from esiwrap's tree: the Ray driver) and the message is of a type a
  relay forwards: it then counts as the relay's own, as everything the relay forwards does;
* a hello goes to the controller with whether its sender is in esiwrap's process tree (esiwrap,
  the command and their descendants, orphans esiwrap reaps included); the controller refuses it
  when not, whatever it asks for;
* any other message from outside esiwrap's tree is refused here (a `deadline` too);
* the controller refuses the reports only an attached trainer makes, from a process that is not
  attached, and a save's end or snapshot its sender never began (`RefuseMessage`).

A refused message changes nothing; each refusal is a `message_refused` warning, repeats kept down
(`Refusals`). Where the kernel cannot say who sent a datagram (no `SO_PASSCRED`: not Linux), the
`pid` field is believed, still held to esiwrap's tree, after one `channel_unverified` warning.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import NamedTuple

from esiwrap import events as ev
from esiwrap.core import controller as core
from esiwrap.envvars import TRAINER_SIGTERM_SAVE
from esiwrap.shell import process
from esiwrap.shell.log import Logger
from esiwrap.signals import signal_label, signal_number
from esiwrap.sources import remote
from esiwrap.trainer import wire

MAX_DATAGRAM = 64 * 1024
CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
HAS_CREDENTIALS = hasattr(socket, "SO_PASSCRED") and hasattr(socket, "SCM_CREDENTIALS")
MAX_NODES = 1 << 20  # a hello's node count beyond this is not one
MAX_PATH = 4096  # a path a hello names, as kept
MAX_REASON = 1000  # a hello's `cannot_save`, as kept
MAX_REPORT_DELAY_S = 3600.0  # a report "later" than this was stamped by another machine's clock
CMDLINE_CHARS = 200  # of a refused sender's command line, in its log line
# What a relay forwards for the processes it speaks for; its bye is its own.
RELAYED: frozenset[type[wire.Message]] = frozenset({
    wire.Hello, wire.Step, wire.Checkpoint, wire.SaveBegin, wire.SaveSnapshot, wire.SaveEnd, wire.Start,
    wire.Deadline,
})
# Why the shell refuses a message (the controller's reasons are in `esiwrap.core.controller.protocol`).
NOT_A_MESSAGE = "not a message"
NO_SENDER = "the kernel did not name its sender (a process outside esiwrap's pid namespace)"
NOT_ITS_PID = "its pid field names another process"
GONE = "its process ended before esiwrap read it: where it stood in the tree is unknown"
NO_NODE_ANSWER = "not a plausible deadline answer of a node"
# The message an input of the controller came as, for a refusal's log line.
WIRE_NAMES: dict[type[core.Input], str] = {
    core.Hello: wire.HELLO, core.Step: wire.STEP, core.CheckpointSize: wire.CHECKPOINT,
    core.SaveBegin: wire.SAVE_BEGIN, core.SaveSnapshot: wire.SAVE_SNAPSHOT, core.SaveEnd: wire.SAVE_END,
    core.TrainingStart: wire.START, core.TrainerLeft: wire.BYE,
}


class Datagram(NamedTuple):
    """One datagram read from the socket: who sent it, and what it says."""

    sender: int | None  # the kernel's answer (0: a process it cannot name here); None: not asked
    decoded: wire.Envelope | wire.Malformed


def private_directory() -> str:
    """A new directory only our user can enter, under $TMPDIR (else /tmp, /var/tmp)."""
    bases = [os.environ.get(name, "") for name in ("TMPDIR", "TEMP", "TMP")] + ["/tmp", "/var/tmp"]
    error: OSError | None = None
    for base in filter(None, bases):
        for _ in range(10):
            path = os.path.join(os.path.abspath(base), "esiwrap-" + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            except OSError as exc:  # not there, not writable: the next base
                error = exc
                break
            return path
    msg = f"no writable directory for the trainer channel ($TMPDIR, /tmp, /var/tmp): {error}"
    raise OSError(msg)


class ChannelServer:
    """The socket: bound in a private directory; every datagram read with its sender's
    credentials where the kernel gives them (`credentials`)."""

    def __init__(self) -> None:
        self._dir = private_directory()  # mode 0700: only our user can send
        self.path = os.path.join(self._dir, "channel.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.credentials = False
        if HAS_CREDENTIALS:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                self.credentials = True
        self._sock.bind(self.path)
        self._sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self) -> list[Datagram]:
        """Every datagram waiting now, decoded, with its sender."""
        datagrams: list[Datagram] = []
        room = socket.CMSG_SPACE(CREDENTIALS.size)
        while True:
            try:
                if self.credentials:
                    data, ancillary, flags, _ = self._sock.recvmsg(MAX_DATAGRAM, room)
                else:
                    data, ancillary, flags = self._sock.recv(MAX_DATAGRAM), [], 0
            except (BlockingIOError, InterruptedError):
                return datagrams
            sender = _sender(ancillary) if self.credentials else None
            if flags & getattr(socket, "MSG_TRUNC", 0):
                datagrams.append(Datagram(sender, wire.Malformed(f"longer than {MAX_DATAGRAM} bytes")))
            else:
                datagrams.append(Datagram(sender, wire.decode(data)))

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)


def _sender(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The sending process from SCM_CREDENTIALS (0 when the kernel gave none)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= CREDENTIALS.size:
            pid, _uid, _gid = CREDENTIALS.unpack_from(data)
            return int(pid)
    return 0


class _Told:
    """What the log said of one sender and reason."""

    __slots__ = ("last", "line_at", "lines", "untold")

    def __init__(self) -> None:
        self.lines = 0  # lines written
        self.line_at = -math.inf  # monotonic time of the last one
        self.untold = 0  # refusals since the last line, not written
        self.last: tuple[str, int | None, str] = ("", None, "")  # message, claimed pid, reason


class Refusals:
    """The `message_refused` lines, repeats kept down: a sender's refusals for one reason are
    written the first FIRST_LINES times, then at most one line every EVERY_S that says how many
    like it were not written since the previous one (`suppressed`); `tell_untold` writes, for
    every sender and reason with refusals not yet told, one more (esiwrap calls it as it exits)."""

    FIRST_LINES = 3
    EVERY_S = 60.0
    MAX_KEPT = 1024  # senders and reasons remembered; the oldest is forgotten beyond

    def __init__(self, log: Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._clock = clock
        self._told: dict[tuple[int | None, str], _Told] = {}

    def refused(self, sender: int | None, message: str, claimed_pid: int | None, reason: str,
                detail: str = "") -> None:
        key = (sender, reason)
        told = self._told.get(key)
        if told is None:
            if len(self._told) >= self.MAX_KEPT:
                del self._told[next(iter(self._told))]
            told = self._told[key] = _Told()
        told.last = (message, claimed_pid, f"{reason}: {detail}" if detail else reason)
        now = self._clock()
        if told.lines >= self.FIRST_LINES and now - told.line_at < self.EVERY_S:
            told.untold += 1
            return
        self._line(sender, told)
        told.lines, told.line_at, told.untold = told.lines + 1, now, 0

    def tell_untold(self) -> None:
        for (sender, _), told in self._told.items():
            if told.untold:
                self._line(sender, told)
                told.untold = 0

    def _line(self, sender: int | None, told: _Told) -> None:
        message, claimed_pid, reason = told.last
        more = {"suppressed": told.untold} if told.untold else {}
        self._log.warning(ev.MESSAGE_REFUSED, pid=sender, cmdline=cmdline(sender), message=message or None,
                          claimed_pid=claimed_pid, reason=reason, **more)


def cmdline(pid: int | None) -> str | None:
    """A process's command line as /proc shows it, cut to CMDLINE_CHARS; None where unreadable."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            raw = file.read(CMDLINE_CHARS * 4)
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return text if len(text) <= CMDLINE_CHARS else text[:CMDLINE_CHARS] + "…"


class TrainerChannel:
    """The channel as the supervisor sees it: datagrams in, the controller's inputs out, each from
    its sender, what may not speak refused. `watched(pid)`: the supervisor watches this process
    (it said hello from esiwrap's tree, and lives): no need to look at the tree again."""

    def __init__(self, log: Logger, wall_clock: Callable[[], float], watched: Callable[[int], bool]) -> None:
        self._server = ChannelServer()
        self.path = self._server.path
        self._wall_clock = wall_clock
        self._watched = watched
        self._own_pid = os.getpid()
        self._relays: set[int] = set()  # said hello as a relay, from esiwrap's tree, and live
        self._refusals = Refusals(log)
        if not self._server.credentials:
            log.warning(ev.CHANNEL_UNVERIFIED, reason="this system does not tell a datagram's sender "
                        "(no SO_PASSCRED): a message's pid field is believed, held to esiwrap's process tree")

    def fileno(self) -> int:
        return self._server.fileno()

    def receive(self, received_mono: float) -> list[core.Input]:
        """What the waiting datagrams say that may be believed, as the controller's inputs."""
        inputs = []
        for datagram in self._server.receive():
            input_ = self._admit(datagram, received_mono)
            if input_ is not None:
                inputs.append(input_)
        return inputs

    def refuse(self, action: core.RefuseMessage) -> None:
        """The controller refused a message: say so (its sender is the input's pid)."""
        pid: int | None = getattr(action.refused, "pid", None)
        self._refusals.refused(pid, WIRE_NAMES.get(type(action.refused), ""), pid, action.reason)

    def forget(self, pid: int) -> None:
        """The process left (its bye, its exit): it relays no more."""
        self._relays.discard(pid)

    def tell_untold(self) -> None:
        """Log the refusals the repeat limit kept quiet so far (as esiwrap exits)."""
        self._refusals.tell_untold()

    def close(self) -> None:
        self._server.close()

    # ------------------------------------------------------------------ who may speak
    def _admit(self, datagram: Datagram, received_mono: float) -> core.Input | None:
        decoded = datagram.decoded
        if isinstance(decoded, wire.Malformed):
            self._refusals.refused(datagram.sender, decoded.type, decoded.pid, NOT_A_MESSAGE, decoded.reason)
            return None
        message, name = decoded.message, wire.type_of(decoded.message)
        sender = datagram.sender if self._server.credentials else decoded.pid
        if not sender:
            self._refusals.refused(None, name, decoded.pid, NO_SENDER)
            return None
        if decoded.pid != sender and not (sender in self._relays and type(message) in RELAYED):
            self._refusals.refused(sender, name, decoded.pid, NOT_ITS_PID)
            return None
        if isinstance(message, wire.Hello):  # the controller decides, knowing where it comes from
            descendant = process.is_descendant(sender, self._own_pid)
            if descendant and message.relay:
                self._relays.add(sender)
            return _hello(sender, message, descendant, decoded.sent_mono)
        if not (self._watched(sender) or process.is_descendant(sender, self._own_pid)):
            why = core.NOT_IN_TREE if process.pid_exists(sender) else GONE
            self._refusals.refused(sender, name, decoded.pid, why)
            return None
        if isinstance(message, wire.Deadline):  # another node's answer, relayed by a Ray driver
            answer = remote.from_fields(message._asdict(), self._wall_clock())
            if answer is None:
                self._refusals.refused(sender, name, decoded.pid, NO_NODE_ANSWER)
                return None
            return core.DeadlineAnswers((answer,))
        return _report(sender, message, _report_delay(decoded.sent_mono, received_mono), decoded.sent_mono)


def _hello(pid: int, hello: wire.Hello, descendant: bool, sent_mono: float | None) -> core.Hello:
    stop_signal = signal_number(hello.stop_signal) if hello.stop_signal else None
    nodes = hello.nodes if hello.nodes is not None and hello.nodes > 0 else None
    return core.Hello(
        pid=pid, rank=hello.rank, saves=hello.saves, wants_signal=hello.signal, descendant=descendant,
        stop_signal=signal_label(stop_signal) if stop_signal is not None else None,
        fields=wire.fields_of(hello), checkpoint_bytes=hello.checkpoint_bytes,
        checkpoint_dir=(hello.checkpoint_dir or "")[:MAX_PATH] or None,
        resumed_from=(hello.resumed_from or "")[:MAX_PATH] or None,
        nodes=min(nodes, MAX_NODES) if nodes is not None else None,
        sigterm_saves=hello.sigterm == TRAINER_SIGTERM_SAVE,
        cannot_save=(hello.cannot_save or "")[:MAX_REASON] or None, sent_mono=sent_mono,
    )


def _report(pid: int, message: wire.Message, delay_s: float | None,
            sent_mono: float | None = None) -> core.Input | None:
    """A trainer's report (everything but a hello and a deadline) as the controller's input."""
    match message:
        case wire.Step():
            return core.Step(pid, message.step, message.duration_s, delay_s)
        case wire.Checkpoint():
            return core.CheckpointSize(pid, message.bytes)
        case wire.SaveBegin():
            return core.SaveBegin(pid, message.step, peer=message.peer)
        case wire.SaveSnapshot():
            return core.SaveSnapshot(pid, message.step, message.duration_s, peer=message.peer)
        case wire.SaveEnd():
            return core.SaveEnd(pid, message.step, ok=message.ok, duration_s=message.duration_s,
                                path=message.path or "", error=message.error or "", peer=message.peer,
                                delay_s=delay_s)
        case wire.Start():  # where training starts (the verl hook, after loading)
            return core.TrainingStart(pid, message.step, dict(message.extra))
        case wire.Bye():
            return core.TrainerLeft(pid, sent_mono)
    return None


def _report_delay(sent_mono: float | None, received_mono: float) -> float | None:
    """How long a report took from its sender to the loop, when the sender stamped it with this
    machine's monotonic clock (None: not stamped, or by a clock that is not this machine's)."""
    if sent_mono is None:
        return None
    delay = received_mono - sent_mono
    return max(0.0, delay) if -0.05 <= delay <= MAX_REPORT_DELAY_S else None
