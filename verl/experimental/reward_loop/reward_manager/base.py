"""``RewardManagerBase``: verl 0.8+'s base class of a reward-loop manager (``verl.experimental.reward_loop.
reward_manager.base``), with verl's constructor and attributes, for subclasses written against verl."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

RawRewardFn = Callable[..., Any] | None


class RewardManagerBase(ABC):
    """Scores one sample at a time: ``await run_single(data)`` with ``data`` a one-row DataProto returns
    ``{"reward_score": float, "reward_extra_info": dict}``. Built ``cls(config=, tokenizer=, compute_score=)``;
    ``self.loop`` is the event loop ``run_single`` runs on (for ``self.loop.run_in_executor``)."""

    _class_initialized = False

    def __init__(self, config: Any, tokenizer: Any, compute_score: RawRewardFn) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.loop = asyncio.new_event_loop()
        self.init_class(config, tokenizer)

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any) -> None:
        """State shared by every instance of the class, set up once (verl's hook)."""
        if cls._class_initialized:
            return
        cls._class_initialized = True

    @abstractmethod
    async def run_single(self, data: Any) -> dict[str, Any]:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:  # an event loop does not pickle (Ray ships managers)
        state = dict(self.__dict__)
        state.pop("loop", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.loop = asyncio.new_event_loop()
