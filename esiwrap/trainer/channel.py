"""Trainer -> supervisor messages: JSON datagrams on a Unix socket named by `ESIWRAP_SOCKET`.

Datagrams keep message boundaries, need no connection, and a full or missing receiver makes
`send` fail at once instead of blocking a training step. Messages (every one carries `pid`, and
`sent_mono`, the sender's `time.monotonic()`, from which the supervisor learns how late reports
reach it; their type names are `esiwrap.trainer.wire`):

    {"type": "hello", "pid": P, "rank": 0, "world_size": 1, "saves": true, "signal": true,
     "stop_signal": "SIGINT", "integration": "plain", "version": "..."}
    {"type": "step", "pid": P, "step": N, "duration_s": 1.23}
    {"type": "checkpoint", "pid": P, "bytes": 1.4e11}   (a checkpoint's size, once known or changed)
    {"type": "save_begin", "pid": P, "step": N}
    {"type": "save_snapshot", "pid": P, "step": N, "duration_s": 0.4}   (asynchronous saves)
    {"type": "save_end", "pid": P, "step": N, "ok": true, "path": "...", "duration_s": 4.5,
     "error": "..."}
    {"type": "start", "pid": P, "step": N, "resume_mode": "auto", "default_local_dir": "..."}
    {"type": "deadline", "pid": P, "source": "node:1a2b3c4d/env:MLP", "at": 1764470111.0,
     "raw": "...", "lead_s": 0, "detail": {"node_id": "...", "address": "..."}, "reason": "",
     "expected": false, "withdrawn": false, "capacity": "spot", "early_warning": ""}

`hello.signal` false means "do not signal me" (a process reached through a relay, such as
verl's TaskRunner behind its driver); `hello.saves` false means "I take no part in saves" (ranks
of a rank-0-only checkpoint). `save_begin`/`save_end` carry `"peer": true` when another node's
esiwrap asked for the save (multi-node torchrun). A `deadline` is another node's deadline answer,
relayed by a Ray driver (`esiwrap.integrations.ray_nodes`). A `start` says where training starts:
the step the trainer's state is at (the checkpoint it loaded, 0 from scratch), sent by the verl hook
once verl has loaded; without it, esiwrap takes the first step report's step minus one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from esiwrap.envvars import SIGNAL_ENV, SOCKET_ENV
from esiwrap.trainer import wire as messages

__all__ = ["SIGNAL_ENV", "SOCKET_ENV", "ChannelClient", "ChannelServer", "Message", "decode"]
MAX_DATAGRAM = 64 * 1024
MAX_PID = 2**22  # the kernel's PID_MAX_LIMIT: larger is no process
MESSAGE_TYPES = messages.ALL


@dataclass(frozen=True)
class Message:
    type: str
    pid: int
    fields: dict[str, Any] = field(default_factory=dict)

    def get_int(self, key: str, default: int = 0) -> int:
        value = self.fields.get(key, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def get_float(self, key: str, default: float = 0.0) -> float:
        """A finite number (JSON's NaN and Infinity would poison every estimate), else `default`."""
        value = self.fields.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return default
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            return default
        return number if math.isfinite(number) else default

    def get_str(self, key: str, default: str = "") -> str:
        value = self.fields.get(key, default)
        return value if isinstance(value, str) else default

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.fields.get(key, default)
        return value if isinstance(value, bool) else default


def decode(data: bytes) -> Message | None:
    """A message, or None for anything that is not one of ours (never raises).

    Whose process the `pid` is, is not decided here: the supervisor signals only pids of its own
    tree that said hello.
    """
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: `[[[[...` 64 KiB deep
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str) or obj["type"] not in MESSAGE_TYPES:
        return None  # (a list as "type" is not even hashable)
    pid = obj.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= MAX_PID:
        return None
    return Message(type=obj["type"], pid=pid, fields=obj)


def private_directory() -> str:
    """A new directory only our user can enter, under $TMPDIR (else /tmp, /var/tmp): what
    tempfile.mkdtemp does, without importing tempfile (it brings shutil and random along)."""
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
    """The supervisor's end: a bound datagram socket in a private directory."""

    def __init__(self) -> None:
        self._dir = private_directory()  # mode 0700: only our user can send
        self.path = os.path.join(self._dir, "channel.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self) -> list[Message]:
        """Every message waiting now; malformed datagrams are dropped."""
        messages: list[Message] = []
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return messages
            message = decode(data)
            if message is not None:
                messages.append(message)

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)


# A full receiver (esiwrap's loop held up: a Unix datagram socket queues only
# net.unix.max_dgram_qlen, 10 by default) refuses a datagram at once. These are kept and sent again
# before anything else, at the next send or `flush`: a lost save_end is a checkpoint esiwrap never
# hears of (exit 76 with the checkpoint on disk). A step report is not kept: the next one says more.
KEPT_WHEN_REFUSED = frozenset({
    messages.HELLO, messages.SAVE_BEGIN, messages.SAVE_SNAPSHOT, messages.SAVE_END, messages.BYE,
    messages.CHECKPOINT, messages.START, messages.DEADLINE,
})
MAX_KEPT = 256  # bounded: a receiver gone for good costs a trainer no more than this
RESEND_EVERY_S = 0.05  # kept messages are tried again this often, without waiting for a next send


class ChannelClient:
    """The trainer's end. `send` never blocks and never raises: training comes first. A message
    that matters and is refused (the receiver's queue is full) is kept and sent again, in order,
    before the next one, and every RESEND_EVERY_S by a timer thread meanwhile: a save_end must not
    wait for the next step report, which can be a long step away."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._kept: deque[bytes] = deque()  # refused, to be sent again (oldest first)
        self._lock = threading.Lock()  # the caller's thread and the resend timer share the socket
        self._resend: threading.Timer | None = None

    @classmethod
    def from_env(cls) -> ChannelClient:
        return cls(os.environ.get(SOCKET_ENV) or None)

    def send(self, message_type: str, **fields: Any) -> bool:
        if self.path is None:
            return False
        # sent_mono: this machine's monotonic clock, so the receiver knows how late a report came
        # (a relay stamps what it forwards anew: only its own hop is measured)
        payload = {"type": message_type, "pid": os.getpid(), **fields,
                   "sent_mono": round(time.monotonic(), 6)}
        try:
            data = json.dumps(payload).encode("utf-8")
        except (TypeError, ValueError):
            return False
        with self._lock:
            if not self._flush():  # what was refused goes first; this one waits behind it
                return self._keep(message_type, data)
            try:
                self._datagram(data)
            except (BlockingIOError, InterruptedError):
                return self._keep(message_type, data)
            except OSError:
                return False
            return True

    def flush(self) -> bool:
        """Send again what the receiver refused, oldest first; True when nothing is left."""
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        while self._kept:
            try:
                self._datagram(self._kept[0])
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:  # no receiver any more: nobody will read them
                self._kept.clear()
                return True
            self._kept.popleft()
        return True

    def _resend_kept(self) -> None:
        """The timer: try the kept messages again; again later while some are left."""
        with self._lock:
            self._resend = None
            if not self._flush():
                self._schedule_resend()

    def _schedule_resend(self) -> None:
        if self._resend is None and self._kept:
            self._resend = threading.Timer(RESEND_EVERY_S, self._resend_kept)
            self._resend.daemon = True
            self._resend.start()

    @property
    def pending(self) -> int:
        """Messages refused and kept to be sent again. Read under the lock: a message the resend
        timer is sending (the receiver may have it already) counts until it is off the queue."""
        with self._lock:
            return len(self._kept)

    def _keep(self, message_type: str, data: bytes) -> bool:
        if message_type in KEPT_WHEN_REFUSED and len(self._kept) < MAX_KEPT:
            self._kept.append(data)
            self._schedule_resend()
        return False

    def _datagram(self, data: bytes) -> None:
        assert self.path is not None
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        self._sock.sendto(data, self.path)

    def close(self) -> None:
        with self._lock:
            if self._resend is not None:
                self._resend.cancel()
                self._resend = None
            if self._sock is not None:
                self._sock.close()
                self._sock = None
