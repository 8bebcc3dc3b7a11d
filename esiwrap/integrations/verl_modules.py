"""The verl modules whose names the verl hook patches (`esiwrap.integrations.verl`)."""

VERL_LEGACY_MODULES = (  # RayPPOTrainer.fit, and the trainers built on it or shaped like it
    "verl.trainer.ppo.ray_trainer",
    "verl.experimental.separation.ray_trainer",
    "verl.experimental.fully_async_policy.fully_async_trainer",
    "verl.trainer.main_ppo_sync",  # verl 0.8.0: PPOTrainer, where main_ppo's deprecation points
)
VERL_V1_MODULE = "verl.trainer.ppo.v1.trainer_base"  # PPOTrainer, the default loop (0.9)
# Every PPO loop of every verl (0.4.1 on), recipes included, calls this once a step, after the
# update and after verl's own periodic save: the step boundary where no other one is called.
VERL_METRICS_MODULE = "verl.trainer.ppo.metric_utils"
VERL_TRAINER_MODULES = (*VERL_LEGACY_MODULES, VERL_V1_MODULE, VERL_METRICS_MODULE)
