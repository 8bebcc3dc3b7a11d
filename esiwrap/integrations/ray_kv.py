"""What the verl hook's processes share with the Ray driver's relay, and nothing more: the
save-signal flag (a handler that only counts) and the relay keys in Ray's internal KV. The TaskRunner
and the workers import this, never the driver's side (`esiwrap.integrations.ray_relay`)."""

from __future__ import annotations

import os
import signal
import sys
import threading

from esiwrap.envvars import RELAY_ENV
from esiwrap.signals import save_signal

TYPE_CHECKING = False  # workers import this at start-up: the typing module only for mypy
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

    from esiwrap.trainer import wire

__all__ = ["NAMESPACE", "KvRelay", "install_signal_flag", "signal_flag"]

NAMESPACE = "esiwrap"


# ---------------------------------------------------------------------- the save-signal flag
class _SignalFlag:
    """Counts save signals; the handler only increments and, in the driver, wakes the relay, then
    calls the handler it replaced (`esiwrap.trainer.install()`'s in a driver that trains itself)."""

    def __init__(self) -> None:
        self.count = 0
        self.signum: int | None = None
        self.wake_fd: int | None = None
        self.previous: Any = None

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.wake_fd is not None:
            try:  # noqa: SIM105 - contextlib is not worth its import here
                os.write(self.wake_fd, b"!")
            except OSError:
                pass
        if callable(self.previous):
            self.previous(signum, frame)


signal_flag = _SignalFlag()


def install_signal_flag(*, replace: bool = False) -> bool:
    """Count the save signal in this process instead of dying of it (main thread only).

    Without `replace`, a handler the program installed itself is left alone; with it, that handler
    is chained (called after the count), so a driver's own `esiwrap.trainer.install()` still sees
    every save signal."""
    signum = save_signal()
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signum)
    if current == signal_flag.handler:
        return True
    if not replace and current not in (signal.SIG_DFL, None):
        return False
    signal_flag.previous = current if callable(current) else None
    signal.signal(signum, signal_flag.handler)
    signal_flag.signum = signum
    return True


class KvRelay:
    """The TaskRunner's (and the driver's) view of the relay keys in Ray's internal KV."""

    def __init__(self, relay_id: str, kv: Any) -> None:
        self._kv = kv
        self._prefix = f"{relay_id}/"
        self._sent = 0

    @classmethod
    def connect(cls, relay_id: str) -> KvRelay | None:
        """None until this process is connected to Ray."""
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return None
        from ray.experimental import internal_kv

        return cls(relay_id, internal_kv)

    @classmethod
    def from_env(cls) -> KvRelay | None:
        relay_id = os.environ.get(RELAY_ENV)
        return cls.connect(relay_id) if relay_id else None

    # down: save requests
    def publish_request(self, count: int) -> None:
        self._kv._internal_kv_put(self._prefix + "request", str(count), overwrite=True, namespace=NAMESPACE)

    def request_count(self) -> int:
        """esiwrap's requests relayed by the driver, plus save signals sent to this process by
        hand (`kill -USR1` on the TaskRunner, as on a plain trainer): both counters only grow."""
        raw = self._kv._internal_kv_get(self._prefix + "request", namespace=NAMESPACE)
        try:
            relayed = int(raw) if raw else 0
        except ValueError:
            relayed = 0
        return relayed + signal_flag.count

    # up: the loop's events, written as the channel's datagrams (`esiwrap.trainer.wire`)
    def send(self, message: wire.Message) -> bool:
        """Like `ChannelClient.send`: never raises into the training loop."""
        import time

        from esiwrap.trainer import wire

        self._sent += 1
        key = f"{self._prefix}msg/{time.time_ns():020d}-{os.getpid()}-{self._sent:08d}"
        try:
            self._kv._internal_kv_put(key, wire.encode(message, os.getpid()), overwrite=True,
                                      namespace=NAMESPACE)
        except Exception:
            return False
        return True

    def take_messages(self) -> list[wire.Envelope]:
        """The loop's messages, oldest first; what does not decode is dropped."""
        from esiwrap.trainer import wire

        keys = self._kv._internal_kv_list(self._prefix + "msg/", namespace=NAMESPACE)
        messages = []
        for key in sorted(keys):
            raw = self._kv._internal_kv_get(key, namespace=NAMESPACE)
            self._kv._internal_kv_del(key, namespace=NAMESPACE)
            decoded = wire.decode(raw if isinstance(raw, bytes) else str(raw).encode("utf-8"))
            if isinstance(decoded, wire.Envelope):
                messages.append(decoded)
        return messages
