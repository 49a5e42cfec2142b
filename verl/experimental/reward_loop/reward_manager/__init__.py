"""verl 0.8+'s reward-loop managers: subclass :class:`RewardManagerBase`, implement ``async run_single``, and
register the class with ``@register("name")``; ``reward_model.reward_manager=name`` (verl's
``reward.reward_manager.name``) then selects it. The registry is this repository's
(``verl.workers.reward.REWARD_MANAGERS``), so the built-in managers (naive, batch, dapo, limited) are listed too."""

from __future__ import annotations

from collections.abc import Callable

from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.workers.reward.manager import REWARD_MANAGERS, get_reward_manager_cls


def register(name: str) -> Callable[[type], type]:
    """Class decorator (verl's): select the class with ``reward_model.reward_manager=name``. Registering another
    class under a taken name raises; the same class again (its file imported a second time) replaces it."""

    def decorator(cls: type) -> type:
        known = REWARD_MANAGERS.get(name)
        same = known is not None and (known.__module__, known.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        return REWARD_MANAGERS.register(name, overwrite=same)(cls)

    return decorator


__all__ = ["RewardManagerBase", "get_reward_manager_cls", "register"]
