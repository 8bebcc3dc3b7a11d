"""verl with no code change: every PPO loop saves at the step boundary after esiwrap asks.

Loaded by post-import hooks (`esiwrap.integrations.verl_hooks`) in esiwrap's processes, it
touches verl only when a trainer module is imported, and only these names:

* A step boundary in every loop, one of three, whichever the loop's `fit` reaches (the first one
  it reaches claims the boundaries, so each step is reported once):
  * `should_save_ckpt_esi` (verl 0.5.0 on: `RayPPOTrainer.fit` and the experimental trainers built
    on it): the name bound in each trainer module is replaced by "a save was requested". verl
    saves only when `trainer.save_freq > 0` (default -1); with a smaller value the hook saves
    itself through the trainer's own `_save_checkpoint` and tells verl not to.
  * `compute_throughout_metrics` (`verl.trainer.ppo.metric_utils`, replaced where it is defined,
    before any trainer module binds it): every loop of every verl calls it once a step, from a
    trainer method, after the update and after verl's own periodic save. The boundary of a loop
    that calls no `should_save_ckpt_esi`: verl 0.4.1, 0.8.0's `main_ppo_sync`, the recipes' own
    `fit`s (DAPO, entropy, ...). A requested save runs through the trainer's `_save_checkpoint`
    there, unless verl just saved that step.
  * V1 loop (`PPOTrainer`, the default of 0.9): at the end of each step (`on_step_end`, where
    verl's own periodic save sits), a requested save runs through verl's `_save_checkpoint` when
    verl has not just saved this step itself.
* Which trainers: the classes of the hooked modules (`@ray.remote` ones unwrapped), and every later
  subclass of `RayPPOTrainer` wherever it is defined (`__init_subclass__`: recipes, and
  `@ray.remote` classes before Ray wraps them), get `_save_checkpoint`/`_load_checkpoint` wrapped
  and their `fit` looked at when it starts: a `fit` that reaches a boundary attaches the loop; one
  that saves (`_save_checkpoint`) but reaches no boundary says hello with `saves: false` and
  `cannot_save` (esiwrap warns once, and a missed save's reason says it); one that does neither (a
  rollouter) says nothing.
* `_load_checkpoint` is wrapped, so esiwrap learns where training starts: a `start` message with
  the global step after loading (0 from scratch), `resume_mode` and `default_local_dir`, sent once
  the loop is attached (a load before that is remembered and sent at attach).
* `_save_checkpoint` is wrapped to report `save_begin`/`save_end` (step, path, duration).
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
from esiwrap.integrations.verl_modules import VERL_LEGACY_MODULES, VERL_METRICS_MODULE, VERL_V1_MODULE
from esiwrap.trainer import wire

TYPE_CHECKING = False  # loaded at every Ray worker's start-up: the typing module only for mypy
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

__all__ = ["loop", "patch_module"]

TRACKER = "latest_checkpointed_iteration.txt"
PATCHED = "__esiwrap_patched__"
ESI = "should_save_ckpt_esi"  # verl's per-step ESI decision (0.5.0 on): a boundary
METRICS = "compute_throughout_metrics"  # called once a step by every PPO loop: a boundary
SAVE = "_save_checkpoint"
METRICS_TAKE_OVER = 2  # steps whose metrics came with no ESI call, before the metrics call reports


def patch_module(module: ModuleType) -> None:
    """Called by the post-import hook (`esiwrap.integrations.verl_hooks`)."""
    if module.__name__ == VERL_V1_MODULE:
        patch_v1_module(module)
    elif module.__name__ == VERL_METRICS_MODULE:
        patch_metrics_module(module)
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
        self.relayed = False
        self.requests_handled = 0  # requests answered by a save that verl returned from
        self.last_boundary: float | None = None
        self.last_saved_step: int | None = None
        self.depth = 0  # nested _save_checkpoint calls (a subclass calling super)
        self.pending: list[_PendingSave] = []  # async saves not yet final: acknowledged later
        self.start_sent = False
        self.boundary_source = ""  # the one call that reports the boundaries (one a step)
        self.metrics_alone = 0  # metrics calls since the last ESI call, while the ESI call owns them
        self.loaded: Any = None  # a trainer that loaded before the loop attached: `start` at attach
        self.cannot_save = False  # said hello with saves: false (a loop with no boundary)

    # -- attaching
    def attach(self, kind: str, trainer: object, cannot_save: str | None = None) -> bool:
        """Say hello for the loop (once); True when attached. `cannot_save`: the loop has no
        boundary, so the hello says it saves nothing, and why. A loop that said so and then reaches
        a boundary after all says hello again, saving."""
        if self.transport is not None:
            if self.cannot_save and cannot_save is None:
                self.cannot_save = False
                self.transport.send(self._hello(kind, trainer, None, self.relayed))
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
        if isinstance(transport, _DirectChannel) and ray_kv.signal_flag.signum is not None:
            from esiwrap.trainer import say_bye_at_exit  # esiwrap signals it itself: bye at its end

            say_bye_at_exit(transport.client, ray_kv.signal_flag.signum)
        self.transport, self.kind, self.relayed = transport, kind, relayed
        self.cannot_save = cannot_save is not None
        transport.send(self._hello(kind, trainer, cannot_save, relayed))
        if self.loaded is not None:  # it loaded before the loop attached: where training starts
            self.started(self.loaded)
        return True

    def _hello(self, kind: str, trainer: object, cannot_save: str | None, relayed: bool) -> wire.Hello:
        facts = _checkpoint_facts(trainer)
        return wire.Hello(
            rank=0, world_size=1, saves=cannot_save is None, signal=not relayed, integration="verl",
            checkpoint_bytes=_size_or_none(facts.pop("checkpoint_bytes", None)),
            checkpoint_dir=facts.pop("checkpoint_dir", None),
            resumed_from=facts.pop("resumed_from", None), cannot_save=cannot_save,
            extra={"verl_version": verl_version(), "loop": kind,
                   "trainer": type(trainer).__qualname__ if trainer is not None else "", "node": _node_ip(),
                   **({"boundary": self.boundary_source} if self.boundary_source else {}), **facts},
        )

    def owns_boundary(self, source: str) -> bool:
        """Whether this call reports the step boundary (and saves there): one call a step. The
        boundary `fit` names (read from its code when it starts) owns them; else the first one
        called. A call to `should_save_ckpt_esi` always takes them (a loop that reaches both calls
        it after the update, every step past the critic's warm-up), and `compute_throughout_metrics`
        takes them back when two steps came without one (a loop whose code names an ESI call that
        does not run: a guard, a config)."""
        if source == ESI:
            self.metrics_alone = 0
            if self.boundary_source in ("", METRICS):
                self.boundary_source = ESI
        elif source == METRICS:
            if not self.boundary_source:
                self.boundary_source = METRICS
            elif self.boundary_source == ESI:
                self.metrics_alone += 1
                if self.metrics_alone >= METRICS_TAKE_OVER:
                    self.boundary_source = METRICS
        return self.boundary_source == source

    def started(self, trainer: Any) -> None:
        """Tell esiwrap where training starts: verl's global step after loading (0 from scratch);
        before the loop is attached, remembered until it is."""
        if self.transport is None and trainer is not None:
            self.loaded = trainer
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

        self.client = ChannelClient.from_env()

    def send(self, message: wire.Message) -> bool:
        return self.client.send(message)

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
    """Replace `should_save_ckpt_esi` as bound in this trainer module; wrap its trainers."""
    original = getattr(module, ESI, None)
    if callable(original) and not getattr(original, PATCHED, False):
        setattr(module, ESI, _legacy_decision(original))
    _bind_metrics(module)
    for value in list(vars(module).values()):
        value = getattr(value, "__ray_actor_class__", value)  # @ray.remote: the class it wraps
        if isinstance(value, type) and value.__module__ == module.__name__:
            _wrap_trainer_class(value)
            if value.__name__ == "RayPPOTrainer":
                _hook_subclasses(value)


def _wrap_trainer_class(cls: type) -> None:
    _wrap_save_checkpoint(cls)
    _wrap_load_checkpoint(cls)
    _wrap_fit(cls)


def _hook_subclasses(base: type) -> None:
    """Every later subclass of `base` (RayPPOTrainer), wherever it is defined, gets the same
    wrappers at its `class` statement: verl's recipes (DAPO, PRIME, entropy, ...) without knowing
    their modules, and `@ray.remote` classes (FullyAsyncTrainer) before Ray wraps them."""
    original = base.__dict__.get("__init_subclass__")
    if getattr(getattr(original, "__func__", None), PATCHED, False):
        return

    parent: Any = base

    def __init_subclass__(cls: Any, /, **kwargs: Any) -> None:
        if original is not None:
            original.__func__(cls, **kwargs)
        else:
            super(parent, cls).__init_subclass__(**kwargs)
        _wrap_trainer_class(cls)

    setattr(__init_subclass__, PATCHED, True)
    setattr(base, "__init_subclass__", classmethod(__init_subclass__))  # noqa: B010


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
        if not loop.owns_boundary(ESI):
            return False  # another call reports this loop's boundaries and saves there
        loop.boundary(_checkpoint_step(trainer) if trainer is not None else 0)
        if not loop.save_requested():
            return False
        if trainer is not None and hasattr(trainer, SAVE) and _save_freq(trainer) <= 0:
            trainer._save_checkpoint()  # verl would not save with save_freq <= 0
            return False
        return True

    setattr(should_save_ckpt_esi, PATCHED, True)
    return should_save_ckpt_esi


def _wrap_save_checkpoint(cls: type) -> None:
    original = cls.__dict__.get(SAVE)
    if original is None or getattr(original, PATCHED, False):
        return
    import functools

    @functools.wraps(original)
    def _save_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        return loop.saved(self, original, args, kwargs)

    setattr(_save_checkpoint, PATCHED, True)
    setattr(cls, SAVE, _save_checkpoint)


def _wrap_load_checkpoint(cls: type) -> None:
    """After verl loads (or finds nothing to load), tell esiwrap the step training starts from."""
    original = cls.__dict__.get("_load_checkpoint")
    if original is None or getattr(original, PATCHED, False):
        return
    import functools

    @functools.wraps(original)
    def _load_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        loop.started(self)  # remembered until the loop is attached (V1: `fit` sends it)
        return result

    setattr(_load_checkpoint, PATCHED, True)
    setattr(cls, "_load_checkpoint", _load_checkpoint)  # noqa: B010


def _wrap_fit(cls: type) -> None:
    """Look at the loop when `fit` starts: attach where it reaches a boundary (the first step's
    length is known then too), say it cannot save where it saves but reaches none."""
    original = cls.__dict__.get("fit")
    if original is None or getattr(original, PATCHED, False) or not callable(getattr(cls, SAVE, None)):
        return
    import functools

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        _fit_starts(self)
        return original(self, *args, **kwargs)  # an `async def fit` returns its coroutine: as is

    setattr(fit, PATCHED, True)
    setattr(cls, "fit", fit)  # noqa: B010


def _fit_starts(trainer: Any) -> None:
    boundary, saves = fit_reaches(type(trainer))
    if boundary:
        if not loop.transport:
            loop.boundary_source = boundary  # the boundary this loop's steps are reported at
        if loop.attach("legacy", trainer) and loop.last_boundary is None:
            loop.last_boundary = time.monotonic()
    elif saves:
        loop.attach("legacy", trainer, cannot_save=cannot_save_reason(type(trainer)))


def cannot_save_reason(cls: type) -> str:
    return (f"verl {verl_version()}: {cls.__qualname__}.fit reaches no step boundary esiwrap can use "
            f"(neither {ESI} nor {METRICS}), so it cannot save when esiwrap asks. Set "
            "trainer.save_freq=N so that verl saves every N steps itself (esiwrap reports each save "
            "and stops the run after the latest one), or run a loop esiwrap covers: "
            "docs/running/verl.md#which-verl")


def fit_reaches(cls: type) -> tuple[str, bool]:
    """What the class's `fit` can reach through the trainer's own methods (`self.x(...)`, followed
    through every class of its MRO, nested functions and closures included): the boundary it names
    (`should_save_ckpt_esi` where it names both), or "", and whether it saves (`_save_checkpoint`).
    Read from the bytecode's names, never run: an over-approximation. A boundary found may still
    never run (then `owns_boundary` hands the steps to the other one, and no warning is given), but
    one not found is not there."""
    cached = _reaches.get(cls)
    if cached is not None:
        return cached
    fit = getattr(cls, "fit", None)
    seen: set[Any] = set()
    names: set[str] = set()
    todo = [_code(fit)]
    while todo and len(seen) < MAX_CODE_OBJECTS:
        code = todo.pop()
        if code is None or code in seen:
            continue
        seen.add(code)
        names.update(code.co_names, code.co_freevars)  # globals and attributes; closure names
        todo.extend(const for const in code.co_consts if hasattr(const, "co_names"))
        for name in code.co_names:
            todo.extend(_code(vars(klass)[name]) for klass in cls.__mro__ if name in vars(klass))
    boundary = ESI if ESI in names else METRICS if METRICS in names else ""
    _reaches[cls] = found = (boundary, SAVE in names)
    return found


MAX_CODE_OBJECTS = 2000  # a trainer class's methods, with room: the walk stops there
_reaches: dict[type, tuple[str, bool]] = {}


def _code(value: Any) -> Any:
    """The code object of a function (under any wrapper, also a static or class method), or None."""
    value = getattr(value, "__func__", value)
    while hasattr(value, "__wrapped__"):
        value = value.__wrapped__
    return getattr(value, "__code__", None)


def verl_version() -> str:
    return str(getattr(sys.modules.get("verl"), "__version__", "unknown"))


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
        if not loop.transport:
            loop.boundary_source = "on_step_end"  # V1's own, whatever else it calls
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


# ---------------------------------------------------------------------- every loop: the metrics call
def patch_metrics_module(module: ModuleType) -> None:
    """Replace `compute_throughout_metrics` where it is defined, before a trainer module binds the
    name (`from verl.trainer.ppo.metric_utils import compute_throughout_metrics`)."""
    original = getattr(module, METRICS, None)
    if not callable(original) or getattr(original, PATCHED, False):
        return
    import functools

    @functools.wraps(original)
    def compute_throughout_metrics(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        # The caller is the trainer's method (fit, _compute_metrics, _fit_collect_metrics).
        trainer = sys._getframe(1).f_locals.get("self")
        if trainer is not None and callable(getattr(trainer, SAVE, None)):
            _metrics_boundary(trainer)
        return result

    setattr(compute_throughout_metrics, PATCHED, True)
    setattr(module, METRICS, compute_throughout_metrics)


def _metrics_boundary(trainer: Any) -> None:
    """A step ended (its metrics are being computed, after the update and verl's own save): save
    if asked and verl did not just save this step, then report the boundary."""
    if not loop.attach("legacy", trainer) or not loop.owns_boundary(METRICS):
        return
    step = _checkpoint_step(trainer)
    if loop.save_requested() and loop.last_saved_step != step:
        trainer._save_checkpoint()  # the step's state, as verl's own periodic save just before
    loop.boundary(step)


def _bind_metrics(module: ModuleType) -> None:
    """A trainer module imported before the metrics module was patched (the hook came late) bound
    verl's own function: bind the patched one."""
    metrics = sys.modules.get(VERL_METRICS_MODULE)
    patched = getattr(metrics, METRICS, None)
    bound = getattr(module, METRICS, None)
    if getattr(patched, PATCHED, False) and bound is getattr(patched, "__wrapped__", None):
        setattr(module, METRICS, patched)
