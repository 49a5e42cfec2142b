"""``reward_model.reward_manager=batch``: one call scores the whole batch (verl's BatchRewardManager).

For scorers that are cheaper in bulk: a remote judge, a vectorised checker, a sandbox that runs many
programs at once. The function is called as
``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=)`` (lists, one entry per
sample) and returns one score per sample, in order: a number or a dict with ``"score"``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from verl.workers.reward.manager import NaiveRewardManager, register_reward_manager
from verl.workers.reward.scorers import default_compute_score
from verl.workers.reward.scoring import (
    ComputeScoreFn,
    RewardBatchError,
    RewardFunctionError,
    RewardSample,
    ScoreResult,
    apply_error_policy,
    call_scorer,
    check_error_policy,
    describe_function,
    normalize_score,
    report_errors,
)
from verl.workers.reward.timeout import TimeLimit

logger = logging.getLogger(__name__)


def _as_score_list(raw: Any, name: str, expected: int) -> list[Any]:
    """The batch's scores as a list; a non-sequence or a wrong count is the function's bug, always raised.

    No error policy applies here: with the scores misaligned there is no telling which sample a score
    belongs to, so zeroing "the failed ones" is impossible.
    """
    if isinstance(raw, (torch.Tensor, np.ndarray)):
        raw = raw.reshape(-1).tolist() if raw.ndim <= 1 else raw
    if not isinstance(raw, (list, tuple)):
        raise RewardBatchError(
            f"batched reward function {name} returned {type(raw).__name__}, expected a list of {expected} "
            "scores (one per sample, in order)"
        )
    if len(raw) != expected:
        raise RewardBatchError(
            f"batched reward function {name} returned {len(raw)} scores for a batch of {expected} samples; "
            "it must return exactly one score per sample, in order"
        )
    return list(raw)


def score_batch(
    compute_score: ComputeScoreFn,
    samples: Sequence[RewardSample],
    *,
    error_policy: str = "fail",
    time_limit: TimeLimit | None = None,
) -> list[ScoreResult]:
    """Score all samples with one call; ``error_policy`` applies to the call (an exception or a timeout
    fails every sample) and to each unusable score (that sample alone)."""
    check_error_policy(error_policy)
    name = describe_function(compute_score)
    size = len(samples)

    def fail(reason: str, hint: str = "") -> RewardBatchError:
        return RewardBatchError(f"batched reward function {name} {reason} on a batch of {size} samples", hint)

    call = partial(
        compute_score,
        data_sources=[s.data_source for s in samples],
        solution_strs=[s.response_str for s in samples],
        ground_truths=[s.ground_truth for s in samples],
        extra_infos=[s.extra_info for s in samples],
    )
    try:
        raw = call_scorer(call, time_limit, fail)
    except RewardBatchError as error:
        if error_policy == "fail":
            raise
        logger.warning("%s; all %d scored 0 (reward_model.error_policy=%s)", error, size, error_policy)
        return [ScoreResult(score=0.0, extra={}, error=str(error)) for _ in samples]
    results = []
    for sample, value in zip(samples, _as_score_list(raw, name, size), strict=True):
        try:
            results.append(normalize_score(value, sample))
        except RewardFunctionError as error:
            results.append(apply_error_policy(error, error_policy))
    report_errors(results, error_policy)
    return results


@register_reward_manager("batch")
class BatchRewardManager(NaiveRewardManager):
    """The naive manager's decoding and reward placement, with one batched scoring call per batch.

    ``reward_model.timeout_s`` limits that one call.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.compute_score is default_compute_score:
            raise ValueError(
                "reward_model.reward_manager=batch needs a batched scoring function: set "
                "custom_reward_function.path (and .name) to a function taking lists "
                "(data_sources=, solution_strs=, ground_truths=, extra_infos=)"
            )

    def score(self, samples: Sequence[RewardSample]) -> list[ScoreResult]:
        return score_batch(
            self.compute_score, samples, error_policy=self.error_policy, time_limit=self.time_limit
        )
