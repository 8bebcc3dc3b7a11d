"""A Ray driver shaped like `python3 -m verl.trainer.main_ppo`, for the verl hook's tests.

It starts (or joins, with RAY_ADDRESS) a Ray cluster and runs a TaskRunner-shaped actor that
imports verl's real trainer modules and runs real verl code on CPU:

* `--loop legacy`: a loop shaped like `RayPPOTrainer.fit` (a step, then the ESI decision through
  the module-level `ray_trainer.should_save_ckpt_esi`, then verl's save condition) around the real
  `RayPPOTrainer._save_checkpoint`;
* `--loop v1`: the real `verl.trainer.ppo.v1.trainer_base.PPOTrainer.fit` with the step itself
  replaced by a sleep (no rollout engine on CPU) and the real `_save_checkpoint`.

Both save through a stub worker group (writes a small file per "model") and a real
`StatefulDataLoader`. The driver never imports esiwrap: the hook arrives by itself.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import ray


def verl_config(ckpt_dir: str, save_freq: int, total_steps: int, async_save: bool,
                model_dir: str | None = None, resume_mode: str = "auto") -> Any:
    """verl's own generated PPO config, with what this CPU run needs."""
    import verl
    from omegaconf import OmegaConf

    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    overrides = {
        "trainer": {
            "default_local_dir": ckpt_dir, "default_hdfs_dir": None, "save_freq": save_freq,
            "test_freq": -1, "val_before_train": False, "logger": ["console"], "total_epochs": 1,
            "total_training_steps": total_steps, "project_name": "esiwrap", "experiment_name": "test",
            "resume_mode": resume_mode,
        },
        "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": async_save}}},
        "algorithm": {"adv_estimator": "grpo"},  # no critic: this loop has no critic worker group
    }
    if model_dir is not None:
        overrides["actor_rollout_ref"]["model"] = {"path": model_dir}
    return OmegaConf.merge(config, overrides)


class StubWorkerGroup:
    """Stands in for the actor worker group: writes one file per save. With `async_save`, like
    Megatron's async checkpointing, the tracker file is written only when the save is finalized
    (`async_calls_finalize_fn_exec(blocking=True)`), never by verl's `_save_checkpoint`."""

    def __init__(self, async_save: bool = False) -> None:
        self.async_save = async_save
        self.unfinished: list[tuple[str, int]] = []

    def save_checkpoint(
        self, local_path: str, hdfs_path: Any, global_step: int, max_ckpt_to_keep: Any = None
    ) -> None:
        import torch

        os.makedirs(local_path, exist_ok=True)
        torch.save({"step": global_step}, os.path.join(local_path, "model.pt"))
        if self.async_save:
            self.unfinished.append((local_path, global_step))

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        import torch

        torch.load(os.path.join(local_path, "model.pt"))  # what save_checkpoint wrote

    def async_calls_finalize_fn_exec(self, blocking: bool = False) -> None:
        if not blocking:
            return  # the writes are "still in flight"
        for local_path, step in self.unfinished:
            tracker = Path(local_path).parent.parent / "latest_checkpointed_iteration.txt"
            tracker.write_text(str(step))
        self.unfinished.clear()


def dataloader() -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(list(range(10_000)), batch_size=4)


def run_legacy(config: Any, step_s: float, steps: int) -> None:
    from verl.trainer.ppo import ray_trainer

    class FitShaped(ray_trainer.RayPPOTrainer):
        def __init__(self) -> None:  # verl's __init__ builds GPU worker groups: not on CPU
            self.config = config
            self.actor_rollout_wg = StubWorkerGroup(config.actor_rollout_ref.actor.checkpoint.async_save)
            self.use_critic = False
            self.train_dataloader = dataloader()
            self.global_steps = 0
            self.max_steps_duration = 0.0

        def fit(self) -> None:
            self.global_steps = 1
            for _batch in self.train_dataloader:
                self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=False)
                started = time.monotonic()
                time.sleep(step_s)  # generation, log-probs, the actor update
                esi_close_to_expiration = ray_trainer.should_save_ckpt_esi(
                    max_steps_duration=self.max_steps_duration,
                    redundant_time=self.config.trainer.esi_redundant_time,
                )
                if self.config.trainer.save_freq > 0 and (
                    self.global_steps % self.config.trainer.save_freq == 0 or esi_close_to_expiration
                ):
                    self._save_checkpoint()
                self.max_steps_duration = max(self.max_steps_duration, time.monotonic() - started)
                print(f"step {self.global_steps}", flush=True)
                self.global_steps += 1
                if self.global_steps > steps:
                    return

    FitShaped().fit()


def run_v1(config: Any, step_s: float, steps: int, load: bool = False) -> None:
    from types import SimpleNamespace

    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
    from verl.trainer.ppo.v1 import trainer_base

    # The transfer queue needs its Ray actors; this loop puts nothing in it.
    trainer_base.tq = SimpleNamespace(kv_clear=lambda keys, partition_id: None)

    class StepShaped(trainer_base.PPOTrainer):
        def __init__(self) -> None:  # verl's __init__ builds GPU worker groups: not on CPU
            self.config = config
            self.checkpoint_callback = build_checkpoint_callback(config)
            self.actor_rollout_wg = StubWorkerGroup()
            self.use_critic = self.use_reference_policy = False
            self.trainer_mode = "sync"
            self.train_dataloader = dataloader()
            self.global_steps = 0
            self.steps_per_epoch = self.total_training_steps = steps
            self._init_dump_executor()
            if load:  # the end of verl's init_workers: load the checkpoint resume_mode points at
                self._load_checkpoint()

        def step(self, metrics: dict[str, Any], timing_raw: dict[str, Any]) -> Any:
            time.sleep(step_s)  # generation, log-probs, the actor update
            return KVBatchMeta(partition_id="train", keys=[], tags=[])

        def _compute_metrics(self, batch: Any, metrics: Any, timing_raw: Any, global_steps: int, epoch: int) -> None:  # noqa: E501
            print(f"step {global_steps}", flush=True)

        def on_step_end(self) -> None:
            """The sync trainer syncs weights to the rollout here."""

        def on_sample_end(self) -> None:
            """Nothing sampled."""

    StepShaped().fit(agent_loop_manager=None)


def expire_soon_per_verl(in_s: float, step_s: float, out_dir: Path) -> None:
    """Set the platform variable verl's own ESI check reads, and record what that check says."""
    from verl.utils.checkpoint import checkpoint_manager

    os.environ["MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"] = str(time.time() + in_s)
    verdict = checkpoint_manager.should_save_ckpt_esi(max_steps_duration=step_s)
    (out_dir / "verl_native_check.txt").write_text(str(verdict))


@ray.remote(num_cpus=0)
class TaskRunner:
    def run(self, args: argparse.Namespace) -> None:
        Path(args.pid_file).write_text(str(os.getpid()))
        config = verl_config(args.ckpt_dir, args.save_freq, args.steps, args.async_save, args.model_dir,
                             args.resume_mode or "auto")
        loop, step_s, steps = args.loop, args.step_seconds, args.steps
        if loop == "legacy":
            from verl.trainer.ppo import ray_trainer  # noqa: F401 - imported first, as verl does

            if args.mlp_expiry_in is not None:
                expire_soon_per_verl(args.mlp_expiry_in, step_s, Path(args.pid_file).parent)
            run_legacy(config, step_s, steps)
        else:
            run_v1(config, step_s, steps, load=args.resume_mode is not None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=["legacy", "v1"], required=True)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--step-seconds", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--save-freq", type=int, default=-1)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--skip-ray-env-hook", action="store_true")
    parser.add_argument("--async-save", action="store_true", help="actor.checkpoint.async_save=True")
    parser.add_argument("--mlp-expiry-in", type=float, help="set verl's MLP_ expiry variable in the actor")
    parser.add_argument("--model-dir", help="actor_rollout_ref.model.path (a local model directory)")
    parser.add_argument("--resume-mode", choices=["auto", "disable"],
                        help="v1: trainer.resume_mode, and load the checkpoint as init_workers does")
    args = parser.parse_args()
    # --skip-ray-env-hook: what `uv run` does to RAY_RUNTIME_ENV_HOOK (Ray ignores it)
    skip = {"_skip_env_hook": True} if args.skip_ray_env_hook else {}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**skip)
    else:
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=os.environ["RAY_TMPDIR"], **skip)
    runner = TaskRunner.remote()  # type: ignore[attr-defined]
    ray.get(runner.run.remote(args))


if __name__ == "__main__":
    main()
