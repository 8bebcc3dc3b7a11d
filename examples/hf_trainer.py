"""A Hugging Face `Trainer` run that checkpoints when esiwrap asks, and resumes where it left off.

    esiwrap --deadline +10m -- python examples/hf_trainer.py --output-dir ./hf-run

The model is a tiny GPT-2 built from a config (random weights, nothing downloaded) and the data is
synthetic. The lines marked `# esiwrap` are all the integration needs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from esiwrap.integrations.transformers import EsiwrapCallback, last_checkpoint  # esiwrap

VOCAB, LENGTH = 64, 16


class SyntheticText(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Deterministic random token sequences; the labels are the inputs (causal LM)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids.clone()}


class Pace(TrainerCallback):  # type: ignore[misc]
    """Pads each step to `seconds` of wall time: stands in for a real model's step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.began = time.monotonic()
        self.first_step: int | None = None  # the first step this run trained (after a resume)

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self.began = time.monotonic()

    def on_step_end(self, args: Any, state: Any, *rest: Any, **kwargs: Any) -> None:
        if self.first_step is None:
            self.first_step = state.global_step
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.began)))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="hf-run")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--jit-checkpoint", action="store_true",
                        help="also turn on transformers' SIGTERM checkpointing (esiwrap takes it over)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    options = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(
        output_dir=options.output_dir, max_steps=options.max_steps, per_device_train_batch_size=8,
        learning_rate=1e-3, save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
        enable_jit_checkpoint=options.jit_checkpoint,
    )
    pace, esiwrap_callback = Pace(options.step_seconds), EsiwrapCallback()  # esiwrap
    trainer = Trainer(
        model=GPT2LMHeadModel(config), args=args, train_dataset=SyntheticText(100_000),
        callbacks=[pace, esiwrap_callback],  # esiwrap
    )
    last = last_checkpoint(options.output_dir)  # esiwrap
    print(f"hf_trainer: resuming from {last}" if last else "hf_trainer: starting fresh", flush=True)
    trainer.train(resume_from_checkpoint=last)
    print(f"hf_trainer: trained steps {pace.first_step}..{trainer.state.global_step}"
          f"{' by esiwrap' if esiwrap_callback.stopped_by_esiwrap else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
