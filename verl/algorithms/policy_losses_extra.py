"""Covariance-based (Clip-Cov, KL-Cov) and geometric-mean (GMPO) policy losses.

Split from `verl.algorithms.policy_losses`, which imports this module so that these losses are registered
(and importable from there) whenever the registry is; both import their shared parts from
`verl.algorithms.policy_loss_base`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.core import agg_loss, masked_mean
from verl.algorithms.policy_loss_base import (
    aggregate_pg_losses,
    batch_info,
    clip_range,
    register_policy_loss,
    resolve_config,
)


def _centered_cov(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token (A − mean A)·(logπ − mean logπ), means over the valid tokens, detached."""
    advantages, log_prob = advantages.detach(), log_prob.detach()
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    ρ = exp(clip(logπ − logπ_old, −20, 20));  L_t = max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high))·c_t.
    cov_t = (A_t − mean A)·(logπ_t − mean logπ) over the valid tokens (detached). Candidates are the
    valid tokens not already clipped by PPO with ``clip_cov_lb`` < cov_t < ``clip_cov_ub`` (1.0, 5.0);
    n = max(1, ⌊``clip_cov_ratio``·N_valid⌋) (ratio 2e-4) of them, drawn uniformly at random, get
    c_t = 0 (a detached mask: their loss and gradient vanish, they still count in the denominator);
    all other tokens have c_t = 1. High-covariance tokens are the ones whose updates collapse entropy.

    No dual clip (as verl). The draw uses ``torch.Generator().manual_seed(config.seed)`` when the
    context has a ``seed`` (the same seed draws the same permutation on every call: meant for tests), else
    torch's global RNG. Options are read from ``config.policy_loss``, where verl keeps them.
    Covariance and draw are per call, i.e. per micro-batch, as in verl.
    Metrics: ``actor/pg_clipfrac`` is, as in verl, the fraction of valid tokens whose gradient Clip-Cov
    removed (not the PPO clip fraction); ``actor/ppo_kl``.
    """
    config = resolve_config(config)
    eps_low, eps_high = clip_range(config)
    options = config.policy_loss
    clip_cov_ratio, clip_cov_lb, clip_cov_ub = (
        options.clip_cov_ratio,
        options.clip_cov_lb,
        options.clip_cov_ub,
    )
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)

    valid = response_mask > 0
    clipped_by_ppo = torch.gt(losses_clipped, losses_unclipped).detach()
    cov = _centered_cov(advantages, log_prob, response_mask)
    candidates = torch.nonzero(valid & ~clipped_by_ppo & (cov > clip_cov_lb) & (cov < clip_cov_ub))
    keep = torch.ones_like(ratio, dtype=torch.bool)
    if len(candidates) > 0:
        num_clip = min(max(int(clip_cov_ratio * valid.sum().item()), 1), len(candidates))
        seed = getattr(config, "seed", None)
        generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:num_clip].to(cov.device)]
        keep[chosen[:, 0], chosen[:, 1]] = False
    corr = keep.to(ratio.dtype)  # built without autograd: a constant 0/1 factor
    pg_clipfrac = masked_mean((~keep).float(), response_mask)

    pg_losses = torch.maximum(losses_unclipped, losses_clipped) * corr
    loss = aggregate_pg_losses(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, {"actor/pg_clipfrac": pg_clipfrac.item(), "actor/ppo_kl": ppo_kl.item()}


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617).

    Δ = logπ − logπ_old;  ρ = exp(clip(Δ, −20, 20));  L_t = −A·ρ (no clipping) for every token, and
    L_t = −A·ρ + ``ppo_kl_coef``·|Δ| for the k tokens with the largest centered covariance
    cov_t = (A_t − mean A)·(logπ_t − mean logπ) (valid tokens, detached),
    k = max(1, ⌊``kl_cov_ratio``·N_valid⌋) with ``kl_cov_ratio`` = 2e-4.

    ``ppo_kl_coef`` defaults to 0.1, verl 0.9.1's (its YAML and the paper's recipes; older verl code
    defaulted to 1.0). |Δ| uses the unclamped log-ratio, so the penalty keeps pulling far-off tokens back.
    Options are read from ``config.policy_loss``, where verl keeps them. Selection is per
    call, i.e. per micro-batch, as in verl. Aggregated by ``loss_agg_mode``.
    Metrics: ``actor/ppo_kl`` is, as in verl, the masked mean of |Δ| (not of −Δ); no clip fraction.
    """
    config = resolve_config(config)
    kl_cov_ratio, ppo_kl_coef = config.policy_loss.kl_cov_ratio, config.policy_loss.ppo_kl_coef
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")

    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(torch.clamp(negative_approx_kl, min=-20.0, max=20.0))
    losses_plain = -advantages * ratio
    losses_kl = losses_plain + ppo_kl_coef * abs_kl

    valid = response_mask > 0
    selected = torch.zeros_like(valid)
    num_valid = int(valid.sum().item())
    if num_valid > 0:
        k = min(max(1, int(kl_cov_ratio * num_valid)), num_valid)
        cov = _centered_cov(advantages, log_prob, response_mask)
        flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        top = torch.topk(cov.reshape(-1)[flat_valid], k).indices
        selected.view(-1)[flat_valid[top]] = True
    pg_losses = torch.where(selected, losses_kl, losses_plain)
    ppo_kl_abs = masked_mean(abs_kl, response_mask)

    loss = aggregate_pg_losses(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return loss, {"actor/ppo_kl": ppo_kl_abs.item()}


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673).

    Δ = clip(logπ − logπ_old, −20, 20) (verl leaves Δ unclamped: the same numbers while |Δ| < 20);  per token, sign-aware (pessimistic) clipping in log space:
    Δ̃ = sgn(A)·min(sgn(A)·Δ, sgn(A)·clip(Δ, −ε_low, ε_high)), i.e. Δ is capped at ε_high when A > 0
    and floored at −ε_low when A < 0 (the other side is left alone, as in PPO);
    r_i = exp(mean_t Δ̃_i,t) (the geometric mean of the token ratios);  Ā_i = mean_t A_i,t;
    L = mean_i(−Ā_i·r_i).

    The paper writes the objective as (Π_t |min(ρ_t·A, clip(ρ_t)·A)|)^(1/|y|)·sgn(A); for a
    sequence-level A this is A·exp(mean_t Δ̃) above, so advantages are expected to be constant within a
    sequence (GRPO-style). ε are log-space bounds: ``clip_ratio_low``/``clip_ratio_high`` falling back to
    ``clip_ratio`` (the paper's range is (e^−0.4, e^0.4); verl's GMPO recipe sets
    clip_ratio_low = clip_ratio_high = 0.4 explicitly — an actor config with the PPO ``clip_ratio`` 0.2
    gives 0.2 unless they are set). ``loss_agg_mode`` is ignored: the loss is a mean over sequences; with
    ``global_batch_info`` it is Σ_i L_i / ``global_batch_size`` · ``dp_size`` (verl takes the mean over the
    call's rows whatever the global counts say: the same number when each rank's micro-batch is the whole of
    its equal share of the mini-batch, and micro-batch invariant here when it is not). ``rollout_is_weights`` enter per sequence as the
    geometric mean of the token weights, as in verl.
    Metrics: ``actor/pg_clipfrac`` / ``actor/pg_clipfrac_lower``: fraction of valid tokens whose
    log-ratio was actually clipped with A > 0 / A < 0 (verl counts tokens outside the range even on
    the unclipped side); ``actor/ppo_kl``.
    """
    config = resolve_config(config)
    eps_low, eps_high = clip_range(config)

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    sgn = torch.sign(advantages)
    clamped = torch.clamp(negative_approx_kl, -eps_low, eps_high)
    log_ratio = sgn * torch.minimum(sgn * negative_approx_kl, sgn * clamped)

    seq_ratio = torch.exp(masked_mean(log_ratio, response_mask, dim=-1))
    seq_advantage = masked_mean(advantages, response_mask, dim=-1)
    pg_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights + 1e-10)
        pg_losses = pg_losses * torch.exp(masked_mean(log_w, response_mask, dim=-1))
    # One "token" per sequence: seq-mean-token-sum gives Σ_i L_i / G · D (G = the global batch size, or
    # this call's rows; D = dp_size).
    info = batch_info(config)
    loss = agg_loss(
        pg_losses.unsqueeze(-1),
        torch.ones_like(pg_losses).unsqueeze(-1),
        "seq-mean-token-sum",
        dp_size=info.get("dp_size", 1),
        global_batch_size=info.get("global_batch_size"),
    )

    clipped = (log_ratio != negative_approx_kl).float()
    pg_clipfrac = masked_mean(clipped * (advantages > 0).float(), response_mask)
    pg_clipfrac_lower = masked_mean(clipped * (advantages < 0).float(), response_mask)
    metrics = {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.item(),
    }
    return loss, metrics
