"""``GRPOAdvantage``: the registered ``grpo`` advantage estimator as an object holding its settings.

The math is :func:`verl.algorithms.advantages.compute_grpo_outcome_advantage` (what
``algorithm.adv_estimator=grpo`` runs); this class only keeps ``epsilon`` and ``norm_adv_by_std_in_grpo``
so that a script can build the estimator once and call it per batch::

    from verl.algorithms.grpo import GRPOAdvantage

    advantages, returns = GRPOAdvantage()(token_level_rewards, response_mask, index)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from verl.algorithms.advantages import get_adv_estimator_fn


@dataclass(frozen=True)
class GRPOAdvantage:
    """Group-relative advantages: each response's total reward minus its group's mean, over the group's
    std unless ``norm_adv_by_std_in_grpo`` is False (Dr. GRPO); broadcast over the response tokens."""

    norm_adv_by_std_in_grpo: bool = True
    """divide by the group's reward std (``algorithm.norm_adv_by_std_in_grpo``)"""
    epsilon: float = 1e-6
    """added to the std before dividing"""

    name = "grpo"
    """the estimator's registry name (``algorithm.adv_estimator``)"""

    def __call__(
        self, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)``, both ``(batch, response_length)``. ``token_level_rewards`` and
        ``response_mask`` are ``(batch, response_length)``; ``index`` holds one group id per row (the
        samples of one prompt share it), e.g. a numpy array of uids or a list of ints."""
        estimator = get_adv_estimator_fn(self.name)
        return estimator(
            token_level_rewards=token_level_rewards,
            response_mask=response_mask,
            index=index,
            epsilon=self.epsilon,
            norm_adv_by_std_in_grpo=self.norm_adv_by_std_in_grpo,
        )
