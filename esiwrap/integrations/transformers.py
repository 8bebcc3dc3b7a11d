"""Hugging Face `Trainer`: one callback turns esiwrap's save signal into a Trainer checkpoint.

    from esiwrap.integrations.transformers import EsiwrapCallback, last_checkpoint
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[EsiwrapCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))

At every step end it reports the boundary; when a save was requested (on any rank: the flag is
all-reduced) it sets `control.should_save`, so the Trainer writes its usual
`checkpoint-<step>` directory, and acknowledges in `on_save` once `trainer_state.json` (written
last) is there. The Trainer's own periodic saves are reported the same way (esiwrap learns how
long a save takes, and that the step is saved). Only processes where `args.should_save` is true
take part in the acknowledgement (rank 0, or each node's first rank with `save_on_each_node`).

Under esiwrap, SIGTERM ends the run gracefully: it sets `control.should_training_stop` at the
next step end, every rank agreeing, and `train()` returns (`callback.stopped_by_esiwrap` is then
true: skip what follows a finished training). esiwrap sends SIGTERM once the last checkpoint is
acknowledged, so the stop itself saves nothing; a SIGTERM from the platform goes to esiwrap,
which turns it into a save request first. Transformers' own just-in-time
checkpointing (`TrainingArguments(enable_jit_checkpoint=True)`: SIGTERM, wait 3 s, save) would
write that checkpoint a second time; under esiwrap this callback takes SIGTERM over from it (and
gives it back when training ends), since esiwrap's `--on-sigterm checkpoint` already turns a
SIGTERM into one save at the next step boundary, within a budget it measures.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import esiwrap.trainer as esi
from esiwrap.envvars import SOCKET_ENV

__all__ = ["EsiwrapCallback", "last_checkpoint"]

TRAINER_STATE_NAME = "trainer_state.json"  # the Trainer writes it last in a checkpoint directory
_log = logging.getLogger(__name__)


class EsiwrapCallback(TrainerCallback):
    """Checkpoint at the step esiwrap asks for; stop gracefully on SIGTERM under esiwrap.

    `graceful_stop=False` leaves SIGTERM alone (the process then dies on esiwrap's stop, which
    loses nothing: the checkpoint is already complete).
    """

    def __init__(self, *, graceful_stop: bool = True) -> None:
        self.graceful_stop = graceful_stop
        self.stop_requested = False  # set by the SIGTERM handler, nothing else happens there
        self.stopped_by_esiwrap = False  # train() returned because esiwrap stopped the run
        self._pending_step: int | None = None
        self._previous_sigterm: Any = None
        self._took_sigterm = False

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        # What a checkpoint holds (the model and the optimizer's state, on the saving processes),
        # where checkpoints go and the newest one there: the first save is planned from them.
        saves = bool(args.should_save)
        size = esi.checkpoint_bytes(kwargs.get("model"), kwargs.get("optimizer")) if saves else 0
        esi.install(saves=saves, integration="transformers", checkpoint_bytes=size or None,
                    checkpoint_dir=args.output_dir, resumed_from=last_checkpoint(args.output_dir or "."))
        self.stop_requested = self.stopped_by_esiwrap = False
        if self.graceful_stop and os.environ.get(SOCKET_ENV):
            self._take_sigterm()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        step = state.global_step
        if self._pending_step is not None:  # e.g. save_strategy="best" took the save back
            esi.save_finished(self._pending_step, error="the Trainer did not save at that step")
            self._pending_step = None
        esi.step_done(step)
        # one all-reduce per step for both questions (every rank calls this hook)
        requested, stop = esi.save_requested_and(self._took_sigterm and self.stop_requested)
        if self._took_sigterm and stop:
            control.should_training_stop = True
            self.stopped_by_esiwrap = True
        # The Trainer's own saves are reported too (by the saving processes): esiwrap learns how
        # long a save takes and that the step is saved.
        if requested or (control.should_save and args.should_save):
            control.should_save = True
            self._pending_step = step
            esi.save_started(step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        step = self._pending_step
        if step is None:
            return  # a save outside a step end (e.g. at an epoch end): not ours to report
        self._pending_step = None
        path = _checkpoint_dir(args, step)
        if args.should_save and not os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)):
            esi.save_finished(step, path, error=f"{path}/{TRAINER_STATE_NAME} is missing")
            return
        esi.save_finished(step, path)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._give_back_sigterm()
        esi.uninstall()

    # ------------------------------------------------------------------ SIGTERM
    def _take_sigterm(self) -> None:
        previous = signal.getsignal(signal.SIGTERM)
        if _is_jit_checkpoint_handler(previous):
            _log.warning("esiwrap: transformers' enable_jit_checkpoint is off while esiwrap supervises; "
                         "esiwrap's --on-sigterm checkpoint saves once at the next step instead")
        self._previous_sigterm = previous
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._took_sigterm = True

    def _give_back_sigterm(self) -> None:
        if self._took_sigterm:
            previous = self._previous_sigterm
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            self._took_sigterm = False

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest `checkpoint-<step>` in `output_dir` to resume from, or None (also when the
    directory does not exist yet, where transformers' `get_last_checkpoint` raises)."""
    from transformers.trainer_utils import get_last_checkpoint

    if not os.path.isdir(output_dir):
        return None
    found: str | None = get_last_checkpoint(os.fspath(output_dir))  # type: ignore[no-untyped-call]
    return found


def _checkpoint_dir(args: TrainingArguments, step: int) -> str:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{step}")


def _is_jit_checkpoint_handler(handler: Any) -> bool:
    owner = getattr(handler, "__self__", None)
    return owner is not None and type(owner).__name__ == "CheckpointManager"
