"""verl's ``verl.workers.reward_manager`` import path (its classic reward managers): ``register`` /
``get_reward_manager_cls``, the ``AbstractRewardManager`` base class and the built-in managers. A class written
for it, built ``cls(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)`` and called
``manager(data, return_dict)``, is run by the reward workers as verl runs it (verl.workers.reward.verl_shapes)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from verl.experimental.reward_loop.reward_manager import register
from verl.workers.reward.batch import BatchRewardManager
from verl.workers.reward.dapo import DAPORewardManager
from verl.workers.reward.limited import RateLimitedRewardManager
from verl.workers.reward.manager import NaiveRewardManager, get_reward_manager_cls


class AbstractRewardManager(ABC):
    """verl's base class of a classic reward manager (its constructor and ``__call__``)."""

    @abstractmethod
    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Any,
        reward_fn_key: str = "data_source",
        **kwargs: Any,
    ) -> None: ...

    @abstractmethod
    def __call__(self, data: Any, return_dict: bool = False) -> Any: ...


__all__ = [
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "RateLimitedRewardManager",
    "get_reward_manager_cls",
    "register",
]
