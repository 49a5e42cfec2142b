"""verl: HybridFlow reinforcement-learning post-training for language models.

The public API is re-exported here and imported lazily, so ``import verl`` (and ``verl --version``)
stays fast: ``from verl import Controller, Role, DataChannel`` loads the control plane on first use,
``from verl import TrainerConfig, ActorRolloutRefWorker`` the config factory and the hybrid worker.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Controller": "verl.single_controller.flow",
    "DataChannel": "verl.single_controller.flow",
    "Role": "verl.single_controller.role",
    "StepError": "verl.single_controller.flow",
    "Worker": "verl.single_controller.worker",
    "register": "verl.single_controller.worker",
    "Dispatch": "verl.single_controller.dispatch",
    "DataProto": "verl.protocol",
    # the seeds' Python API (docs/python_api.md)
    "TrainerConfig": "verl.config.factory",
    "ActorRolloutRefWorker": "verl.workers.roles",
    "RLTrainer": "verl.trainer.rl_trainer",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'verl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
