"""A Ray driver shaped like `python3 -m verl.trainer.main_ppo`, for the verl hook's tests, with any
verl from 0.4.1 on.

It starts (or joins, with RAY_ADDRESS) a Ray cluster and runs a TaskRunner-shaped actor that
imports verl's real trainer modules and runs real verl code on CPU. Each `--loop` is a loop a user
of some verl runs:

* `legacy` (`main_ppo`, `trainer.use_v1=false`; the only loop before 0.9): `trainer.fit()` on a
  `RayPPOTrainer` whose `fit` is verl's own function object (whatever wraps it: the hook attaches
  there) running a body shaped like this version's fit: a step (a sleep), then, as verl's fit does
  at its boundary, `ray_trainer.should_save_ckpt_esi(...)` looked up in the trainer module (0.5.0
  on; verl 0.4.1's fit has no such call), verl's save condition around the real
  `_save_checkpoint`, then the step's metrics through the module's `compute_throughout_metrics`
  (every verl's fit calls it once a step);
* `v1` (`main_ppo`'s default in 0.9): the real `verl.trainer.ppo.v1.trainer_base.PPOTrainer.fit`
  with the step itself a sleep (no rollout engine on CPU) and the real `_save_checkpoint`;
* `sync` (0.8.0's `main_ppo_sync`, where its `main_ppo`'s deprecation points): the real
  `verl.trainer.main_ppo_sync.PPOTrainer.fit`, the step a sleep, its metrics call as verl's;
* `recipe`: a subclass of `RayPPOTrainer` defined here, as the recipes (DAPO, entropy, ...)
  define theirs in their own modules: its own `fit`, no ESI call, `compute_throughout_metrics`
  imported by name and called once a step;
* `nosave`: such a subclass whose `fit` reaches no boundary at all (RayPRIMETrainer's shape): it
  saves only on `save_freq`, so esiwrap's hook cannot save it on request and must say so.

All save through a stub worker group (a small file per "model") and a real `StatefulDataLoader`.
The driver never imports esiwrap: the hook arrives by itself.

`--main-ppo KEY=VALUE ...` reads `python3 -m verl.trainer.main_ppo`'s Hydra overrides instead (what
tests/system/integrations/test_verl_recipe.py's `python3` on PATH passes on from a run script):
`trainer.use_v1` (default: true where the V1 loop exists) picks the loop, `trainer.default_local_dir`,
`trainer.save_freq`, `trainer.resume_mode` and `trainer.total_training_steps` are used, the rest is
ignored (it describes a GPU run); VERL_DRIVER_PID_FILE and VERL_DRIVER_STEP_SECONDS set what the
flags below set. On SIGINT (esiwrap's stop for a Ray driver) it says so, then lets
KeyboardInterrupt end it as it ends verl's driver.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import ray


def verl_config(ckpt_dir: str, save_freq: int, total_steps: int, async_save: bool,
                model_dir: str | None = None, resume_mode: str = "auto") -> Any:
    """verl's own PPO config (the generated one where this verl has it), with what a CPU run needs."""
    import verl
    from omegaconf import OmegaConf

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    generated = config_dir / "_generated_ppo_trainer.yaml"  # 0.5.0 on
    config = OmegaConf.load(generated if generated.exists() else config_dir / "ppo_trainer.yaml")
    OmegaConf.set_struct(config, False)
    overrides: dict[str, Any] = {
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


SHARD = "model_world_size_1_rank_0.pt"  # verl's FSDP layout, one rank: what esiwrap's check reads


class StubWorkerGroup:
    """Stands in for the actor worker group: writes what verl's FSDP save of one rank writes (its
    model shard, then fsdp_config.json), a tiny one. With `async_save`, like
    Megatron's async checkpointing, the tracker file is written only when the save is finalized
    (`async_calls_finalize_fn_exec(blocking=True)`), never by verl's `_save_checkpoint`."""

    def __init__(self, async_save: bool = False) -> None:
        self.async_save = async_save
        self.unfinished: list[tuple[str, int]] = []

    def save_checkpoint(self, local_path: str, hdfs_path: Any, global_step: int,
                        max_ckpt_to_keep: Any = None, **_: Any) -> None:
        import torch

        os.makedirs(local_path, exist_ok=True)
        torch.save({"step": global_step}, os.path.join(local_path, SHARD))
        with open(os.path.join(local_path, "fsdp_config.json"), "w") as config:
            json.dump({"FSDP_version": 1, "world_size": 1}, config)
        if self.async_save:
            self.unfinished.append((local_path, global_step))

    def load_checkpoint(self, local_path: str | None, del_local_after_load: bool = False, **_: Any) -> None:
        import torch

        if local_path is not None:  # verl 0.6.1 calls it with None when starting from scratch
            torch.load(os.path.join(local_path, SHARD))  # what save_checkpoint wrote

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


def a_batch() -> Any:
    """What `compute_throughout_metrics` reads of a step's batch."""
    from types import SimpleNamespace

    return SimpleNamespace(meta_info={"global_token_num": [16]})


def _legacy_fit_body(self: Any) -> None:
    """`RayPPOTrainer.fit` of verl 0.5.0 on, shaped for CPU. It becomes the code of verl's own `fit`
    function (`run_legacy`), so it runs with ray_trainer's globals and imports what it needs."""
    import time as _time

    from verl.trainer.ppo import ray_trainer as _rt

    self.global_steps = 0
    self._load_checkpoint()  # as every version's fit does first
    self.global_steps += 1
    for _batch in self.train_dataloader:
        is_last_step = self.global_steps >= self._cpu_steps
        self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=False)
        started = _time.monotonic()
        _time.sleep(self._cpu_step_s)  # generation, log-probs, the actor update
        esi = _rt.should_save_ckpt_esi(  # looked up in the module at each step, as fit does
            max_steps_duration=self.max_steps_duration,
            redundant_time=self.config.trainer.get("esi_redundant_time", 0),
        )
        if self.config.trainer.save_freq > 0 and (
            is_last_step or self.global_steps % self.config.trainer.save_freq == 0 or esi
        ):
            self._save_checkpoint()
        timing_raw = {"step": _time.monotonic() - started}
        _rt.compute_throughout_metrics(batch=self._cpu_batch, timing_raw=timing_raw, n_gpus=1)
        self.max_steps_duration = max(self.max_steps_duration, _time.monotonic() - started)
        print(f"step {self.global_steps}", flush=True)
        self.global_steps += 1
        if is_last_step:
            return


def _legacy_fit_body_041(self: Any) -> None:
    """`RayPPOTrainer.fit` of verl 0.4.1, shaped for CPU: no ESI call at all (0.4.1 has none)."""
    import time as _time

    from verl.trainer.ppo import ray_trainer as _rt

    self.global_steps = 0
    self._load_checkpoint()
    self.global_steps += 1
    for _batch in self.train_dataloader:
        is_last_step = self.global_steps >= self._cpu_steps
        started = _time.monotonic()
        _time.sleep(self._cpu_step_s)  # generation, log-probs, the actor update
        if self.config.trainer.save_freq > 0 and (
            is_last_step or self.global_steps % self.config.trainer.save_freq == 0
        ):
            self._save_checkpoint()
        timing_raw = {"step": _time.monotonic() - started}
        _rt.compute_throughout_metrics(batch=self._cpu_batch, timing_raw=timing_raw, n_gpus=1)
        print(f"step {self.global_steps}", flush=True)
        self.global_steps += 1
        if is_last_step:
            return


def cpu_trainer(base: type, config: Any, step_s: float, steps: int) -> Any:
    """A trainer of class `base` without verl's `__init__` (it builds GPU worker groups)."""
    trainer = object.__new__(base)
    trainer.config = config
    trainer.actor_rollout_wg = StubWorkerGroup(config.actor_rollout_ref.actor.checkpoint.async_save)
    trainer.use_critic = trainer.use_reference_policy = False
    trainer.train_dataloader = dataloader()
    trainer.global_steps, trainer.max_steps_duration = 0, 0.0
    trainer._cpu_steps, trainer._cpu_step_s, trainer._cpu_batch = steps, step_s, a_batch()
    return trainer


def run_legacy(config: Any, step_s: float, steps: int) -> None:
    from verl.trainer.ppo import ray_trainer

    fit = ray_trainer.RayPPOTrainer.fit
    real_fit = getattr(fit, "__wrapped__", fit)  # verl's own function, under any wrapper
    if real_fit.__code__.co_freevars:
        msg = f"RayPPOTrainer.fit has free variables {real_fit.__code__.co_freevars}"
        raise RuntimeError(msg)
    body = _legacy_fit_body if hasattr(ray_trainer, "should_save_ckpt_esi") else _legacy_fit_body_041
    real_fit.__code__ = body.__code__
    cpu_trainer(ray_trainer.RayPPOTrainer, config, step_s, steps).fit()


def run_v1(config: Any, step_s: float, steps: int, load: bool = False) -> None:
    from types import SimpleNamespace

    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import trainer_base

    try:  # 0.9.1 on; 0.9.0 has no checkpoint callback
        from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
    except ImportError:
        build_checkpoint_callback = None

    # The transfer queue needs its Ray actors; this loop puts nothing in it.
    trainer_base.tq = SimpleNamespace(kv_clear=lambda keys, partition_id: None)

    class StepShaped(trainer_base.PPOTrainer):
        def __init__(self) -> None:  # verl's __init__ builds GPU worker groups: not on CPU
            self.config = config
            if build_checkpoint_callback is not None:
                self.checkpoint_callback = build_checkpoint_callback(config)
            self.actor_rollout_wg = StubWorkerGroup()
            self.use_critic = self.use_reference_policy = False
            self.trainer_mode = "sync"
            self.train_dataloader = dataloader()
            self.global_steps = 0
            self.steps_per_epoch = self.total_training_steps = steps
            if hasattr(self, "_init_dump_executor"):
                self._init_dump_executor()
            if load:  # the end of verl's init_workers: load the checkpoint resume_mode points at
                self._load_checkpoint()

        def step(self, metrics: dict[str, Any], timing_raw: dict[str, Any]) -> Any:
            time.sleep(step_s)  # generation, log-probs, the actor update
            return KVBatchMeta(partition_id="train", keys=[], tags=[])

        def _compute_metrics(self, batch: Any, metrics: Any, timing_raw: Any, global_steps: int,
                             epoch: int) -> None:
            print(f"step {global_steps}", flush=True)

        def on_step_end(self) -> None:
            """The sync trainer syncs weights to the rollout here."""

        def on_sample_end(self) -> None:
            """Nothing sampled."""

    StepShaped().fit(agent_loop_manager=None)


def run_sync(config: Any, step_s: float, steps: int) -> None:
    """verl 0.8.0's `main_ppo_sync.PPOTrainer.fit`, real, with the step a sleep and TransferQueue,
    the replay buffer and the weight sync stubbed."""
    from types import SimpleNamespace

    from verl.trainer import main_ppo_sync

    main_ppo_sync.tq = SimpleNamespace(kv_clear=lambda keys, partition_id: None)
    batch = SimpleNamespace(keys=[], partition_id="train", meta_info={"global_token_num": [16]})

    class StepShaped(main_ppo_sync.PPOTrainer):
        def __init__(self) -> None:  # verl's __init__ builds GPU worker groups: not on CPU
            self.config = config
            self.actor_rollout_wg = StubWorkerGroup()
            self.checkpoint_manager = SimpleNamespace(update_weights=lambda *a, **k: None)
            self.replay_buffer = SimpleNamespace(remove=lambda *a, **k: None)
            self.use_critic = self.use_reference_policy = False
            self.train_dataloader = dataloader()
            self.global_steps = 0
            self.total_training_steps = steps
            self._init_dump_executor()

        def step(self, batch_dict: Any, metrics: dict[str, Any], timing_raw: dict[str, Any]) -> Any:
            time.sleep(step_s)
            return batch

        def _compute_metrics(self, batch: Any, metrics: Any, timing_raw: Any, global_steps: int,
                             epoch: int) -> None:
            # verl's reads the step's tensors from TransferQueue, then calls this module's
            # compute_throughout_metrics (main_ppo_sync.py:1570 in 0.8.0)
            main_ppo_sync.compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=1)
            print(f"step {global_steps}", flush=True)

    StepShaped().fit()


def run_recipe(config: Any, step_s: float, steps: int, boundary: bool) -> None:
    """A recipe's trainer: a RayPPOTrainer subclass defined outside verl, with its own `fit` that
    saves on `save_freq` only and never calls should_save_ckpt_esi; with `boundary`, it calls
    `compute_throughout_metrics` once a step (RayDAPOTrainer), without, nothing (RayPRIMETrainer)."""
    from verl.trainer.ppo.metric_utils import compute_throughout_metrics  # as recipe modules do
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    class RayRecipeTrainer(RayPPOTrainer):
        def fit(self) -> None:
            for started in self.recipe_steps():
                compute_throughout_metrics(batch=a_batch(), timing_raw={"step": time.monotonic() - started},
                                           n_gpus=1)
                self.step_done()

        def recipe_steps(self) -> Any:
            """The recipe's step, up to its metrics: the step (a sleep), verl's periodic save."""
            self.global_steps = 0
            self._load_checkpoint()
            self.global_steps += 1
            for _batch in self.train_dataloader:
                started = time.monotonic()
                time.sleep(step_s)
                if self.config.trainer.save_freq > 0 and (
                    self.global_steps >= steps or self.global_steps % self.config.trainer.save_freq == 0
                ):
                    self._save_checkpoint()
                yield started
                if self.global_steps > steps:
                    return

        def step_done(self) -> None:
            print(f"step {self.global_steps}", flush=True)
            self.global_steps += 1

    class RayPrimeShapedTrainer(RayRecipeTrainer):
        def fit(self) -> None:  # no boundary anywhere: only verl's periodic save
            for _started in self.recipe_steps():
                self.step_done()

    cpu_trainer(RayRecipeTrainer if boundary else RayPrimeShapedTrainer, config, step_s, steps).fit()


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
        elif loop == "v1":
            run_v1(config, step_s, steps, load=args.resume_mode is not None)
        elif loop == "sync":
            run_sync(config, step_s, steps)
        else:
            run_recipe(config, step_s, steps, boundary=loop == "recipe")


def from_main_ppo(overrides: list[str], args: argparse.Namespace) -> None:
    """`python3 -m verl.trainer.main_ppo KEY=VALUE ...`: what of it a CPU run takes."""
    import importlib.util

    given = dict(item.split("=", 1) for item in overrides if "=" in item)
    v1_exists = importlib.util.find_spec("verl.trainer.ppo.v1") is not None
    use_v1 = given.get("trainer.use_v1", str(v1_exists)).lower() == "true"
    args.loop = "v1" if use_v1 and v1_exists else "legacy"
    args.ckpt_dir = given.get("trainer.default_local_dir", "checkpoints")
    args.save_freq = int(given.get("trainer.save_freq", "-1"))
    args.steps = int(given.get("trainer.total_training_steps", str(args.steps)))
    args.resume_mode = given.get("trainer.resume_mode", "auto")
    args.pid_file = os.environ.get("VERL_DRIVER_PID_FILE", "taskrunner.pid")
    args.step_seconds = float(os.environ.get("VERL_DRIVER_STEP_SECONDS", args.step_seconds))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=["legacy", "v1", "sync", "recipe", "nosave"])
    parser.add_argument("--ckpt-dir")
    parser.add_argument("--step-seconds", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--save-freq", type=int, default=-1)
    parser.add_argument("--pid-file")
    parser.add_argument("--skip-ray-env-hook", action="store_true")
    parser.add_argument("--async-save", action="store_true", help="actor.checkpoint.async_save=True")
    parser.add_argument("--mlp-expiry-in", type=float, help="set verl's MLP_ expiry variable in the actor")
    parser.add_argument("--model-dir", help="actor_rollout_ref.model.path (a local model directory)")
    parser.add_argument("--resume-mode", choices=["auto", "disable"],
                        help="v1: trainer.resume_mode, and load the checkpoint as init_workers does")
    parser.add_argument("--main-ppo", nargs=argparse.REMAINDER, metavar="KEY=VALUE",
                        help="the overrides of `python3 -m verl.trainer.main_ppo`, instead of the flags")
    args = parser.parse_args()
    if args.main_ppo is not None:
        from_main_ppo(args.main_ppo, args)
    elif not (args.loop and args.ckpt_dir and args.pid_file):
        parser.error("--loop, --ckpt-dir and --pid-file are required (or --main-ppo)")
    # --skip-ray-env-hook: what `uv run` does to RAY_RUNTIME_ENV_HOOK (Ray ignores it)
    skip = {"_skip_env_hook": True} if args.skip_ray_env_hook else {}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**skip)
    else:
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=os.environ["RAY_TMPDIR"], **skip)
    runner = TaskRunner.remote()  # type: ignore[attr-defined]
    try:
        ray.get(runner.run.remote(args))
    except KeyboardInterrupt:
        print("driver: SIGINT, shutting Ray down", flush=True)
        raise


if __name__ == "__main__":
    main()
