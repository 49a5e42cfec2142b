"""Metrics of an RL step and of validation, with verl's names."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def compute_data_metrics(batch: DataProto, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages and lengths of the batch just trained on."""
    mask = batch.batch["response_mask"].bool()
    response_length = mask.sum(-1).float()
    prompt_length = batch.batch["attention_mask"][:, : -mask.shape[1]].sum(-1).float()
    metrics = {}
    metrics.update(_stats("critic/score", batch.batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch.batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", batch.batch["advantages"][mask]))
    metrics.update(_stats("critic/returns", batch.batch["returns"][mask]))
    if "values" in batch.batch:
        values, returns = batch.batch["values"][mask], batch.batch["returns"][mask]
        metrics.update(_stats("critic/values", values))
        # 1 - Var(R - V) / Var(R): how much of the return the critic explains.
        metrics["critic/vf_explained_var"] = (1.0 - (returns - values).var() / (returns.var() + 1e-8)).item()
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    return metrics


def compute_throughput_metrics(batch: DataProto, step_seconds: float, n_devices: int) -> dict[str, float]:
    total_tokens = int(batch.batch["attention_mask"].sum().item())
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / (step_seconds * n_devices),
    }


def reduce_metrics(metrics: dict[str, list[float]]) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in metrics.items()}


def compute_validation_metrics(
    data_sources: list[str], scores: list[float], extra: dict[str, list[Any]], n: int = 1
) -> dict[str, float]:
    """``val-core/<data_source>/acc/mean@n`` and ``.../reward/mean@n``.

    ``acc`` is the scorer's own ``acc`` field when it reports one, otherwise the score itself (rule
    scorers return 1 for a correct answer and 0 otherwise).
    """
    accs = extra.get("acc") or [None] * len(scores)
    by_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for source, score, acc in zip(data_sources, scores, accs, strict=True):
        by_source[source]["reward"].append(float(score))
        by_source[source]["acc"].append(float(score if acc is None else acc))
    metrics = {}
    for source, variables in by_source.items():
        for name, values in variables.items():
            metrics[f"val-core/{source}/{name}/mean@{n}"] = float(np.mean(values))
    return metrics


def rollout_probs_diff(batch: DataProto) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the actor's recomputed ones (verl's
    ``training/rollout_probs_diff_*``): |p_rollout - p_actor| over response tokens."""
    mask = batch.batch["response_mask"].bool()
    diff = (batch.batch["rollout_log_probs"].exp() - batch.batch["old_log_probs"].exp()).abs()[mask]
    if diff.numel() == 0:
        return {}
    return {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std().item() if diff.numel() > 1 else 0.0,
    }
