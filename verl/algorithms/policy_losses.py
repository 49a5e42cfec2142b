"""Policy losses, one registered function each.

Every loss takes ``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask`` (batch,
response_length), ``loss_agg_mode``, ``config`` (the actor config: clip ratios ...) and
``rollout_is_weights`` (optional per-token importance weights), and returns
``(loss, metrics)``. Names and signatures are verl's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verl.algorithms.core import agg_loss, masked_mean
from verl.utils.registry import Registry

POLICY_LOSS_REGISTRY = Registry("policy loss (actor_rollout_ref.actor.policy_loss.loss_mode)")


def register_policy_loss(name: str) -> Callable:
    """Decorator: make a loss available as ``actor.policy_loss.loss_mode=<name>``."""
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    return POLICY_LOSS_REGISTRY.lookup(name)


def _cfg(config: Any, key: str, default: Any) -> Any:
    value = (
        None
        if config is None
        else getattr(config, key, None)
        if not isinstance(config, dict)
        else config.get(key)
    )
    return default if value is None else value


def agg_kwargs(config: Any) -> dict[str, Any]:
    """The aggregation settings a loss passes on to `agg_loss` (scale factor, global counts)."""
    return {
        "loss_scale_factor": _cfg(config, "loss_scale_factor", None),
        "global_num_tokens": _cfg(config, "global_num_tokens", None),
        "global_num_seqs": _cfg(config, "global_num_seqs", None),
    }


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO clipped surrogate with dual clip (Schulman et al. 2017, arXiv 1707.06347; Ye et al. 2019,
    arXiv 1912.09729).

    ρ = exp(logπ − logπ_old);  L_clip = max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high));
    for A < 0 the loss is further capped: L = min(L_clip, −c·A) with c = ``clip_ratio_c`` > 1.
    ε_low/ε_high default to ``clip_ratio``; ε_high > ε_low is DAPO's clip-higher.
    """
    clip_ratio = _cfg(config, "clip_ratio", 0.2)
    eps_low = _cfg(config, "clip_ratio_low", clip_ratio)
    eps_high = _cfg(config, "clip_ratio_high", clip_ratio)
    clip_c = _cfg(config, "clip_ratio_c", 3.0)
    if clip_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_c}")

    # Clamping the log-ratio keeps exp() finite when the policies are far apart.
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clip_losses = torch.maximum(losses_unclipped, losses_clipped)
    pg_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).float(), response_mask)

    dual_clip_losses = torch.minimum(clip_losses, -advantages * clip_c)
    pg_losses = torch.where(advantages < 0, dual_clip_losses, clip_losses)
    pg_clipfrac_lower = masked_mean(
        ((clip_losses > -advantages * clip_c) & (advantages < 0)).float(), response_mask
    )

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    metrics = {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }
    return loss, metrics
