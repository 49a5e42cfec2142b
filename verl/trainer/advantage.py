"""Driver-side steps between scoring and the update: KL in the reward, then the advantage estimator."""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms import agg_loss, get_adv_estimator_fn, kl_penalty, masked_mean
from verl.algorithms.rollout_correction import compute_rollout_correction
from verl.protocol import DataProto
from verl.trainer.metrics import rollout_probs_diff
from verl.workers.rollout.base import ROLLOUT_ENTROPY_KEY


def apply_kl_penalty(data: DataProto, kl_ctrl: Any, kl_penalty_type: str = "kl") -> dict[str, float]:
    """token_level_rewards = token_level_scores − β·KL(π_old‖π_ref) per token; β from the KL controller.

    Writes ``token_level_rewards`` into ``data`` and updates the controller with the batch's KL.
    """
    mask = data.batch["response_mask"]
    kl = kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty_type) * mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kl
    current_kl = masked_mean(kl, mask, dim=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(data: DataProto, algorithm: Any) -> DataProto:
    """Run the estimator named by ``algorithm.adv_estimator``; adds ``advantages`` and ``returns``."""
    estimator = get_adv_estimator_fn(algorithm.adv_estimator)
    advantages, returns = estimator(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        values=data.batch.get("values"),
        reward_baselines=data.batch.get("reward_baselines"),
        gamma=algorithm.gamma,
        lam=algorithm.lam,
        norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
        config=algorithm,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


def entropy_source(batch: DataProto, old: DataProto | None, plan: Any) -> torch.Tensor | None:
    """The per-token entropies ``actor/entropy`` is measured from: the old-log-prob pass's, else the rollout's
    (``rollout_entropys``, `ROLLOUT_ENTROPY_KEY`) when they are the current policy's (``plan.entropy_from_rollout``:
    no sample is drawn by an older one), else None: the update measures it in its own forward pass. The
    rollout's entropies stay in ``batch`` only when they are the source; that is how the update knows."""
    if old is not None:
        batch.batch.pop(ROLLOUT_ENTROPY_KEY, None)
        return old.batch["entropys"]
    if ROLLOUT_ENTROPY_KEY in batch.batch and not plan.entropy_from_rollout:
        batch.batch.pop(ROLLOUT_ENTROPY_KEY)
    return batch.batch.get(ROLLOUT_ENTROPY_KEY)


def apply_rollout_correction(data: DataProto, correction: Any) -> dict[str, float]:
    """Decoupled rollout correction (verl's order: after the in-reward KL, before the estimator): the
    rejected tokens leave ``response_mask``, the IS weights π_old/π_rollout become ``rollout_is_weights``.
    With nothing configured only the ``rollout_corr/*`` mismatch metrics are added."""
    weights, mask, metrics = compute_rollout_correction(
        data.batch["old_log_probs"], data.batch["rollout_log_probs"], data.batch["response_mask"], correction
    )
    data.batch["response_mask"] = mask
    if weights is not None:
        data.batch["rollout_is_weights"] = weights
    return metrics


def compute_advantages(
    batch: DataProto,
    scores: DataProto | None = None,
    old: DataProto | None = None,
    ref: DataProto | None = None,
    values: DataProto | None = None,
    *,
    plan: Any,
    teacher: DataProto | None = None,
) -> dict[str, Any]:
    """Driver step of the RL step: merge what the roles computed into one batch (with on-policy distillation
    the teachers' ``teacher_logprobs`` / ``teacher_ids``), apply the in-reward KL penalty (optional), run the
    estimator. Returns ``{"batch": ..., "metrics": {...}}``; channel values are never changed in place, so the
    batch is a new DataProto."""
    metrics: dict[str, float] = {}
    batch = batch.select() if scores is None else batch.select().union(scores)
    entropy = entropy_source(batch, old, plan)
    if entropy is not None:  # verl's: aggregated as the actor's loss is
        metrics["actor/entropy"] = agg_loss(
            entropy,
            batch.batch["response_mask"],
            plan.loss_agg_mode,
            loss_scale_factor=plan.loss_scale_factor,
        ).item()
    if old is not None:
        batch = batch.union(old.select(batch_keys=["old_log_probs"]))
        if "rollout_log_probs" in batch.batch:
            metrics.update(rollout_probs_diff(batch))
    elif plan.old_log_probs == "from_rollout":
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
    for part in (ref, teacher, values):
        if part is not None:
            batch = batch.union(part)
    if plan.kl_ctrl is not None:
        metrics.update(apply_kl_penalty(batch, plan.kl_ctrl, plan.algorithm.kl_penalty))
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    correction = plan.algorithm.rollout_correction
    if old is not None and "rollout_log_probs" in batch.batch and not correction.bypass_mode:
        metrics.update(apply_rollout_correction(batch, correction))
    return {"batch": compute_advantage(batch, plan.algorithm), "metrics": metrics}
