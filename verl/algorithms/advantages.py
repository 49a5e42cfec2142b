"""Advantage estimators, one registered function each.

Every estimator takes ``token_level_rewards`` and ``response_mask`` (batch, response_length) plus
whatever it needs by keyword (``index`` groups the samples of one prompt, ``values``,
``reward_baselines``, ``gamma``, ``lam``, ``epsilon``, ``norm_adv_by_std_in_grpo``, ``config``) and
returns ``(advantages, returns)``, both (batch, response_length) and zero on padding. Unused keywords
are swallowed by ``**kwargs``, so the trainer can pass the same set to every estimator. The names and
signatures are verl's, so an estimator written for verl registers here unchanged.

Outcome estimators score a response by r_i = Σ_t rewards[i, t] and broadcast the advantage A_i over
its tokens; the group helpers below (``_group_members``, ``_group_mean_std``) are shared by them.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch

from verl.algorithms.core import masked_whiten
from verl.algorithms.external import import_external_modules, same_function
from verl.utils.registry import Registry

ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator (algorithm.adv_estimator)")


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an estimator needs from the step besides rewards, declared where it is registered; the step plan
    and the config checks read these, never the estimator's name."""

    critic: bool = False
    """per-token ``values`` from a trained critic (the plan trains one unless ``critic.enable`` says no)"""
    groups: bool = False
    """compares the responses to one prompt with each other (``index``): ``rollout.n`` must be >= 2"""
    greedy_baseline: bool = False
    """``reward_baselines``: the reward of one greedy response per prompt, generated before the samples"""


ADV_ESTIMATOR_NEEDS: dict[str, EstimatorNeeds] = {}


def register_adv_est(
    name: str | Enum, *, critic: bool = False, groups: bool = False, greedy_baseline: bool = False
) -> Callable:
    """Decorator: make an estimator available as ``algorithm.adv_estimator=<name>``, with what it needs
    (:class:`EstimatorNeeds`; verl's one-argument form declares nothing). ``name`` may be a member of
    verl's ``AdvantageEstimator`` enum, as in verl. Running a user's file again re-registers its function;
    a different function under a taken name raises."""
    name = _name(name)

    def decorator(fn: Callable) -> Callable:
        same = name in ADV_ESTIMATOR_REGISTRY and same_function(ADV_ESTIMATOR_REGISTRY[name], fn)
        registered = ADV_ESTIMATOR_REGISTRY.register(name, overwrite=same)(fn)  # a clash raises first
        ADV_ESTIMATOR_NEEDS[name] = EstimatorNeeds(
            critic=critic, groups=groups, greedy_baseline=greedy_baseline
        )
        return registered

    return decorator


def _name(name: str | Enum) -> str:
    return name.value if isinstance(name, Enum) else name


def get_adv_estimator_fn(name: str | Enum) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The estimator registered as ``name`` (looked up again after importing ``VERL_USE_EXTERNAL_MODULES``
    when missing).

    The trainer calls every estimator with the same keywords (``token_level_rewards``, ``response_mask``,
    ``index``, ``values``, ``reward_baselines``, ``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``,
    ``config``). verl passes a custom estimator only ``token_level_rewards``, ``response_mask``, ``config``,
    ``index`` and ``reward_baselines``, so one written for verl may declare just those and no ``**kwargs``:
    such a function comes back wrapped to receive only the keywords it declares."""
    name = _name(name)
    if name not in ADV_ESTIMATOR_REGISTRY:
        import_external_modules()
    return keywords_it_takes(ADV_ESTIMATOR_REGISTRY.lookup(name))


def keywords_it_takes(fn: Callable) -> Callable:
    """``fn`` itself when it takes ``**kwargs``; else a wrapper that drops the keyword arguments ``fn`` does
    not declare (positional arguments pass through)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): call it as it is
        return fn
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return fn
    accepted = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **{k: v for k, v in kwargs.items() if k in accepted})

    return call


def estimator_needs(name: str | Enum) -> EstimatorNeeds:
    """What the estimator registered as ``name`` declared it needs (nothing, for a name not registered yet:
    a user's estimator file may register it later, and an unknown name is reported by the lookup)."""
    return ADV_ESTIMATOR_NEEDS.get(_name(name), EstimatorNeeds())


# ----------------------------------------------------------------------------- group helpers


def _group_ids(index: Any) -> list:
    return index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)


def _group_members(index: Any, batch_size: int) -> list[list[int]]:
    """Row numbers of each group (samples sharing an ``index`` id), groups in order of first appearance."""
    ids = _group_ids(index)
    if len(ids) != batch_size:
        raise ValueError(f"index has {len(ids)} group ids but the batch has {batch_size} samples")
    groups: dict[Any, list[int]] = defaultdict(list)
    for row, gid in enumerate(ids):
        groups[gid].append(row)
    return list(groups.values())


def _group_mean_std(scores: torch.Tensor, index: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: its group's mean score, unbiased std and size. A group of one gets mean 0, std 1."""
    mean, std = torch.zeros_like(scores), torch.ones_like(scores)
    size = torch.ones_like(scores)
    for members in _group_members(index, scores.shape[0]):
        if len(members) > 1:
            group_scores = scores[members]
            mean[members] = group_scores.mean()
            std[members] = group_scores.std()
            size[members] = len(members)
    return mean, std, size


def _broadcast(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(batch,) -> (batch, response_length), zero on padding."""
    return per_sample.unsqueeze(-1) * response_mask


# ----------------------------------------------------------------------------- token-level estimators


@register_adv_est("gae", critic=True)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | torch.Tensor = 1.0,
    lam: float | torch.Tensor = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE, the PPO estimator with a critic.

    δ_t = r_t + γ·V_{t+1} − V_t;  A_t = δ_t + γλ·A_{t+1}, computed backwards over the response with
    V and A beyond the last token 0. A token with mask 0 (padding, or an observation token inside a
    multi-turn response) is skipped: V_{t+1} and A_{t+1} carry through it unchanged.
    returns = A + V (before whitening); the advantages are then whitened over the batch's response
    tokens. Both are zero on padding.
    Schulman et al. 2015, High-Dimensional Continuous Control Using GAE (arXiv 1506.02438).
    """
    if values is None:
        raise ValueError("adv_estimator=gae needs the critic's `values` (enable the critic)")
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_values = torch.zeros_like(values[:, 0])
        last_gae_lam = torch.zeros_like(values[:, 0])
        advantages_reversed = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
            gae_t = delta + gamma * lam * last_gae_lam
            m = mask[:, t]
            next_values = values[:, t] * m + (1 - m) * next_values
            last_gae_lam = gae_t * m + (1 - m) * last_gae_lam
            advantages_reversed.append(last_gae_lam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = (advantages + values) * mask
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_adv_est("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go, whitened over the batch (no critic, no groups).

    G_t = r_t + γ·G_{t+1}, computed backwards over the tokens with mask 1; a masked token (padding, or
    an observation token inside a multi-turn response) is skipped, as in GAE: neither its reward nor a
    discount step, G carries through it unchanged. So nothing right of the response's end leaks into it,
    and the tokens before a tool output still see the outcome reward after it.
    A = masked_whiten(G) · mask;  returns = G · mask.
    ``gamma`` defaults to ``config.gamma`` (verl reads it from the config), else 1.
    Hu 2025, REINFORCE++ (arXiv 2501.03262).
    """
    if gamma is None:
        gamma = config.gamma if config is not None else 1.0
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            step = token_level_rewards[:, t] + gamma * running
            returns[:, t] = step
            running = torch.where(mask[:, t].bool(), step, running)
        returns = returns * mask
        advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est("remax", greedy_baseline=True)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: the reward of the greedy response to the same prompt is the baseline.

    G_t = Σ_{t' ≥ t} m_{t'}·r_{t'} (reverse cumulative sum);  A_t = G_t − b_i with
    b = ``reward_baselines`` (batch,);  returns = G. Both · mask.
    Li et al. 2023, ReMax (arXiv 2310.10505).
    """
    if reward_baselines is None:
        raise ValueError("adv_estimator=remax needs `reward_baselines` (the greedy response's reward)")
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
        advantages = returns - _broadcast(reward_baselines.to(returns.dtype), mask)
    return advantages, returns


# ----------------------------------------------------------------------------- outcome (group) estimators


@register_adv_est("grpo", groups=True)
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
    mean, std, _ = _group_mean_std(scores, index)
    advantages = scores - mean
    if norm_adv_by_std_in_grpo:
        advantages = advantages / (std + epsilon)
    advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est("grpo_passk", groups=True)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training: only the best response of each group is credited.

    A_best = r_max − r_second_max  (÷ (std_g r + ε), unbiased std, with ``norm_adv_by_std_in_grpo``);
    every other response gets 0. Needs at least 2 responses per group.
    Tang et al. 2025, Optimizing Language Models for Inference Time Objectives using RL (arXiv 2503.19595).
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    for members in _group_members(index, scores.shape[0]):
        if len(members) < 2:
            raise ValueError(
                f"adv_estimator=grpo_passk needs at least 2 responses per prompt; a group has {len(members)}"
                " (set rollout.n >= 2)"
            )
        group_scores = scores[members]
        top, top_pos = torch.topk(group_scores, 2)
        advantage = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (group_scores.std() + epsilon)
        advantages[members[top_pos[0].item()]] = advantage
    advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_est("reinforce_plus_plus_baseline", groups=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: subtract the group mean, then whiten over the batch.

    A_i = r_i − mean_g r  (a group of one: mean 0), broadcast over the tokens;
    A = masked_whiten(A) · mask;  returns = A.
    Hu 2025, REINFORCE++ (arXiv 2501.03262).
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, _ = _group_mean_std(scores, index)
    mask = response_mask.to(scores.dtype)
    advantages = masked_whiten(_broadcast(scores - mean, mask), mask) * mask
    return advantages, advantages


@register_adv_est("rloo", groups=True)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: the mean of the *other* responses to the same prompt is the baseline.

    A_i = r_i − mean_{j≠i} r_j = n/(n−1) · (r_i − mean_g r)  for a group of n ≥ 2;
    a group of one has no other response and gets A_i = r_i (as in verl). Broadcast · mask.
    Ahmadian et al. 2024, Back to Basics (arXiv 2402.14740).
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _, size = _group_mean_std(scores, index)
    scale = torch.where(size > 1, size / (size - 1).clamp_min(1), torch.ones_like(size))
    advantages = _broadcast(scale * (scores - mean), response_mask)
    return advantages, advantages


@register_adv_est("opo", groups=True)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: the length-weighted group mean is the (optimal, on-policy) baseline.

    b_g = Σ_j len_j·r_j / Σ_j len_j  (len = number of response tokens);  A_i = r_i − b_g;
    a group of one gets b = 0. Broadcast · mask.
    Hao et al. 2025, On-Policy RL with Optimal Reward Baseline (arXiv 2505.23585).
    """
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    baseline = torch.zeros_like(scores)
    for members in _group_members(index, scores.shape[0]):
        if len(members) > 1:
            group_lengths = lengths[members]
            baseline[members] = (group_lengths * scores[members]).sum() / group_lengths.sum().clamp_min(1)
    advantages = _broadcast(scores - baseline, response_mask)
    return advantages, advantages


@register_adv_est("gpg", groups=True)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: group-mean baseline, scaled up by the share of samples that carry a signal.

    α = B / #{i : r_i ≠ 0} over the batch (α = 1 when every r_i is 0: then every A_i is 0 anyway);
    A_i = α · (r_i − mean_g r) / f_norm  (a group of one: mean 0; f_norm = 1). Broadcast · mask.
    As in verl, α counts samples with a non-zero *reward*; the paper's correction is meant to count
    samples with a non-zero *advantage* (not in an all-equal group), so e.g. an all-correct group
    with 0/1 rewards counts in the denominator here although its advantages are all 0.
    Chu et al. 2025, GPG (arXiv 2504.02546).
    """
    scores = token_level_rewards.sum(dim=-1)
    nonzero = int(torch.count_nonzero(scores))
    alpha = scores.shape[0] / nonzero if nonzero else 1.0
    mean, _, _ = _group_mean_std(scores, index)
    advantages = _broadcast(alpha * (scores - mean) / f_norm, response_mask)
    return advantages, advantages
