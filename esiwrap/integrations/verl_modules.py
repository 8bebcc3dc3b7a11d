"""The verl modules whose names the verl hook patches (`esiwrap.integrations.verl`)."""

VERL_LEGACY_MODULES = (  # RayPPOTrainer.fit, and the experimental trainers built on it
    "verl.trainer.ppo.ray_trainer",
    "verl.experimental.separation.ray_trainer",
    "verl.experimental.fully_async_policy.fully_async_trainer",
)
VERL_V1_MODULE = "verl.trainer.ppo.v1.trainer_base"  # PPOTrainer, the default loop
VERL_TRAINER_MODULES = (*VERL_LEGACY_MODULES, VERL_V1_MODULE)
