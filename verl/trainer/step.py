"""One RL step, in verl's order, as one function over the trainer's :class:`Controller`.

    batch (from the mode's source) → score ∥ old log-probs ∥ reference ∥ teacher ∥ values → advantages → critic → actor

Every role call is visible in :func:`rl_step`. ``flow.call`` declares a call and returns a channel
(a future) at once; the controller runs each call as soon as its inputs are ready, so scoring, the
log-prob passes and the critic's values overlap without any thread in sight. ``flow.driver`` runs a
function in the driver the same way. What a step does is decided once, in the :class:`StepPlan`; where
its batch comes from (generated now, ahead by a rollout role, or from a streaming pool) is the plan's batch
source (:mod:`verl.trainer.sources`), the only thing a trainer mode changes.

A custom step is a function with :func:`rl_step`'s signature, named in the config
(``trainer.step=my_file.py:my_step``); it may call the helpers below. ``batch_source(plan).batch(...)`` gives
it the batch in every mode; ``generate_groups`` generates now (``trainer_mode=sync``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from verl.balancing import balance_across_ranks
from verl.protocol import DataProto
from verl.single_controller.channels import resolved
from verl.single_controller.flow import Controller, DataChannel
from verl.trainer.advantage import compute_advantages
from verl.trainer.groups import groups_of, repeat_with_baselines, with_group_ids
from verl.trainer.plan import StepPlan
from verl.trainer.sources import BatchSource, SyncSource, generate_groups
from verl.workers.requests import UpdateRequest

__all__ = [  # (the group helpers and generate_groups are importable from here, where custom steps find them)
    "StepFn", "StepResult", "balance_tokens", "batch_source", "generate_groups", "groups_of",
    "refill_until_varied", "repeat_with_baselines", "rl_step", "train_on", "varied_groups", "with_group_ids",
]  # fmt: skip


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
    """RL step ``step``: the batch from the mode's source (generated now from ``prompts``, or ahead by the
    rollout role, or from the streaming pool), then training on it (``more`` supplies further prompts)."""
    batch, metrics = batch_source(plan).batch(flow, plan, step, prompts, more)
    return train_on(flow, plan, step, batch, more, metrics)


def batch_source(plan: StepPlan) -> BatchSource:
    """The plan's batch source (the trainer sets one per mode); a plan without one generates now."""
    return plan.source if plan.source is not None else SyncSource()


def train_on(
    flow: Controller,
    plan: StepPlan,
    step: int,
    batch: DataChannel | DataProto,
    more: Iterator[DataProto],
    metrics: list[DataChannel | dict[str, float]] | None = None,
) -> StepResult:
    """Everything of the step after generation: score ∥ old log-probs ∥ reference ∥ teacher ∥ values →
    advantages → critic → actor, on a batch from any source. (Validation never calls the teacher, as in verl.)"""
    metrics = [] if metrics is None else metrics
    if plan.refill_until_varied:  # DAPO: keep groups whose rewards differ, more from the source until full
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
    old = ref = teacher = values = scores = None
    if not plan.refill_until_varied:  # (dynamic sampling scored the batch already)
        scores = flow.call("reward", "compute_score", data=batch, name="reward")
    if plan.old_log_probs == "recompute":
        old = flow.call("actor_rollout", "compute_log_prob", data=batch, name="old_log_prob")
    if plan.ref:
        ref = flow.call("actor_rollout", "compute_ref_log_prob", data=batch, name="ref")
    if plan.teacher:  # on-policy distillation: the teachers sit in the actor's workers, beside the reference
        teacher = flow.call("actor_rollout", "compute_teacher_log_prob", data=batch, name="teacher")
    if plan.critic:
        values = flow.call("critic", "compute_values", data=batch, name="values")
    batch, adv_metrics = flow.driver(
        compute_advantages, name="adv", outputs=("batch", "metrics"),
        batch=batch, scores=scores, old=old, ref=ref, teacher=teacher, values=values, plan=plan,
    )  # fmt: skip
    metrics.append(adv_metrics)
    # Without an old-log-prob pass, actor/entropy comes from the rollout's entropies (the fast engine's, when the
    # samples are the current policy's) or else from the update's own forward pass.
    request = UpdateRequest(plan.sizes, progress=plan.progress(step), measure_entropy=old is None)
    if plan.critic:
        metrics.append(flow.call("critic", "update_critic", data=batch, request=request))
    if plan.update_actor(step):  # critic warm-up: the policy waits
        metrics.append(flow.call("actor_rollout", "update_actor", data=batch, request=request))
    return StepResult(batch, metrics)


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
        # (a channel, or a batch a source already holds)
        varied = varied_groups(resolved(batch).select().union(scores.get()), cfg.metric)
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
        batch = batch_source(plan).refill(flow, plan, step, next(more), attempt=generated)
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
