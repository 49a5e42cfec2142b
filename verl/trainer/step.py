"""One RL step, in verl's order, as one function over the trainer's :class:`Controller`.

    generate → score ∥ old log-probs ∥ reference log-probs ∥ values → advantages → critic → actor

Every role call is visible in :func:`rl_step`. ``flow.call`` declares a call and returns a channel
(a future) at once; the controller runs each call as soon as its inputs are ready, so scoring, the
log-prob passes and the critic's values overlap without any thread in sight. ``flow.driver`` runs a
function in the driver the same way. What a step does is decided once, in the :class:`StepPlan`.

A custom step is a function with :func:`rl_step`'s signature, named in the config
(``trainer.step=my_file.py:my_step``); it may call the helpers below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl.balancing import balance_across_ranks
from verl.protocol import DataProto
from verl.single_controller.flow import Controller, DataChannel
from verl.trainer.advantage import compute_advantages
from verl.trainer.plan import StepPlan
from verl.workers.requests import UpdateRequest


@dataclass
class StepResult:
    """What one step returns: the batch it trained on and the metric dicts its producers returned."""

    batch: DataChannel | DataProto
    metrics: list[DataChannel | dict[str, float]] = field(default_factory=list)
    """each a plain ``{name: value}`` dict, or a channel that will hold one"""


StepFn = Callable[[Controller, StepPlan, int, DataProto, Iterator[DataProto]], StepResult]


def rl_step(
    flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
) -> StepResult:
    """RL step ``step`` on a batch of ``prompts`` (``more`` supplies further prompts to dynamic sampling)."""
    batch = generate_groups(flow, plan, prompts, tag=f"{step}-0")
    return train_on(flow, plan, step, batch, more)


def train_on(
    flow: Controller,
    plan: StepPlan,
    step: int,
    batch: DataChannel | DataProto,
    more: Iterator[DataProto],
    metrics: list[DataChannel | dict[str, float]] | None = None,
) -> StepResult:
    """Everything of the step after generation: score ∥ old log-probs ∥ reference ∥ values → advantages →
    critic → actor. (The asynchronous step trains here on a batch the rollout role generated ahead.)"""
    metrics = [] if metrics is None else metrics
    if plan.refill_until_varied:  # DAPO: keep groups whose rewards differ, generate more until full
        batch, refill_metrics = refill_until_varied(flow, plan, step, batch, more)
        metrics.append(refill_metrics)
    if plan.balance:  # about the same number of tokens for every data-parallel rank
        batch, balance_metrics = flow.driver(
            balance_tokens,
            name="balance",
            outputs=("batch", "metrics"),
            batch=batch,
            parts=plan.sizes.dp_size,
        )
        metrics.append(balance_metrics)
    old = ref = values = scores = None
    if not plan.refill_until_varied:  # (dynamic sampling scored the batch already)
        scores = flow.call("reward", "compute_score", data=batch, name="reward")
    if plan.old_log_probs == "recompute":
        old = flow.call("actor_rollout", "compute_log_prob", data=batch, name="old_log_prob")
    if plan.ref:
        ref = flow.call("actor_rollout", "compute_ref_log_prob", data=batch, name="ref")
    if plan.critic:
        values = flow.call("critic", "compute_values", data=batch, name="values")
    batch, adv_metrics = flow.driver(
        compute_advantages, name="adv", outputs=("batch", "metrics"),
        batch=batch, scores=scores, old=old, ref=ref, values=values, plan=plan,
    )  # fmt: skip
    metrics.append(adv_metrics)
    # Without an old-log-prob pass the update's own forward pass measures actor/entropy.
    request = UpdateRequest(plan.sizes, progress=plan.progress(step), measure_entropy=old is None)
    if plan.critic:
        metrics.append(flow.call("critic", "update_critic", data=batch, request=request))
    if plan.update_actor(step):  # critic warm-up: the policy waits
        metrics.append(flow.call("actor_rollout", "update_actor", data=batch, request=request))
    return StepResult(batch, metrics)


def generate_groups(flow: Controller, plan: StepPlan, prompts: DataProto, tag: str) -> DataChannel:
    """Give each prompt a uid (its group), repeat it ``plan.n`` times and sample the responses.

    ReMax (Li et al. 2023, arXiv 2310.10505): first one greedy response per prompt, whose reward becomes
    the baseline of the prompt's group (``reward_baselines``).
    """
    prompts = with_group_ids(prompts, tag)
    if plan.remax_baseline:
        greedy = flow.call(
            "actor_rollout", "generate_sequences", prompts=prompts, validate=True, name="gen_max"
        )
        greedy_scores = flow.call("reward", "compute_score", data=greedy, validate=True, name="reward_max")
        groups = flow.driver(
            repeat_with_baselines, name="remax_baseline", prompts=prompts, scores=greedy_scores, n=plan.n
        )
    else:
        groups = prompts.repeat(plan.n, interleave=True)
    return flow.call("actor_rollout", "generate_sequences", prompts=groups, name="gen")


def with_group_ids(prompts: DataProto, tag: str) -> DataProto:
    """A copy of ``prompts`` with a ``uid`` per prompt, ``<tag>-<row>``: the group of its responses."""
    prompts = prompts.select()
    prompts.non_tensor_batch["uid"] = np.array([f"{tag}-{i}" for i in range(len(prompts))], dtype=object)
    return prompts


def repeat_with_baselines(prompts: DataProto, scores: DataProto, n: int) -> DataProto:
    """Each prompt ``n`` times, consecutively, with its greedy response's reward as ``reward_baselines``."""
    baselines = scores.batch["token_level_scores"].sum(-1).repeat_interleave(n)
    groups = prompts.repeat(n, interleave=True)
    groups.batch["reward_baselines"] = baselines
    return groups


def balance_tokens(batch: DataProto, parts: int) -> dict[str, Any]:
    """Driver step: a reordered copy of ``batch`` whose ``parts`` contiguous shares hold about the same
    number of tokens, and the ``global_seqlen/*`` metrics (channel values are never changed in place)."""
    batch = batch.select()
    return {"batch": batch, "metrics": balance_across_ranks(batch, parts)}


def refill_until_varied(
    flow: Controller, plan: StepPlan, step: int, batch: DataChannel, more: Iterator[DataProto]
) -> tuple[DataProto, dict[str, float]]:
    """DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476): the scored batch, refilled.

    A group whose responses all score the same has zero advantage and teaches nothing: drop it, and
    generate from further prompts until ``data.train_batch_size`` groups remain (at most
    ``filter_groups.max_num_gen_batches`` generation batches; 0 = no limit). Returns the batch with its
    scores merged in, and ``train/num_gen_batches``.
    """
    cfg = plan.algorithm.filter_groups
    kept, num_groups, generated = [], 0, 0
    while True:
        generated += 1
        scores = flow.call("reward", "compute_score", data=batch, name="reward")
        varied = varied_groups(batch.get().select().union(scores.get()), cfg.metric)
        kept.append(varied)
        num_groups += len(varied) // plan.n
        if num_groups >= plan.train_batch_size:
            break
        if cfg.max_num_gen_batches > 0 and generated >= cfg.max_num_gen_batches:
            raise RuntimeError(
                f"dynamic sampling found {num_groups} of {plan.train_batch_size} groups with varied rewards "
                f"after {generated} generation batches; raise algorithm.filter_groups.max_num_gen_batches, "
                "lower data.train_batch_size, or check that the task is neither too easy nor too hard for "
                "the model"
            )
        batch = generate_groups(flow, plan, next(more), tag=f"{step}-{generated}")
    # Groups are contiguous (interleaved repeat), so the first train_batch_size * n rows are whole groups.
    full = DataProto.concat(kept)[: plan.train_batch_size * plan.n]
    return full, {"train/num_gen_batches": float(generated)}


def varied_groups(batch: DataProto, metric: str) -> DataProto:
    """The rows of ``batch`` whose group (same uid) does not have the same ``metric`` for every response."""
    if metric == "seq_reward":
        values = batch.batch["token_level_scores"].sum(-1).tolist()
    elif metric in batch.non_tensor_batch:
        values = list(batch.non_tensor_batch[metric])
    else:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: choose seq_reward or a field the reward "
            f"function returns (available: {sorted(batch.non_tensor_batch)})"
        )
    by_group: dict[Any, set] = {}
    for uid, value in zip(batch.non_tensor_batch["uid"], values, strict=True):
        by_group.setdefault(uid, set()).add(value)
    keep = [i for i, uid in enumerate(batch.non_tensor_batch["uid"]) if len(by_group[uid]) > 1]
    return batch.select_idxs(keep)
