"""verl's import path for its actor config, ``verl.workers.config``: a policy loss (or its test) written for
verl imports ``ActorConfig`` / ``PolicyLossConfig`` from here unchanged. They are the verl-shaped configs a
loss reads (`verl.algorithms.verl_config`), not this project's trainer schema (`verl.config.schema`); the
actor passes its `LossContext`, for which ``isinstance(config, ActorConfig)`` holds."""

from verl.algorithms.verl_config import VerlActorConfig as ActorConfig
from verl.algorithms.verl_config import VerlPolicyLossConfig as PolicyLossConfig

__all__ = ["ActorConfig", "PolicyLossConfig"]
