"""Masked reductions and loss aggregation shared by every estimator and loss.

All tensors are (batch, response_length); `mask` is 1 on real response tokens, 0 on padding.
"""

from __future__ import annotations

import math

import torch

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (values * mask).sum() if dim is None else (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the positions where mask is 1 (0 when the mask is empty, rather than NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp_min(1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n > 1:
            var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / std over the masked positions, the batch-level normalisation of PPO advantages."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def anneal(start: float, final: float, progress: float, schedule: str = "linear") -> float:
    """A coefficient moved from ``start`` to ``final`` as training ``progress`` goes from 0 to 1.

    linear: start + (final − start)·p;  cosine: final + (start − final)·½(1 + cos πp).
    Used for the clip-ratio schedule (e.g. 0.2 → 0.05: wide steps early, conservative late).
    """
    p = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return start + (final - start) * p
    if schedule == "cosine":
        return final + (start - final) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown schedule {schedule!r}; choose linear or cosine")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    loss_scale_factor: float | None = None,
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar; verl's signature and numbers.

    With N = ``batch_num_tokens`` (valid tokens of the global mini-batch), G = ``global_batch_size``
    (its sequences), D = ``dp_size`` and m the mask:

    - ``token-mean``: Σ_{i,t} m·L / N · D  (DAPO; every token weighs the same)
    - ``token-sum``: Σ_{i,t} m·L · D
    - ``seq-mean-token-sum``: Σ_i Σ_t m·L / G · D
    - ``seq-mean-token-mean``: Σ_i (Σ_t m·L / Σ_t m) / G · D  (original GRPO)
    - ``seq-mean-token-sum-norm``: Σ_i Σ_t m·L / G · D / C with C = ``loss_scale_factor`` or the
      response length (Dr.GRPO, arXiv 2503.20783: a constant divisor removes the length bias)

    Without global counts N and G are this call's own: its valid tokens and its sequences with at least one
    valid token (as verl; with D > 1 they are required). With them, the losses of the micro-batches of a
    mini-batch add up to the mini-batch's loss, so the gradient does not depend on how it was split; the
    factor D undoes the gradient averaging of data parallelism (each rank's loss is its share of the sum).

    ``global_num_tokens`` / ``global_num_seqs`` are this project's names for N and G, for callers that
    scale by the world size themselves (the critic): give one name of each pair, not both.
    """
    if global_num_tokens is not None:
        if batch_num_tokens is not None:
            raise ValueError("give batch_num_tokens or global_num_tokens, not both")
        batch_num_tokens = global_num_tokens
    if global_num_seqs is not None:
        if global_batch_size is not None:
            raise ValueError("give global_batch_size or global_num_seqs, not both")
        global_batch_size = global_num_seqs
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of {LOSS_AGG_MODES}")
    loss_mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            _require_global(dp_size, "batch_num_tokens")
            batch_num_tokens = loss_mask.sum().clamp_min(1.0)
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    tokens_per_seq = loss_mask.sum(-1)
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)
    if global_batch_size is None:
        _require_global(dp_size, "global_batch_size")
        global_batch_size = (tokens_per_seq > 0).sum().clamp_min(1).to(loss_mat.dtype)
    if loss_agg_mode == "seq-mean-token-mean":
        return (seq_sums / tokens_per_seq.clamp_min(1.0)).sum() / global_batch_size * dp_size
    loss = seq_sums.sum() / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mat.shape[-1])
    return loss


def _require_global(dp_size: int, name: str) -> None:
    if dp_size > 1:
        raise ValueError(f"agg_loss: the global {name} is required when dp_size > 1")


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    **agg_kwargs: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped PPO value loss (Schulman et al. 2017, arXiv 1707.06347).

    v̂_clip = clip(v̂, v_old − c, v_old + c);  L_V = ½·agg(max((v̂ − R)², (v̂_clip − R)²)).
    Returns the loss and the fraction of tokens where the clipped term was the larger (vf_clipfrac).
    """
    vpred_clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, **agg_kwargs)
    # Inside the clip range vpred_clipped equals vpreds only up to rounding, so "clipped > unclipped" alone
    # would count tokens by their last bit; a token counts only when its prediction was really clipped.
    really_clipped = (vpreds - values).abs() > cliprange_value
    vf_clipfrac = masked_mean((torch.gt(clipped, unclipped) & really_clipped).float(), response_mask)
    return vf_loss, vf_clipfrac
