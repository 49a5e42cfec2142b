"""Trainers: the RL loop (``RLTrainer``), the supervised warm start, and seed 001's ``PPOTrainer``."""

from typing import Any

__all__ = ["RLTrainer"]


def __getattr__(name: str) -> Any:
    # Lazy: `import verl.trainer.<module>` should not build the whole trainer import chain.
    if name == "RLTrainer":
        from verl.trainer.rl_trainer import RLTrainer

        return RLTrainer
    raise AttributeError(f"module 'verl.trainer' has no attribute {name!r}")
