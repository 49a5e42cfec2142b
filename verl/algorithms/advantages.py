"""Advantage estimators, one registered function each.

Every estimator takes ``token_level_rewards`` and ``response_mask`` (batch, response_length) plus
whatever it needs by keyword (``index`` groups the samples of one prompt, ``values``, ``gamma``,
``lam``, ``epsilon``, ``norm_adv_by_std_in_grpo``, ``config``) and returns
``(advantages, returns)``, both (batch, response_length). The names and signatures are verl's, so
an estimator written for verl registers here unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from verl.utils.registry import Registry

ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator (algorithm.adv_estimator)")


def register_adv_est(name: str) -> Callable:
    """Decorator: make an estimator available as ``algorithm.adv_estimator=<name>``."""
    return ADV_ESTIMATOR_REGISTRY.register(name)


def get_adv_estimator_fn(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return ADV_ESTIMATOR_REGISTRY.lookup(name)


def _group_ids(index: Any) -> list:
    return index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: the group mean of the outcome reward is the baseline.

    r_i = Σ_t rewards[i, t];  A_i = (r_i − mean_g r) / (std_g r + ε)   (std: unbiased)
    or A_i = r_i − mean_g r with ``norm_adv_by_std_in_grpo=False`` (Dr.GRPO, arXiv 2503.20783).
    A group of one sample gets mean 0, std 1. A_i is broadcast over the response tokens.
    Shao et al. 2024, DeepSeekMath (arXiv 2402.03300).
    """
    scores = token_level_rewards.sum(dim=-1)
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, gid in enumerate(_group_ids(index)):
        groups[gid].append(i)
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    for members in groups.values():
        if len(members) > 1:
            group_scores = scores[members]
            mean[members] = group_scores.mean()
            std[members] = group_scores.std()
    advantages = scores - mean
    if norm_adv_by_std_in_grpo:
        advantages = advantages / (std + epsilon)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages
