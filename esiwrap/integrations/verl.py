"""verl with no code change: both PPO loops save at the step boundary after esiwrap asks.

Loaded by post-import hooks (`esiwrap.integrations.verl_hooks`) in esiwrap's processes, it
touches verl only when a trainer module is imported, and only these names:

* legacy loop (`RayPPOTrainer.fit`, and the experimental trainers built on it): the name
  `should_save_ckpt_esi` bound in each trainer module is replaced by "a save was requested".
  The call, once per step, is also the step boundary reported to esiwrap. verl saves only when
  `trainer.save_freq > 0` (default -1); with a smaller value the hook saves itself through the
  trainer's own `_save_checkpoint` and tells verl not to.
* V1 loop (`PPOTrainer`, the default): at the end of each step (`on_step_end`, where verl's own
  periodic save sits), a requested save runs through verl's `_save_checkpoint` when verl has not
  just saved this step itself.
* `_load_checkpoint` of both is wrapped, so esiwrap learns where training starts: a `start`
  message with the global step after loading (0 from scratch), `resume_mode` and
  `default_local_dir`, sent once the loop is attached (V1 loads before `fit`: sent at `fit`).
* `_save_checkpoint` of both is wrapped to report `save_begin`/`save_end` (step, path, duration).
  `save_end` is sent only once `latest_checkpointed_iteration.txt` names the step; with
  `async_save` the save is finalized first when esiwrap asked for it, else reported when the
  tracker shows it at a later boundary. A save verl returned from answers the requests made
  before it began, acknowledged or not yet: the next boundary does not save again.

Requests reach the loop through one interface (`Transport`): the relay's counter in Ray's KV,
or, without the relay, the save signals this process receives itself.

verl's own `MLP_…`/`SAGEMAKER_…` expiry check is not called while the hook is active: esiwrap
decides, so there is one save, once.
"""

from __future__ import annotations

import os
import sys
import time

from esiwrap.envvars import SOCKET_ENV
from esiwrap.integrations.verl_modules import VERL_LEGACY_MODULES, VERL_V1_MODULE
from esiwrap.trainer import wire

TYPE_CHECKING = False  # loaded at every Ray worker's start-up: the typing module only for mypy
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

__all__ = ["loop", "patch_module"]

TRACKER = "latest_checkpointed_iteration.txt"
PATCHED = "__esiwrap_patched__"


def patch_module(module: ModuleType) -> None:
    """Called by the post-import hook (`esiwrap.integrations.verl_hooks`)."""
    if module.__name__ == VERL_V1_MODULE:
        patch_v1_module(module)
    elif module.__name__ in VERL_LEGACY_MODULES:
        patch_legacy_module(module)


# ---------------------------------------------------------------------- the loop's state
if TYPE_CHECKING:
    from typing import Protocol

    class Transport(Protocol):
        """How the loop talks to esiwrap, relayed or not: events up, save requests down."""

        def send(self, message: wire.Message) -> bool:
            """Like `ChannelClient.send`: never blocks long, never raises."""

        def request_count(self) -> int:
            """Save requests made so far: a counter that only grows (relay: Ray's KV; direct:
            the save signals this process received)."""


class _PendingSave:
    """A save verl returned from whose tracker file does not name its step yet (async_save)."""

    def __init__(self, trainer: Any, step: int, path: str, started: float) -> None:
        self.trainer, self.step, self.path, self.started = trainer, step, path, started


class _Loop:
    """What this process knows about the verl loop running in it (one per process)."""

    def __init__(self) -> None:
        self.transport: Transport | None = None
        self.kind = ""
        self.requests_handled = 0  # requests answered by a save that verl returned from
        self.last_boundary: float | None = None
        self.last_saved_step: int | None = None
        self.depth = 0  # nested _save_checkpoint calls (a subclass calling super)
        self.pending: list[_PendingSave] = []  # async saves not yet final: acknowledged later
        self.start_sent = False

    # -- attaching
    def attach(self, kind: str, trainer: object) -> bool:
        if self.transport is not None:
            return True
        from esiwrap.integrations import ray_kv

        transport: Transport | None = ray_kv.KvRelay.from_env()
        relayed = transport is not None
        if not relayed and os.environ.get(SOCKET_ENV):
            # No driver relay (Ray skipped our runtime-env hook): talk to esiwrap directly and
            # be signalled directly, which works where this process descends from esiwrap.
            transport = _DirectChannel()
        if transport is None:
            return False
        if not ray_kv.install_signal_flag() and not relayed:
            return False  # signalled directly but cannot count the signal: leave verl as it is
        self.transport = transport
        self.kind = kind
        verl = sys.modules.get("verl")
        facts = _checkpoint_facts(trainer)
        transport.send(wire.Hello(
            rank=0, world_size=1, saves=True, signal=not relayed, integration="verl",
            checkpoint_bytes=_size_or_none(facts.pop("checkpoint_bytes", None)),
            checkpoint_dir=facts.pop("checkpoint_dir", None),
            resumed_from=facts.pop("resumed_from", None),
            extra={"verl_version": getattr(verl, "__version__", "unknown"), "loop": kind,
                   "trainer": type(trainer).__qualname__ if trainer is not None else "", "node": _node_ip(),
                   **facts},
        ))
        return True

    def started(self, trainer: Any) -> None:
        """Tell esiwrap where training starts: verl's global step after loading (0 from scratch)."""
        if self.transport is None or self.start_sent or trainer is None:
            return
        self.start_sent = True
        config = getattr(getattr(trainer, "config", None), "trainer", None)
        fields = {key: _config_text(config, key) for key in ("resume_mode", "default_local_dir",
                                                              "resume_from_path")}
        self.transport.send(wire.Start(step=int(getattr(trainer, "global_steps", 0) or 0),
                                       extra={"integration": "verl", **fields}))

    # -- requests
    def _request_count(self) -> int:
        try:
            return int(self.transport.request_count()) if self.transport is not None else 0
        except Exception:
            return self.requests_handled  # the KV unreadable for a moment: no new request

    def save_requested(self) -> bool:
        return self.transport is not None and self._request_count() > self.requests_handled

    # -- events
    def boundary(self, step: int) -> None:
        assert self.transport is not None
        now = time.monotonic()
        if self.last_boundary is not None:
            self.transport.send(wire.Step(step=int(step), duration_s=round(now - self.last_boundary, 6)))
        self.last_boundary = now
        self._finish_pending()

    def saved(self, trainer: Any, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run verl's `_save_checkpoint` and report it; the outermost call only."""
        transport = self.transport
        if self.depth or transport is None:
            return original(trainer, *args, **kwargs)
        step = _checkpoint_step(trainer)
        root = str(trainer.config.trainer.default_local_dir)
        path = os.path.join(root, f"global_step_{step}")
        requests = self._request_count()
        transport.send(wire.SaveBegin(step=step))
        started = time.monotonic()
        self.depth += 1
        try:
            result = original(trainer, *args, **kwargs)
        except BaseException as exc:
            transport.send(wire.SaveEnd(step=step, ok=False, path=path, error=repr(exc)[:500],
                                        duration_s=round(time.monotonic() - started, 6)))
            raise  # the request stays: the next boundary tries again
        finally:
            self.depth -= 1
        self.last_saved_step = step
        requested = requests > self.requests_handled
        # The save verl returned from answers every request made before it began, finalized or
        # not: saving again at the next boundary would only repeat it.
        self.requests_handled = max(self.requests_handled, requests)
        if requested and not _tracker_holds(root, step):
            _finalize_async_save(trainer)
        self.pending.append(_PendingSave(trainer, step, path, started))
        self._finish_pending()
        return result

    def _finish_pending(self) -> None:
        """Acknowledge the saves whose tracker file now names their step (complete on disk)."""
        assert self.transport is not None
        still = []
        for save in self.pending:
            if _tracker_holds(str(save.trainer.config.trainer.default_local_dir), save.step):
                self.transport.send(wire.SaveEnd(step=save.step, ok=True, path=save.path,
                                                 duration_s=round(time.monotonic() - save.started, 6)))
            else:
                still.append(save)
        self.pending = still


loop = _Loop()


class _DirectChannel:
    """esiwrap's socket without the relay: requests are the save signals this process receives."""

    def __init__(self) -> None:
        from esiwrap.trainer.channel import ChannelClient

        self._client = ChannelClient.from_env()

    def send(self, message: wire.Message) -> bool:
        return self._client.send(message)

    def request_count(self) -> int:
        from esiwrap.integrations.ray_kv import signal_flag

        return signal_flag.count


def _checkpoint_step(trainer: Any) -> int:
    """The step verl names the checkpoint after (the fully-async trainer counts versions)."""
    if "current_param_version" in vars(trainer) and hasattr(type(trainer), "_fit_save_checkpoint"):
        return int(trainer.current_param_version)
    return int(getattr(trainer, "global_steps", 0))


def _checkpoint_facts(trainer: Any) -> dict[str, Any]:
    """What esiwrap can know of a checkpoint before the first save, from the run's config: its
    size (estimated), where it goes, and the checkpoint verl resumes from (the tracker's)."""
    config = getattr(trainer, "config", None)
    if config is None:
        return {}
    from esiwrap.integrations.verl_checkpoint import estimate_checkpoint_bytes

    facts: dict[str, Any] = {}
    try:
        nbytes, how = estimate_checkpoint_bytes(config)
        root = str(config.trainer.default_local_dir)
    except Exception as exc:  # a config shape we do not know: no estimate, never a failed run
        return {"checkpoint_estimate": f"no estimate: {type(exc).__name__}"}
    facts["checkpoint_estimate"] = how
    if nbytes:
        facts["checkpoint_bytes"] = nbytes
    facts["checkpoint_dir"] = os.path.abspath(os.path.expanduser(root))
    latest = _tracker_step(root)
    if latest is not None and os.path.isdir(os.path.join(root, f"global_step_{latest}")):
        facts["resumed_from"] = os.path.abspath(os.path.join(root, f"global_step_{latest}"))
    return facts


def _size_or_none(value: Any) -> float | None:
    """A checkpoint size the hello can carry (a finite number > 0), else None: a bad estimate must
    not cost the hello (the whole message would be refused)."""
    import math

    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def _tracker_step(root: str) -> int | None:
    try:
        with open(os.path.join(root, TRACKER)) as tracker:
            return int(tracker.read().strip())
    except (OSError, ValueError):
        return None


def _tracker_holds(root: str, step: int) -> bool:
    """verl's resume point names `step` (or later): the checkpoint is complete on disk."""
    try:
        with open(os.path.join(root, TRACKER)) as tracker:
            return int(tracker.read().strip()) >= step
    except (OSError, ValueError):
        return False


def _finalize_async_save(trainer: Any) -> None:
    """Wait for an async save esiwrap asked for: the instance may be gone soon after."""
    finalize = getattr(getattr(trainer, "actor_rollout_wg", None), "async_calls_finalize_fn_exec", None)
    if callable(finalize):
        finalize(blocking=True)


def _config_text(config: Any, key: str) -> str | None:
    try:
        value = config.get(key) if config is not None else None
    except Exception:
        return None
    return None if value is None else str(value)


def _save_freq(trainer: Any) -> int:
    try:
        return int(trainer.config.trainer.save_freq)
    except (AttributeError, TypeError, ValueError):
        return 0


def _node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception:
        return ""


# ---------------------------------------------------------------------- legacy loop
def patch_legacy_module(module: ModuleType) -> None:
    """Replace `should_save_ckpt_esi` as bound in this trainer module; wrap its trainers' saves."""
    original = getattr(module, "should_save_ckpt_esi", None)
    if callable(original) and not getattr(original, PATCHED, False):
        setattr(module, "should_save_ckpt_esi", _legacy_decision(original))  # noqa: B010
    for value in list(vars(module).values()):
        if isinstance(value, type) and value.__module__ == module.__name__:
            _wrap_save_checkpoint(value)
            _wrap_load_checkpoint(value)
            if value.__name__ == "RayPPOTrainer":
                _wrap_attach_on_fit(value, "legacy")


def _legacy_decision(original: Any) -> Any:
    import functools

    @functools.wraps(original)
    def should_save_ckpt_esi(
        max_steps_duration: float = 0, save_ckpt_duration: float = 60, redundant_time: float = 0
    ) -> bool:
        # The caller is the trainer's method (fit, _fit_save_checkpoint): its `self` is the trainer.
        trainer = sys._getframe(1).f_locals.get("self")
        if not loop.attach("legacy", trainer):
            return bool(original(max_steps_duration, save_ckpt_duration, redundant_time))
        loop.boundary(_checkpoint_step(trainer) if trainer is not None else 0)
        if not loop.save_requested():
            return False
        if trainer is not None and hasattr(trainer, "_save_checkpoint") and _save_freq(trainer) <= 0:
            trainer._save_checkpoint()  # verl would not save with save_freq <= 0
            return False
        return True

    setattr(should_save_ckpt_esi, PATCHED, True)
    return should_save_ckpt_esi


def _wrap_save_checkpoint(cls: type) -> None:
    original = cls.__dict__.get("_save_checkpoint")
    if original is None or getattr(original, PATCHED, False):
        return
    import functools

    @functools.wraps(original)
    def _save_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        return loop.saved(self, original, args, kwargs)

    setattr(_save_checkpoint, PATCHED, True)
    setattr(cls, "_save_checkpoint", _save_checkpoint)  # noqa: B010


def _wrap_load_checkpoint(cls: type) -> None:
    """After verl loads (or finds nothing to load), tell esiwrap the step training starts from."""
    original = cls.__dict__.get("_load_checkpoint")
    if original is None or getattr(original, PATCHED, False):
        return
    import functools

    @functools.wraps(original)
    def _load_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        loop.started(self)  # a no-op until the loop is attached (V1: `fit` sends it)
        return result

    setattr(_load_checkpoint, PATCHED, True)
    setattr(cls, "_load_checkpoint", _load_checkpoint)  # noqa: B010


def _wrap_attach_on_fit(cls: type, kind: str) -> None:
    """Attach when `fit` starts, so the first step's length is known too."""
    original = cls.__dict__.get("fit")
    if original is None or getattr(original, PATCHED, False):
        return
    import functools

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if loop.attach(kind, self) and loop.last_boundary is None:
            loop.last_boundary = time.monotonic()
        return original(self, *args, **kwargs)

    setattr(fit, PATCHED, True)
    setattr(cls, "fit", fit)  # noqa: B010


# ---------------------------------------------------------------------- V1 loop
def patch_v1_module(module: ModuleType) -> None:
    """Wrap `PPOTrainer`: attach at `fit`, save-if-requested and boundary at `on_step_end`."""
    cls = getattr(module, "PPOTrainer", None)
    if not isinstance(cls, type):
        return
    _wrap_save_checkpoint(cls)
    _wrap_load_checkpoint(cls)
    original_fit = cls.__dict__.get("fit")
    if original_fit is None or getattr(original_fit, PATCHED, False):
        return
    import functools

    @functools.wraps(original_fit)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not loop.attach("v1", self):
            return original_fit(self, *args, **kwargs)
        if loop.last_boundary is None:
            loop.last_boundary = time.monotonic()
        loop.started(self)  # V1 loaded its checkpoint in init_workers, before fit
        # An instance attribute shadows the subclass's on_step_end for this fit only.
        self.on_step_end = _v1_step_end(self, self.on_step_end)
        try:
            return original_fit(self, *args, **kwargs)
        finally:
            vars(self).pop("on_step_end", None)

    setattr(fit, PATCHED, True)
    setattr(cls, "fit", fit)  # noqa: B010


def _v1_step_end(trainer: Any, on_step_end: Any) -> Any:
    def on_step_end_then_boundary(*args: Any, **kwargs: Any) -> Any:
        if loop.save_requested() and loop.last_saved_step != trainer.global_steps:
            trainer._save_checkpoint()  # where verl's periodic save sits, whatever save_freq says
        result = on_step_end(*args, **kwargs)
        loop.boundary(trainer.global_steps)
        return result

    return on_step_end_then_boundary
