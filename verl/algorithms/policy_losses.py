"""Policy losses, one registered function each.

Every loss takes ``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask`` (batch,
response_length), ``loss_agg_mode``, ``config`` (verl's ``ActorConfig`` or anything shaped like it, e.g. a
`LossContext`: clip ranges, ``global_batch_info``, loss options; None = the defaults) and
``rollout_is_weights`` (optional per-token importance weights), and returns ``(loss, metrics)``: names,
signatures, return shapes and metric names are verl 0.9's (``verl/trainer/ppo/core_algos.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.core import masked_mean
from verl.algorithms.policy_loss_base import (
    POLICY_LOSS_REGISTRY,
    LossContext,
    aggregate_pg_losses,
    clip_range,
    get_policy_loss_fn,
    register_policy_loss,
    resolve_config,
    sapo_taus,
)

# Clip-Cov, KL-Cov and GMPO live in a second module (importing it registers them); it imports only
# the shared base, never this module.
from verl.algorithms.policy_losses_extra import (
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_kl_cov,
)


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
    config = resolve_config(config)
    (eps_low, eps_high), clip_c = clip_range(config), getattr(config, "clip_ratio_c", 3.0)
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

    loss = aggregate_pg_losses(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }
    return loss, metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071).

    Δ = logπ − logπ_old;  s_i = mean_t Δ_i,t over the valid tokens of sequence i (the log of the
    length-normalised sequence ratio (π(y_i)/π_old(y_i))^(1/|y_i|));
    token log-ratio l_i,t = sg(s_i) + logπ_i,t − sg(logπ_i,t), clamped ≤ 10;  r_i,t = exp(l_i,t);
    L_i,t = max(−A·r_i,t, −A·clip(r_i,t, 1−ε_low, 1+ε_high)).

    Every token of sequence i has the value r_i,t = exp(s_i), so clipping acts per sequence, while the
    gradient w.r.t. logπ_i,t is −A·exp(s_i) (the paper's GSPO-token form): the sequence ratio weighs
    each token's log-likelihood gradient. With a per-sequence advantage this equals GSPO.

    The loss is always aggregated with ``seq-mean-token-mean`` (the paper's 1/G Σ_i 1/|y_i| Σ_t),
    whatever ``loss_agg_mode`` says, as in verl; the global batch size in ``global_batch_info`` is still
    honoured. Metrics: ``actor/pg_clipfrac`` (fraction of tokens whose clipped branch is taken),
    ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (0, as verl).
    """
    config = resolve_config(config)
    eps_low, eps_high = clip_range(config)
    negative_approx_kl = log_prob - old_log_prob
    seq_log_ratio = masked_mean(negative_approx_kl, response_mask, dim=-1)  # s_i, (batch,)
    log_ratio = seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))

    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg_losses = torch.maximum(losses_unclipped, losses_clipped)
    pg_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).float(), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    loss = aggregate_pg_losses(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    metrics = {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}
    return loss, {**metrics, "actor/pg_clipfrac_lower": 0.0}


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347).

    ρ = exp(clip(logπ − logπ_old, −20, 20));  τ = ``tau_pos`` (1.0) where A > 0, else ``tau_neg`` (1.05);
    f(ρ) = σ(τ·(ρ − 1))·4/τ;  L = −f(ρ)·A.

    The soft gate replaces the hard clip: at ρ = 1 the gradient w.r.t. logπ is exactly −A (like the
    policy gradient, since f'(1)·1 = 4·σ(0)(1−σ(0)) = 1) and it decays smoothly as ρ leaves 1; a larger
    τ for negative advantages damps them faster. The loss is always aggregated with
    ``seq-mean-token-mean`` (as verl and the paper's per-sequence average), whatever ``loss_agg_mode``
    says; the global batch size in ``global_batch_info`` is still honoured. Metrics: ``actor/ppo_kl``;
    ``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower`` are 0 (no clipping to report), as verl.
    """
    config = resolve_config(config)
    tau_pos, tau_neg = sapo_taus(config)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gates * advantages
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    loss = aggregate_pg_losses(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return loss, {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": ppo_kl.item(), "actor/pg_clipfrac_lower": 0.0}


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GPG, Group Policy Gradient (Chu et al. 2025, arXiv 2504.02546).

    L = −logπ·A: the plain REINFORCE surrogate, no importance ratio and no clipping (GPG argues the
    surrogate is unnecessary on-policy). Aggregated by ``loss_agg_mode``.
    Metrics: ``actor/ppo_kl`` (mean of logπ_old − logπ, for monitoring only; the loss ignores it; verl
    returns no metrics for GPG).
    """
    pg_losses = -log_prob * advantages
    ppo_kl = masked_mean(-(log_prob - old_log_prob), response_mask)

    config = resolve_config(config)
    loss = aggregate_pg_losses(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, {"actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585).

    ρ = exp(clip(logπ − logπ_old, −20, 20));  L = −sg(clip(ρ, 1−ε_low, 1+ε_high))·A·logπ.

    The importance weight is clipped and detached, so every token keeps a gradient (−w·A w.r.t.
    logπ) — unlike PPO, which drops clipped tokens; the weight only bounds its size. Aggregated by
    ``loss_agg_mode`` (the paper normalises by the token count: ``token-mean``).
    Metrics: ``actor/pg_clipfrac`` (fraction of tokens whose weight was clipped, either side),
    ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (0, as verl).
    """
    config = resolve_config(config)
    eps_low, eps_high = clip_range(config)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    loss = aggregate_pg_losses(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}
    return loss, {**metrics, "actor/pg_clipfrac_lower": 0.0}


__all__ = [
    "POLICY_LOSS_REGISTRY",
    "LossContext",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "get_policy_loss_fn",
    "register_policy_loss",
]
