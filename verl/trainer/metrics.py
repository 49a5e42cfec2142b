"""Metrics of an RL step and of validation, with verl's names."""

from __future__ import annotations

import os
import resource
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.algorithms.kl import kl_penalty
from verl.protocol import DataProto
from verl.workers.reward.manager import REWARD_ERROR_KEY


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
    # The length of the whole response, as verl counts it (the attention mask's response part): a multi-turn
    # trajectory's inserted tool tokens (response_mask 0) count; single-turn the two masks are the same.
    response_length = batch.batch["attention_mask"][:, -mask.shape[1] :].sum(-1).float()
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


WALL_CLOCK_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/")
"""metrics of the machine's time, not of the run's arithmetic: they differ between two runs that are the same
run (a resumed one and the uninterrupted one, two seeds alike), so comparisons of runs leave them out"""

PER_TOKEN_SECTIONS = ("gen", "ref", "values", "adv", "update_critic", "update_actor")
"""the step's sections verl reports per token: generation per response token, the others per token of the
whole sequences (prompt and response) they pass over"""


def compute_timing_per_token_metrics(batch: DataProto, timing: Mapping[str, float]) -> dict[str, float]:
    """verl's ``timing_per_token_ms/<section>``: the milliseconds a section of the step took per token it
    handled, for the sections this step ran. ``1000 / timing_per_token_ms/gen`` is the rollout's tokens per
    second."""
    mask = batch.batch["attention_mask"]
    response_tokens = int(mask[:, -batch.batch["response_mask"].shape[1] :].sum().item())
    all_tokens = int(mask.sum().item())
    return {
        f"timing_per_token_ms/{name}": timing[name]
        * 1000
        / max(response_tokens if name == "gen" else all_tokens, 1)
        for name in PER_TOKEN_SECTIONS
        if name in timing
    }


def memory_metrics() -> dict[str, float]:
    """The driver process's memory (with ``trainer.backend=local`` that is every role's): resident now
    (``perf/cpu_memory_used_gb``; verl's metric of that name is the machine's used memory) and at its peak
    (``perf/max_rss_gb``); when the driver itself computes on a GPU also torch's peak allocated and reserved
    memory (verl's ``perf/max_memory_allocated_gb`` / ``_reserved_gb``)."""
    gib = 1024**3
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    metrics = {"perf/max_rss_gb": peak / gib}  # ru_maxrss: KiB on Linux, bytes on macOS
    try:
        with open("/proc/self/statm") as f:
            metrics["perf/cpu_memory_used_gb"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / gib
    except OSError:  # not Linux: the peak is what there is
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / gib
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / gib
    return metrics


def reduce_metrics(metrics: dict[str, list[float]]) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in metrics.items()}


def _is_number(value: Any) -> bool:
    """A bool, int or float (python or numpy) with a finite value: what a metric can average."""
    numeric = isinstance(value, (bool, int, float, np.integer, np.floating, np.bool_))
    return numeric and bool(np.isfinite(float(value)))


def reward_extra_metrics(fields: Mapping[str, Sequence[Any]], keys: Iterable[str]) -> dict[str, float]:
    """``reward_extra/<key>/mean`` for each extra field a scorer returned (``keys``), over the samples where it is
    a number (bool, int, float); None, strings and non-finite values are skipped, and a field with no number at
    all has no metric. ``reward_error`` is left out: it is counted in ``reward/errors``."""
    metrics = {}
    for key in keys:
        if key == REWARD_ERROR_KEY or key not in fields:
            continue
        values = [float(v) for v in fields[key] if _is_number(v)]
        if values:
            metrics[f"reward_extra/{key}/mean"] = float(np.mean(values))
    return metrics


def compute_validation_metrics(
    data_sources: list[str], scores: list[float], extra: dict[str, list[Any]], n: int = 1
) -> dict[str, float]:
    """The validation metrics, named as verl's ``process_validation_metrics`` names them (mean@n only).

    Per data source, the core variable is ``acc`` when the scorer reports it, else ``reward`` (the mean score):
    ``val-core/<data_source>/<core>/mean@n``. Every other variable is auxiliary,
    ``val-aux/<data_source>/<name>/mean@n``: the reward when ``acc`` is the core, and each extra field whose
    values are numbers (strings, None and non-finite values are skipped, as in :func:`reward_extra_metrics`).

    ``acc`` is averaged over the samples whose scorer returned a number (or bool) for it, plus the samples
    scored 0 after a reward error (``reward_error``, error_policy=zero), which count as wrong; a source
    where no sample has one has no ``acc`` metric.
    """
    failed = extra.get(REWARD_ERROR_KEY, [None] * len(scores))
    others = [k for k in extra if k not in ("acc", "reward", REWARD_ERROR_KEY)]  # reward: the score's name
    by_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    failed_by_source: dict[str, int] = defaultdict(int)
    for i, (source, score, error) in enumerate(zip(data_sources, scores, failed, strict=True)):
        variables = by_source[source]
        variables["reward"].append(float(score))
        acc = extra["acc"][i] if "acc" in extra else None
        if _is_number(acc):
            variables["acc"].append(float(acc))
        elif bool(error):
            failed_by_source[source] += 1
        for key in others:
            if _is_number(extra[key][i]):
                variables[key].append(float(extra[key][i]))
    metrics = {}
    for source, variables in by_source.items():
        if "acc" in variables:
            variables["acc"].extend([0.0] * failed_by_source[source])
        core = "acc" if "acc" in variables else "reward"
        for name, values in variables.items():
            section = "val-core" if name == core else "val-aux"
            metrics[f"{section}/{source}/{name}/mean@{n}"] = float(np.mean(values))
    return metrics


def rollout_probs_diff(batch: DataProto) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the actor's recomputed ones (verl's
    ``training/rollout_probs_diff_*``): |p_rollout - p_actor| over response tokens; and
    ``training/rollout_actor_kl``, the k3 estimate of KL(rollout || actor) from the tokens the rollout sampled
    (`verl.algorithms.kl.kl_penalty`)."""
    mask = batch.batch["response_mask"].bool()
    rollout, actor = batch.batch["rollout_log_probs"][mask], batch.batch["old_log_probs"][mask]
    if rollout.numel() == 0:
        return {}
    diff = (rollout.exp() - actor.exp()).abs()
    return {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std().item() if diff.numel() > 1 else 0.0,
        "training/rollout_actor_kl": kl_penalty(rollout.float(), actor.float(), "k3").mean().item(),
    }
