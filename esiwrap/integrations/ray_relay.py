"""Ray plumbing for the verl hook: esiwrap talks to the driver, the driver relays to the TaskRunner.

esiwrap launches the Ray *driver*; verl's loop runs in a TaskRunner actor, maybe on another node.
So the driver is the one process esiwrap signals and hears from:

* `runtime_env_hook` runs inside the driver's `ray.init` (named by `RAY_RUNTIME_ENV_HOOK`). It
  turns the driver into the relay (a save-signal handler, a hello with `stop_signal: SIGINT`, a
  relay thread) and adds to the job's runtime env: our package (`py_modules`, so nodes without
  esiwrap get it), `worker_process_setup_hook` (chained with the user's) and `ESIWRAP_RELAY`.
* Save requests go down through Ray's internal KV: the driver bumps a counter, the TaskRunner
  reads it at each step boundary (one KV get, well under a millisecond).
* The TaskRunner's events go up the same way: it puts them under a key prefix, the driver's
  thread forwards them to esiwrap's socket as its own messages (under its own pid: esiwrap hears
  the driver, the one process of the job in its tree). A relayed `hello` re-announces the driver
  as the process that saves (the loop's `saves`: false, with `cannot_save`, for a loop the hook
  cannot save), carrying the loop's details. Every hello of the driver says `relay: true`.
* At its end the driver ignores the save signal, then says `bye` (as `esiwrap.trainer.install()`'s
  processes do): a save signal during its interpreter's shutdown would kill a finished run.
* `worker_setup` runs in every worker of the job: a save-signal handler (a stray signal must
  never kill a Ray worker) and the verl post-import hooks.
* Once connected, the driver also watches every other node's deadline (`ray_nodes`) and sends
  their answers to esiwrap as `deadline` messages.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from esiwrap.envvars import CHAINED_RAY_ENV_HOOK, CHAINED_SETUP_HOOK_ENV, RELAY_ENV, SIGNAL_ENV
from esiwrap.integrations.ray_kv import KvRelay, install_signal_flag, signal_flag
from esiwrap.paths import package_dir
from esiwrap.trainer import wire

TYPE_CHECKING = False  # workers import this at start-up: the typing module only for mypy
if TYPE_CHECKING:
    from typing import Any

    from esiwrap.trainer.channel import ChannelClient

__all__ = [
    "KvRelay",
    "install_signal_flag",
    "prepare_worker",
    "runtime_env_hook",
    "signal_flag",
    "worker_setup",
]

SETUP_HOOK = "esiwrap.integrations.ray_relay.worker_setup"
RELAY_POLL_S = 0.2  # how often the driver looks for the TaskRunner's events


# ---------------------------------------------------------------------- the driver
def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """`RAY_RUNTIME_ENV_HOOK`: called by `ray.init` in the driver, before it connects."""
    chained = os.environ.get(CHAINED_RAY_ENV_HOOK)
    if chained:
        from ray._common.utils import load_class

        runtime_env = load_class(chained)(runtime_env)  # type: ignore[no-untyped-call]
    env: dict[str, Any] = dict(runtime_env or {})
    relay_id = _driver().start()
    env_vars = dict(env.get("env_vars") or {})
    env_vars[RELAY_ENV] = relay_id
    env_vars[SIGNAL_ENV] = os.environ.get(SIGNAL_ENV, "SIGUSR1")
    user_hook = env.get("worker_process_setup_hook")
    if isinstance(user_hook, str) and user_hook != SETUP_HOOK:
        env_vars[CHAINED_SETUP_HOOK_ENV] = user_hook
        env["worker_process_setup_hook"] = SETUP_HOOK
    elif callable(user_hook):
        env["worker_process_setup_hook"] = _chain_callable(user_hook)
    else:
        env["worker_process_setup_hook"] = SETUP_HOOK
    env["env_vars"] = env_vars
    package = package_dir()
    modules = list(env.get("py_modules") or [])
    if package not in modules:
        modules.append(package)
    env["py_modules"] = modules
    return env


def _chain_callable(user_hook: Any) -> Any:
    def esiwrap_then_user_setup_hook() -> None:
        worker_setup()
        user_hook()

    return esiwrap_then_user_setup_hook


class _Driver:
    """The relay between esiwrap's socket and the TaskRunner, living in the Ray driver."""

    def __init__(self) -> None:
        from esiwrap.trainer.channel import ChannelClient

        self.relay_id = ""
        self.client: ChannelClient = ChannelClient.from_env()
        self.base_hello = wire.Hello()
        self.requests_sent = 0
        self._thread: threading.Thread | None = None
        self._wake_r = -1
        self._relaying = threading.Lock()  # held while forwarding; taken for good at the driver's end

    def start(self) -> str:
        if self._thread is not None:
            return self.relay_id
        import uuid

        self.relay_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        handled = install_signal_flag(replace=True)
        if handled:
            self._take_wakeup_fd(wake_w)
        import ray

        self.base_hello = wire.Hello(
            rank=0, world_size=1, saves=False, signal=handled, integration="verl", relay=True,
            # a clean Ray shutdown; SIGTERM makes Ray abort
            stop_signal="SIGINT" if _sigint_reaches_python() else None,
            extra={"role": "ray-driver", "ray_version": ray.__version__},
        )
        self.client.send(self.base_hello)
        if handled and signal_flag.signum is not None:  # at its end: ignore the signal, then bye
            import atexit

            from esiwrap.trainer import say_bye_at_exit

            say_bye_at_exit(self.client, signal_flag.signum)
            atexit.register(self._relaying.acquire)  # registered later, runs first: nothing after the bye
        self._thread = threading.Thread(target=self._run, name="esiwrap-relay", daemon=True)
        self._thread.start()
        return self.relay_id

    def _take_wakeup_fd(self, wake_w: int) -> None:
        """Learn of the signal at delivery: the Python handler runs only when the main thread,
        blocked in `ray.get`, next checks for signals (about once a second)."""
        previous = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        if previous != -1:  # the program's own: give it back, our handler writes to the pipe
            signal.set_wakeup_fd(previous)
            signal_flag.wake_fd = wake_w

    def _run(self) -> None:
        import contextlib
        import select

        kv: KvRelay | None = None
        last_error = ""
        early = 0  # save signals seen on the wakeup fd, before the Python handler counted them
        while True:
            readable, _, _ = select.select([self._wake_r], [], [], RELAY_POLL_S)
            if readable:
                with contextlib.suppress(OSError):
                    early += os.read(self._wake_r, 512).count(bytes([signal_flag.signum or 0]))
            if kv is None:
                kv = KvRelay.connect(self.relay_id)
                if kv is None:
                    continue  # ray.init has not finished yet
                self._watch_the_other_nodes()
            try:
                requested = max(signal_flag.count, early)  # both see every signal, one sooner
                if requested > self.requests_sent:
                    self.requests_sent = requested
                    kv.publish_request(self.requests_sent)
                for message in kv.take_messages():
                    if not self._relaying.acquire(blocking=False):
                        return  # the driver is ending (it says bye): the loop's news is not its any more
                    try:
                        self._forward(message)
                    finally:
                        self._relaying.release()
            except Exception as exc:  # Ray shutting down: the driver is exiting anyway
                if _ray_gone():
                    return
                if repr(exc) != last_error:  # once per kind of trouble, not five times a second
                    last_error = repr(exc)
                    print(f"esiwrap: relay: {last_error}", file=sys.stderr)

    def _watch_the_other_nodes(self) -> None:
        """Their deadlines reach esiwrap as `deadline` messages (`ray_nodes`), on a client of
        their own: the relay thread sends on this one."""
        from esiwrap.integrations.ray_nodes import ClusterWatch
        from esiwrap.trainer.channel import ChannelClient

        client = ChannelClient.from_env()
        ClusterWatch(lambda fields: client.send(wire.Deadline(**fields))).start()

    def _forward(self, envelope: wire.Envelope) -> None:
        """A message of the loop, sent to esiwrap as the driver's own."""
        message = envelope.message
        if isinstance(message, wire.Hello):
            # what the loop says of itself; how to signal and stop the job is the driver's to say
            base = self.base_hello
            extra = {**message.extra, **base.extra, "role": "ray-driver, relaying the verl loop",
                     "relayed_from": {"pid": envelope.pid, "node": message.extra.get("node")}}
            self.client.send(message._replace(rank=base.rank, world_size=base.world_size,
                                              signal=base.signal, stop_signal=base.stop_signal,
                                              integration=base.integration, relay=True, extra=extra))
        else:
            self.client.send(message)


def _sigint_reaches_python() -> bool:
    """False when SIGINT would be lost on this driver: ignored (a background job of a shell) or
    blocked by whoever started it. esiwrap then stops it with its --stop-signal."""
    return signal.getsignal(signal.SIGINT) != signal.SIG_IGN and \
        signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ())


_driver_singleton: _Driver | None = None


def _driver() -> _Driver:
    global _driver_singleton
    if _driver_singleton is None:
        _driver_singleton = _Driver()
    return _driver_singleton


def _ray_gone() -> bool:
    ray = sys.modules.get("ray")
    return ray is None or not ray.is_initialized()


# ---------------------------------------------------------------------- the workers
def prepare_worker() -> None:
    """What every Ray worker of esiwrap's job needs; idempotent (bootstrap and setup hook)."""
    install_signal_flag()
    from esiwrap.integrations.verl_hooks import install_verl_hooks

    install_verl_hooks()


def worker_setup() -> None:
    """`worker_process_setup_hook` of the job: runs first in every Ray worker process."""
    prepare_worker()
    chained = os.environ.get(CHAINED_SETUP_HOOK_ENV)
    if chained:
        from ray._common.utils import load_class

        load_class(chained)()  # type: ignore[no-untyped-call]
