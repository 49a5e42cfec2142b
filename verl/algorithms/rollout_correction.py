"""Rollout correction: importance weights and rejection for samples drawn by a policy other than π_old.

The rollout engine samples from π_rollout: other kernels and precision than the trainer (vLLM, bf16), or
older weights (asynchronous training). With ``log r = log π_train − log π_rollout`` per token, verl's
``algorithm.rollout_correction`` offers (Yao et al. 2025, "Your efficient RL framework secretly brings
you off-policy RL training"; Liu et al. 2025, "When speed kills stability", for the sequence-level
forms and the geometric-mean rejection):

* **Truncated IS** (``rollout_is``): per token ``w_t = min(r_t, U)`` ("token", TIS), or per sequence
  ``w = min(Π_t r_t, U)`` broadcast over its tokens ("sequence", MIS). With a ``"L_U"`` threshold the weight
  is kept inside [L, U] and set to 0 outside it (IcePop). Weights are detached: they scale the policy
  loss, they are not trained through.
* **Rejection** (``rollout_rs``): tokens or whole sequences whose divergence statistic leaves its bounds
  are dropped from ``response_mask``. Per token ``k1 = −log r``, ``k2 = ½(log r)²``,
  ``k3 = r − 1 − log r``; sequences use their sum, mean or max. k1 bounds are ratios ``"L_U"`` compared
  in log space; k2 / k3 bounds are one upper value.
* **Diagnostics** (always): perplexities of both policies, KL estimates and χ² of the weights.

Pure tensor math; the trainer calls :func:`compute_rollout_correction` once per batch (decoupled mode),
the ``bypass_mode`` loss calls it per micro-batch against the current policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from verl.algorithms.core import masked_mean, masked_sum

SAFETY_BOUND = 20.0
"""log-ratios are clamped to ±20 before exp(), so a weight never overflows"""

IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
PREFIX = "rollout_corr/"


@dataclass(frozen=True)
class Bounds:
    """A threshold parsed: ``upper``, and ``lower`` (None for a one-sided TIS / k2 / k3 bound)."""

    upper: float
    lower: float | None = None


def correction_enabled(config: Any) -> bool:
    """Whether ``algorithm.rollout_correction`` reweights or rejects anything (else it only measures)."""
    return bool(
        config.bypass_mode
        or config.rollout_rs is not None
        or (config.rollout_is is not None and config.rollout_is_threshold is not None)
    )


def parse_is_threshold(value: Any) -> Bounds:
    """``rollout_is_threshold``: a number U (truncate at U) or ``"L_U"`` (IcePop: zero outside [L, U])."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(
            f"algorithm.rollout_correction.rollout_is_threshold={value!r}: a number or 'lower_upper'"
        )
    if isinstance(value, str) and "_" in value:
        lower, upper = (_number("rollout_is_threshold", part, value) for part in value.split("_", 1))
        return _checked("rollout_is_threshold", value, Bounds(upper, lower))
    return _checked("rollout_is_threshold", value, Bounds(_number("rollout_is_threshold", value, value)))


def parse_rs_options(value: Any) -> list[str]:
    """``rollout_rs``: a comma-separated list of :data:`RS_OPTIONS` (duplicates dropped, order kept)."""
    if not isinstance(value, str):
        raise ValueError(f"algorithm.rollout_correction.rollout_rs={value!r}: a comma-separated string")
    options = list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    if not options:
        raise ValueError("algorithm.rollout_correction.rollout_rs names no option")
    for option in options:
        if option not in RS_OPTIONS:
            raise ValueError(
                f"algorithm.rollout_correction.rollout_rs: unknown option {option!r}; choose from {', '.join(RS_OPTIONS)}"
            )
    return options


def parse_rs_thresholds(options: list[str], value: Any) -> list[Bounds]:
    """``rollout_rs_threshold``: one entry for all options or one per option, comma-separated.

    k1 options take ratio bounds ``"L_U"`` (a bare U means L = 1/U); k2 / k3 options one upper bound.
    """
    if value is None:
        raise ValueError(
            "algorithm.rollout_correction.rollout_rs is set: rollout_rs_threshold must be given too"
        )
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"algorithm.rollout_correction.rollout_rs_threshold={value!r}: a number or a string")
    entries = [part.strip() for part in str(value).split(",")] if isinstance(value, str) else [str(value)]
    if len(entries) == 1:
        entries = entries * len(options)
    if len(entries) != len(options):
        raise ValueError(
            f"algorithm.rollout_correction.rollout_rs_threshold has {len(entries)} entries for {len(options)} "
            f"options ({', '.join(options)}): give one for all or one per option"
        )
    bounds = []
    for option, entry in zip(options, entries, strict=True):
        if option.endswith("k1"):
            if "_" in entry:
                lower, upper = (_number("rollout_rs_threshold", part, value) for part in entry.split("_", 1))
            else:
                upper = _number("rollout_rs_threshold", entry, value)
                if 0 < upper < 1:
                    raise ValueError(
                        f"algorithm.rollout_correction.rollout_rs_threshold={value!r} for {option}: one k1 bound is "
                        f"the upper ratio U (the lower is 1/U), so it must be >= 1. For a 'lower_upper' pair quote "
                        "it (YAML reads an unquoted 0.5_2 as the number 0.52)"
                    )
                lower = 1.0 / upper if upper > 0 else upper
            bounds.append(_checked("rollout_rs_threshold", value, Bounds(upper, lower)))
        else:
            if "_" in entry:
                raise ValueError(
                    f"algorithm.rollout_correction.rollout_rs_threshold entry {entry!r} for {option}: "
                    "k2 / k3 statistics take one upper bound, not 'lower_upper'"
                )
            bounds.append(
                _checked("rollout_rs_threshold", value, Bounds(_number("rollout_rs_threshold", entry, value)))
            )
    return bounds


def _number(key: str, text: Any, whole: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError(f"algorithm.rollout_correction.{key}={whole!r}: {text!r} is not a number") from None


def _checked(key: str, whole: Any, bounds: Bounds) -> Bounds:
    if bounds.upper <= 0 or (bounds.lower is not None and bounds.lower <= 0):
        raise ValueError(f"algorithm.rollout_correction.{key}={whole!r}: bounds must be > 0")
    if bounds.lower is not None and bounds.lower > bounds.upper:
        raise ValueError(f"algorithm.rollout_correction.{key}={whole!r}: lower bound above the upper")
    return bounds


# ----------------------------------------------------------------------------------------------
# Importance weights
# ----------------------------------------------------------------------------------------------


def rollout_is_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    bounds: Bounds,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Detached importance weights (batch, T), 0 on padding, and their metrics.

    token:    w_t = exp(clamp(log r_t, ±20));   sequence: w = exp(clamp(Σ_t log r_t, ±20)) on every token.
    TIS: w ← min(w, U).  IcePop (``bounds.lower`` set): w ← w if L ≤ w ≤ U else 0.
    ``batch_normalize`` then divides by the batch mean (of tokens, or of sequences' weights), after the
    bounding, so a normalised weight may exceed U. Metrics describe the weights before normalisation.
    """
    mask = mask.to(log_ratio.dtype)
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        log_seq = None
    elif level == "sequence":
        log_seq = masked_sum(log_ratio, mask, dim=-1)
        raw = torch.exp(log_seq.clamp(-SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1).expand_as(log_ratio)
    else:
        raise ValueError(f"algorithm.rollout_correction.rollout_is={level!r}: choose token, sequence or null")
    raw = raw * mask
    if bounds.lower is None:
        weights = raw.clamp(max=bounds.upper)
    else:
        inside = (raw >= bounds.lower) & (raw <= bounds.upper)
        weights = torch.where(inside, raw, torch.zeros_like(raw))
    weights = weights.detach()
    metrics = _is_metrics(weights, raw, log_seq, mask, bounds)
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            valid = mask.sum(-1) > 0
            mean = masked_mean(weights, mask, dim=-1)[valid].mean() if valid.any() else weights.new_zeros(())
        factor = float(mean)
        if factor > 1e-8:
            weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
    return weights, metrics


def _is_metrics(
    weights: torch.Tensor, raw: torch.Tensor, log_seq: torch.Tensor | None, mask: torch.Tensor, bounds: Bounds
) -> dict[str, float]:
    valid = mask.bool()
    lower = bounds.lower if bounds.lower is not None else 1.0 / bounds.upper
    metrics: dict[str, float] = {"rollout_is_mean": float(masked_mean(weights, mask))}
    if log_seq is None:
        metrics["rollout_is_max"] = float(weights[valid].max())
        metrics["rollout_is_min"] = float(weights[valid].min())
        metrics["rollout_is_ratio_fraction_high"] = float(
            masked_mean((raw > bounds.upper).to(mask.dtype), mask)
        )
        metrics["rollout_is_ratio_fraction_low"] = float(masked_mean((raw < lower).to(mask.dtype), mask))
    else:
        metrics["rollout_is_max"] = math.exp(min(float(log_seq.max()), SAFETY_BOUND))
        metrics["rollout_is_min"] = math.exp(max(float(log_seq.min()), -SAFETY_BOUND))
        metrics["rollout_is_ratio_fraction_high"] = float((log_seq > math.log(bounds.upper)).float().mean())
        metrics["rollout_is_ratio_fraction_low"] = float((log_seq < math.log(lower)).float().mean())
    clipped = weights.clamp(0.0, bounds.upper)
    mean = masked_mean(clipped, mask)
    metrics["rollout_is_std"] = float((masked_mean(clipped**2, mask) - mean**2).clamp_min(0).sqrt())
    metrics["rollout_is_eff_sample_size"] = float(1.0 / masked_mean((clipped / (mean + 1e-8)) ** 2, mask))
    per_seq = masked_mean(weights, mask, dim=-1)
    metrics["rollout_is_seq_mean"] = float(per_seq.mean())
    metrics["rollout_is_seq_max"] = float(per_seq.max())
    metrics["rollout_is_seq_min"] = float(per_seq.min())
    metrics["rollout_is_seq_std"] = float(per_seq.std()) if len(per_seq) > 1 else 0.0
    if bounds.lower is not None:
        outside = (raw < bounds.lower) | (raw > bounds.upper)
        metrics["rollout_is_oob_ratio"] = float(masked_mean(outside.to(mask.dtype), mask))
    return metrics


# ----------------------------------------------------------------------------------------------
# Rejection
# ----------------------------------------------------------------------------------------------


def rollout_rejection_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, options: list[str], bounds: list[Bounds]
) -> tuple[torch.Tensor, dict[str, float]]:
    """``mask`` with the rejected tokens (token options) or sequences (seq options) set to 0.

    A token is kept when every option keeps it. k1 options keep ``log L ≤ stat ≤ log U``; k2 / k3 keep
    ``stat ≤ U``. Sequence statistics: ``seq_sum`` Σ_t, ``seq_mean`` the masked mean, ``seq_max`` the max.
    """
    float_mask = mask.to(log_ratio.dtype)
    valid = float_mask.bool()
    clamped = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    statistics = {"k1": -clamped, "k2": 0.5 * clamped**2, "k3": torch.exp(clamped) - 1.0 - clamped}
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for option, bound in zip(options, bounds, strict=True):
        scope, kind = option.rsplit("_", 1)
        stat = statistics[kind]
        if scope == "seq_sum":
            stat = masked_sum(stat, float_mask, dim=-1).unsqueeze(-1).expand_as(clamped)
        elif scope == "seq_mean":
            stat = masked_mean(stat, float_mask, dim=-1).unsqueeze(-1).expand_as(clamped)
        elif scope == "seq_max":
            stat = torch.where(valid, stat, torch.zeros_like(stat)).amax(-1, keepdim=True).expand_as(clamped)
        keep = stat <= (math.log(bound.upper) if kind == "k1" else bound.upper)
        if kind == "k1":
            keep &= stat >= math.log(bound.lower)
        keep_all &= keep
        rejected = (~keep & valid).to(log_ratio.dtype)
        name = f"rollout_rs_{option}"
        metrics[f"{name}_mean"] = float(masked_mean(stat, float_mask))
        metrics[f"{name}_max"] = float(stat[valid].max())
        metrics[f"{name}_min"] = float(stat[valid].min())
        metrics[f"{name}_masked_fraction"] = float(masked_mean(rejected, float_mask))
        metrics[f"{name}_seq_masked_fraction"] = _seq_fraction(rejected, valid)
    rejected = (~keep_all & valid).to(log_ratio.dtype)
    metrics["rollout_rs_masked_fraction"] = float(masked_mean(rejected, float_mask))
    metrics["rollout_rs_seq_masked_fraction"] = float((rejected.sum(-1) > 0).float().mean())
    return (mask * keep_all).to(mask.dtype), metrics


def _seq_fraction(rejected: torch.Tensor, valid: torch.Tensor) -> float:
    """The share of non-empty sequences with at least one rejected token."""
    nonempty = valid.any(-1)
    if not nonempty.any():
        return 0.0
    return float((rejected.sum(-1) > 0)[nonempty].float().mean())


# ----------------------------------------------------------------------------------------------
# Diagnostics and the entry point
# ----------------------------------------------------------------------------------------------


def offpolicy_metrics(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far π_rollout is from π_train on the sampled tokens.

    ppl = mean_i exp(−mean_t log π); kl = mean_t (log π_rollout − log π_train) (a direct KL(π_rollout‖π_train)
    estimate, can be negative); k3_kl = mean_t (r − 1 − log r); χ²_token = mean_t r² − 1;
    χ²_seq = mean_i (Π_t r)² − 1.
    """
    mask = mask.to(train_log_prob.dtype)
    log_ratio = train_log_prob - rollout_log_prob
    mean_train = masked_mean(train_log_prob, mask, dim=-1)
    mean_rollout = masked_mean(rollout_log_prob, mask, dim=-1)
    diff = mean_rollout - mean_train
    clamped = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_log = masked_sum(log_ratio, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-mean_train).mean()),
        "training_log_ppl": float((-mean_train).mean()),
        "rollout_ppl": float(torch.exp(-mean_rollout).mean()),
        "rollout_log_ppl": float((-mean_rollout).mean()),
        "kl": float(masked_mean(-log_ratio, mask)),
        "k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1.0, mask)),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": float(masked_mean(torch.exp(clamped) ** 2, mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq_log).mean() - 1.0),
    }


def compute_rollout_correction(
    train_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(IS weights or None, the response mask after rejection, ``rollout_corr/*`` metrics).

    ``config`` has verl's ``algorithm.rollout_correction`` fields. IS and rejection are independent: both
    read the same log-ratio and the original mask; rejection never changes the weights.
    """
    if train_log_prob.shape != rollout_log_prob.shape or train_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: log-prob shapes {tuple(train_log_prob.shape)} / {tuple(rollout_log_prob.shape)} "
            f"and mask {tuple(response_mask.shape)} differ"
        )
    if not bool(response_mask.any()):
        raise ValueError("rollout correction: the batch has no response token")
    log_ratio = (train_log_prob - rollout_log_prob).detach()
    metrics: dict[str, float] = {}
    weights = None
    if config.rollout_is is not None and config.rollout_is_threshold is not None:
        bounds = parse_is_threshold(config.rollout_is_threshold)
        weights, is_metrics = rollout_is_weights(
            log_ratio, response_mask, config.rollout_is, bounds, config.rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask
    if config.rollout_rs is not None:
        options = parse_rs_options(config.rollout_rs)
        mask, rs_metrics = rollout_rejection_mask(
            log_ratio, response_mask, options, parse_rs_thresholds(options, config.rollout_rs_threshold)
        )
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(train_log_prob.detach(), rollout_log_prob, response_mask))
    return weights, mask, {PREFIX + name: value for name, value in metrics.items()}
