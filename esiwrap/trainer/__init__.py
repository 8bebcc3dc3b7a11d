"""The in-trainer side: a few lines turn esiwrap's save signal into a checkpoint at a step boundary.

    import esiwrap.trainer as esi
    esi.install()                          # once, in the main thread
    for step in ...:
        train_one_step()
        esi.step_done(step)
        if esi.save_requested():
            with esi.saving(step, path):   # reports begin/end, measures, clears the request
                save_checkpoint(path)

The signal handler only sets a flag. Everything that talks to the supervisor happens in the
caller's thread, never blocks and never raises. Without esiwrap (no `ESIWRAP_SOCKET`), `install()`
still works, so `kill -USR1 <pid>` asks for a save by hand.

When the process ends (`atexit`), the library ignores the save signal from then on and says `bye`:
the interpreter's shutdown would otherwise hand the signal back to its default action, which
kills, and a save signal already on its way would end a finished run with 128+N.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from esiwrap.envvars import SOCKET_ENV, TRAINER_SIGTERM_ENV, TRAINER_SIGTERM_SAVE
from esiwrap.signals import save_signal
from esiwrap.trainer import wire
from esiwrap.trainer.channel import ChannelClient

__all__ = [
    "any_rank",
    "checkpoint_bytes",
    "clear",
    "install",
    "installed_signal",
    "report_checkpoint_bytes",
    "request_save",
    "save_finished",
    "save_requested",
    "save_requested_and",
    "save_snapshotted",
    "save_started",
    "saving",
    "saving_async",
    "step_done",
    "uninstall",
]

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class _State:
    def __init__(self) -> None:
        self.requested = False  # set by the signal handler, nothing else happens there
        self.agreed = False  # the ranks agreed on this save in an all-reduce: agree on its end too
        self.peer = False  # ...and this process had not been asked itself: another node's request
        self.signum: int | None = None
        self.previous: _Handler = None
        self.previous_sigterm: _Handler = None
        self.sigterm_taken = False  # SIGTERM asks for a save (inside a Slurm job)
        self.client = ChannelClient(None)
        self.last_boundary = time.monotonic()
        self.save_started_at: float | None = None
        # The process that said hello, and the save signal it named: at its end it says bye and
        # ignores that signal (a forked child inherits this state, not the hello: it says nothing).
        self.hello_pid: int | None = None
        self.bye_signum: int | None = None
        self.bye_registered = False


_state = _State()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _state.requested = True
    previous = _state.previous
    if callable(previous):
        previous(signum, frame)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _state.requested = True
    previous = _state.previous_sigterm
    if callable(previous):
        previous(signum, frame)


def install(
    signum: int | None = None,
    *,
    saves: bool = True,
    stop_signal: str | None = None,
    integration: str = "plain",
    checkpoint_bytes: float | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resumed_from: str | os.PathLike[str] | None = None,
    **hello: Any,
) -> None:
    """Register the save-signal handler and say hello to the supervisor (main thread only).

    `signum` defaults to what esiwrap exported (`ESIWRAP_SIGNAL`), else SIGUSR1. `saves=False`
    tells the supervisor this process takes no part in checkpoints (the other ranks of a
    rank-0-only save): it is still signalled, but esiwrap does not wait for its `saving()`
    (unless no process it supervises saves: a node of a multi-node job without rank 0).
    `stop_signal` asks esiwrap to stop this process with another signal than
    its `--stop-signal` (e.g. "SIGINT" for a Ray driver). A previous handler is chained, and
    restored by `uninstall()`.

    What esiwrap can know of the save before the first one, so that it need not guess:
    `checkpoint_bytes`, what this process writes of a checkpoint (`checkpoint_bytes(model,
    optimizer)` sums it; `report_checkpoint_bytes` updates it later); `checkpoint_dir`, where
    checkpoints go (esiwrap measures that storage's write speed); `resumed_from`, the checkpoint
    this run resumed from (its files say how big a checkpoint is and how long one took to write).

    Inside a Slurm job (esiwrap exports `ESIWRAP_TRAINER_SIGTERM=save`) Slurm sends SIGTERM to
    every process of the job, this one too, while esiwrap may still be waiting for its save: the
    handler then also takes SIGTERM, as a save request, and the hello asks esiwrap to stop this
    process with SIGHUP (SIGINT where SIGHUP is ignored or handled) instead, unless
    `stop_signal` is given.
    """
    if threading.current_thread() is not threading.main_thread():
        msg = "esiwrap.trainer.install() must be called from the main thread"
        raise RuntimeError(msg)
    chosen = signum if signum is not None else save_signal()
    if _state.signum is not None:  # installed already: this hello adds to the last one, no bye
        _restore_handlers()
        _state.client.close()
    _state.previous = signal.getsignal(chosen)
    signal.signal(chosen, _on_signal)
    _state.signum = chosen
    _state.client = ChannelClient.from_env()
    _state.last_boundary = time.monotonic()
    rank, world_size = _rank_and_world()
    nodes = _nodes(world_size)
    message = wire.Hello(
        rank=rank, world_size=world_size, saves=saves, signal=True, integration=integration,
        stop_signal=stop_signal or _sigterm_saves(),
        sigterm=TRAINER_SIGTERM_SAVE if _state.sigterm_taken else None,
        nodes=nodes if nodes > 1 else None,
        **_checkpoint_fields(checkpoint_bytes, checkpoint_dir, resumed_from),
    )
    known = {key: value for key, value in hello.items() if key in wire.Hello._fields and key != "extra"}
    extra = {key: value for key, value in hello.items() if key not in known}
    _state.client.send(message._replace(**known, extra=extra))
    _state.hello_pid, _state.bye_signum = os.getpid(), chosen
    if not _state.bye_registered:
        atexit.register(_say_bye)
        _state.bye_registered = True


def say_bye_at_exit(client: ChannelClient, signum: int) -> None:
    """For a process that said hello to esiwrap on `client` without `install()` (esiwrap's verl
    and Ray hooks: the Ray driver's relay, a TaskRunner signalled directly), handling `signum`
    itself: the end `install()` gives, once per process whoever asks (`_say_bye`)."""
    if _state.hello_pid != os.getpid():  # install() said no hello here: this client says bye
        _state.client = client
    _state.hello_pid, _state.bye_signum = os.getpid(), signum
    if not _state.bye_registered:
        atexit.register(_say_bye)
        _state.bye_registered = True


def _say_bye() -> None:
    """The process ends (atexit, from `sys.exit`, the end of the script or an uncaught exception):
    ignore the save signal from now on, then tell esiwrap `bye`, so that it sends no more.

    The order matters. CPython's shutdown runs the atexit hooks, then puts every signal that has
    a Python handler back to its default action (`_PySignal_Fini`), which for SIGUSR1 terminates:
    a save signal that arrives after that, while modules are torn down, kills a run that finished,
    with 128+N. A signal set to SIG_IGN is left as it is, until the process is gone; and a save
    signal esiwrap sent before the bye reached it then finds it ignored. Never blocks or raises.
    `os._exit` runs no atexit hook and no shutdown: the handler stays until the process is gone,
    and esiwrap learns of its end from the exit itself."""
    if _state.hello_pid != os.getpid():
        return  # never said hello here (a forked child), or said bye already
    signum, _state.hello_pid = _state.bye_signum, None
    if signum is not None:
        with contextlib.suppress(Exception):  # (ValueError off the main thread: the bye still goes)
            signal.signal(signum, signal.SIG_IGN)
        if _state.signum == signum:  # a later uninstall() must not give the signal back
            _state.signum, _state.previous = None, None
    with contextlib.suppress(Exception):  # send() never raises; a resend thread may not start now
        _state.client.send(wire.Bye())


def _sigterm_saves() -> str | None:
    """Under esiwrap in a Slurm job: take SIGTERM as a save request, and return the signal that
    still stops this process (None, and SIGTERM left alone, when there is none)."""
    if os.environ.get(TRAINER_SIGTERM_ENV) != TRAINER_SIGTERM_SAVE or not os.environ.get(SOCKET_ENV):
        return None
    stop = _obeyed_stop_signal()
    if stop is not None:
        _state.previous_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
        _state.sigterm_taken = True
    return stop


def _obeyed_stop_signal() -> str | None:
    """SIGHUP while it has its default action: it ends the process at once, as SIGTERM did (the
    checkpoint is complete; measured 0.02 s, where SIGINT's KeyboardInterrupt unwinds and tears
    the interpreter down in 0.7-3 s, close to a Slurm job's end). Else SIGINT unless ignored
    (`nohup` ignores SIGHUP; a batch script's background command, SIGINT)."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        return "SIGHUP"
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return "SIGINT"
    return None


def _checkpoint_fields(nbytes: float | None, directory: str | os.PathLike[str] | None,
                       resumed_from: str | os.PathLike[str] | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if nbytes is not None and nbytes > 0 and math.isfinite(nbytes):
        fields["checkpoint_bytes"] = float(nbytes)
    if directory is not None:
        fields["checkpoint_dir"] = os.path.abspath(os.fspath(directory))
    if resumed_from is not None:
        fields["resumed_from"] = os.path.abspath(os.fspath(resumed_from))
    return fields


def _nodes(world_size: int) -> int:
    """The job's nodes, from torchrun's variables (a job is interrupted when any node is)."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    except ValueError:
        local = 0
    return -(-world_size // local) if local > 0 else 1


def report_checkpoint_bytes(nbytes: float) -> None:
    """Tell esiwrap (again) what this process writes of a checkpoint: once the optimizer's state
    exists, or when the checkpoint grows. Never blocks or raises."""
    if nbytes > 0 and math.isfinite(nbytes):
        _state.client.send(wire.Checkpoint(bytes=float(nbytes)))


def checkpoint_bytes(*objects: Any) -> int:
    """The bytes of the tensors a checkpoint of `objects` holds, counted without copying anything:
    `torch.nn.Module`s (parameters and buffers), optimizers (their state; before the first step,
    when an optimizer has none yet, what its kind will keep: two tensors per parameter for Adam
    and its kin, one for SGD with momentum or Adagrad, two for any other), state dicts, tensors,
    and lists, tuples or dicts of them. A tensor shared by several objects counts once; a sharded
    tensor (DTensor, FSDP) counts its local shard: what this process writes."""
    seen: set[tuple[int, int]] = set()
    return sum(_tensor_bytes(obj, seen) for obj in objects)


_STATE_TENSORS = {"SGD": 1, "Adagrad": 1, "RMSprop": 1, "Rprop": 2, "Adadelta": 2, "Adam": 2, "AdamW": 2,
                  "Adamax": 2, "NAdam": 2, "RAdam": 2, "SparseAdam": 2, "LBFGS": 2}


def _tensor_bytes(obj: Any, seen: set[tuple[int, int]]) -> int:
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):  # a tensor
        local = getattr(obj, "_local_tensor", obj)  # a DTensor: this rank's shard
        try:
            key = (local.untyped_storage().data_ptr(), local.storage_offset())
        except Exception:
            key = (id(local), 0)
        if key in seen:
            return 0
        seen.add(key)
        return int(local.numel()) * int(local.element_size())
    if hasattr(obj, "param_groups") and hasattr(obj, "state"):  # an optimizer
        return _optimizer_bytes(obj, seen)
    if hasattr(obj, "state_dict") and hasattr(obj, "parameters"):  # a module
        return _tensor_bytes(obj.state_dict(keep_vars=True), seen)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def _optimizer_bytes(optimizer: Any, seen: set[tuple[int, int]]) -> int:
    if any(optimizer.state.values()):
        return sum(_tensor_bytes(state, seen) for state in optimizer.state.values())
    per_param = _STATE_TENSORS.get(type(optimizer).__name__, 2)
    if type(optimizer).__name__ == "SGD" and not any(g.get("momentum") for g in optimizer.param_groups):
        per_param = 0
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return per_param * sum(_tensor_bytes(p, set()) for p in params)


def uninstall() -> None:
    """Take the save handler away: the handler that was there before `install()` is back, and under
    esiwrap the process says `bye`, so esiwrap sends it no more save signals (until `install()`
    says hello again). Where that earlier handler was the default action, which kills, the signal
    is ignored instead while esiwrap supervises: a save signal sent before esiwrap read the bye
    must not end a process that goes on (a framework's callback uninstalls at the end of
    training; evaluation or an upload may follow)."""
    if _state.signum is None:
        return
    signum = _state.signum
    _restore_handlers()
    if _state.hello_pid == os.getpid() and _state.client.path is not None:
        _state.hello_pid = None  # the bye goes now, not again at the process's end
        if signal.getsignal(signum) == signal.SIG_DFL and signum not in _DEFAULT_HARMLESS:
            signal.signal(signum, signal.SIG_IGN)
        _state.client.send(wire.Bye())
    _state.client.close()


# Signals whose default action does not end the process: their default stays after uninstall().
_DEFAULT_HARMLESS = frozenset({signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH, signal.SIGCONT})


def _restore_handlers() -> None:
    """The save signal's handler (and SIGTERM's, in a Slurm job) as they were before `install()`."""
    assert _state.signum is not None
    previous = _state.previous if _state.previous is not None else signal.SIG_DFL
    signal.signal(_state.signum, previous)
    _state.signum = None
    _state.previous = None
    if _state.sigterm_taken:
        before = _state.previous_sigterm
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
        _state.sigterm_taken, _state.previous_sigterm = False, None


def installed_signal() -> int | None:
    """The save signal `install()` registered for, or None."""
    return _state.signum


def save_requested() -> bool:
    """True when a save was asked for. With torch.distributed initialized, every rank gets the
    same answer (an all-reduce of the flag), so all ranks save at the same step: call it the same
    number of times on every rank."""
    return save_requested_and(False)[0]


def save_requested_and(flag: bool) -> tuple[bool, bool]:
    """`save_requested()` and `any_rank(flag)` in one all-reduce, for callbacks that need both at
    every step (the Hugging Face callback's stop request)."""
    asked_here = _state.requested
    save, other = _agree_across_ranks(asked_here, flag)
    if save:
        _state.requested = True
        if _process_group() is not None:
            _state.agreed = True
            # A rank another node's esiwrap signalled asked for it: this node's esiwrap did not,
            # and learns it from the save messages (it stops after the save, like the other).
            _state.peer = _state.peer or not asked_here
    return save, other


def request_save() -> None:
    """Ask for a save from inside the trainer (what the signal handler does)."""
    _state.requested = True


def clear() -> None:
    """Forget the request; `saving()` does this when a save succeeds."""
    _state.requested = _state.peer = False


def step_done(step: int) -> None:
    """Report a step boundary; the duration is boundary-to-boundary wall time."""
    now = time.monotonic()
    duration_s = now - _state.last_boundary
    _state.last_boundary = now
    _state.client.send(wire.Step(step=int(step), duration_s=round(max(0.0, duration_s), 6)))


@contextmanager
def saving(step: int, path: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Wrap the checkpoint write: reports save_begin/save_end and measures it.

    Leave the block only when the checkpoint is complete on disk: the end of the block is the
    acknowledgement that lets esiwrap stop the trainer. An exception is reported as a failed save
    (and re-raised); the request then stays set so the next boundary tries again. With several
    torch.distributed ranks, call it on every rank once `save_requested()` is true, ranks that
    write nothing too: its end waits for every rank (see `save_finished`).
    """
    save_started(step)
    try:
        yield
    except BaseException as exc:
        save_finished(step, path, error=repr(exc))
        raise
    save_finished(step, path)


def save_started(step: int) -> None:
    """Report that a checkpoint write begins (for callbacks, where a `with` block cannot span
    the hooks that start and end the write; `saving()` is this pair around a block)."""
    _state.save_started_at = time.monotonic()
    _state.client.send(wire.SaveBegin(step=int(step), peer=_state.peer))


def save_snapshotted(step: int) -> None:
    """An asynchronous save's blocking part is over (the state is copied, the write goes on in the
    background): training resumes, and esiwrap counts only this part as time lost to training.
    The request is served: it is cleared. Call `save_finished` once the write is durable."""
    started = _state.save_started_at if _state.save_started_at is not None else time.monotonic()
    peer = _state.peer
    clear()
    _state.client.send(wire.SaveSnapshot(step=int(step), duration_s=round(time.monotonic() - started, 6),
                                         peer=peer))


def save_finished(step: int, path: str | os.PathLike[str] | None = None, *,
                  error: str | None = None) -> None:
    """Report the end of the write begun by `save_started`: the acknowledgement when `error` is
    None (the request is cleared), a failed save otherwise (the request stays set, or is set again
    after an asynchronous snapshot, so the next boundary tries again).

    For a save the torch.distributed ranks agreed on, every rank calls it and it waits for all of
    them (one all-reduce of "failed here"): no rank, on any node, acknowledges before every
    rank's part is written, and all report a failure anywhere as theirs. That all-reduce is a
    collective: with several ranks, call it from the training thread (for an asynchronous write,
    at a step boundary once the write is done), never from a callback thread."""
    started = _state.save_started_at if _state.save_started_at is not None else time.monotonic()
    _state.save_started_at = None
    peer = _state.peer
    if _state.agreed:
        _state.agreed = False
        error = _agree_on_the_outcome(error)
    message = wire.SaveEnd(step=int(step), ok=error is None,
                           path=os.fspath(path) if path is not None else None,
                           duration_s=round(time.monotonic() - started, 6),
                           error=error[:500] if error is not None else None, peer=peer)
    if error is not None:
        request_save()
    else:
        clear()
    _state.client.send(message)


class AsyncSave:
    """An asynchronous save whose blocking part is done; `finished()` when the write is durable."""

    def __init__(self, step: int, path: str | os.PathLike[str] | None) -> None:
        self.step = step
        self.path = path

    def finished(self, error: BaseException | str | None = None) -> None:
        """The write is on disk (or failed with `error`): e.g. from `future.add_done_callback` with
        one process; with several torch.distributed ranks, from the training thread (it may run
        a collective, see `save_finished`)."""
        save_finished(self.step, self.path, error=None if error is None else repr(error))


@contextmanager
def saving_async(step: int, path: str | os.PathLike[str] | None = None) -> Iterator[AsyncSave]:
    """Wrap the blocking part of an asynchronous save (PyTorch DCP `async_save`, a background
    writer): leaving the block reports the snapshot, training goes on; call `.finished()` on the
    yielded handle when the write is durable. An exception inside is a failed save."""
    save_started(step)
    handle = AsyncSave(step, path)
    try:
        yield handle
    except BaseException as exc:
        save_finished(step, path, error=repr(exc))
        raise
    save_snapshotted(step)


def _agree_on_the_outcome(error: str | None) -> str | None:
    """This rank's error, or another rank's failure, or None when every rank saved its part."""
    try:
        failed_anywhere = _agree_across_ranks(error is not None)[0]
    except Exception as exc:  # the collective itself broke (a peer gone): not a complete save
        return error or f"the ranks could not agree that the save completed: {exc!r}"
    if error is None and failed_anywhere:
        return "the save failed on another rank"
    return error


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on any rank (an all-reduce MAX with more than one
    torch.distributed rank; the flag itself otherwise). Call it in step on every rank."""
    return _agree_across_ranks(flag)[0]


def _rank_and_world() -> tuple[int, int]:
    def env_int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return env_int("RANK", 0), env_int("WORLD_SIZE", 1)


def _process_group() -> Any:
    """`torch.distributed` when it runs with more than one rank, else None. Never imports torch
    itself: the trainer already has."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return None
    return dist


def _agree_across_ranks(*flags: bool) -> tuple[bool, ...]:
    """All-reduce MAX of the flags (one collective) when torch.distributed runs with more than
    one rank; the flags themselves otherwise."""
    import sys

    dist = _process_group()
    if dist is None:
        return flags
    torch = sys.modules["torch"]
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    tensor = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in tensor.tolist())
