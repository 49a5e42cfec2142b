"""The training loop the actor and the critic share: mini-batches, micro-batches, all-reduce, clip, step.

A role describes one update as a :class:`RoleUpdate`: its data and `UpdatePlan`, the context of a
mini-batch (built from its global token and sequence counts) and the loss of one micro-batch (which also
adds its shares of the mini-batch's metrics). Everything else is here, once:

- ``epochs`` passes over this rank's shard in mini-batches of ``mini_batch_size // world_size`` rows
  (shuffled from the role's own generator when asked), one optimizer step each;
- the real-token and sequence counts of each GLOBAL mini-batch, summed over the ranks, so that
  micro-batch losses normalised by them add up to the global mini-batch's loss;
- micro-batches by rows or by token budget, gradients accumulated without DDP's all-reduce until
  the last one; each backward scaled by the world size (DDP averages, the loss is a share of a sum),
  unless the role's loss already is (verl's ``agg_loss(..., dp_size=...)``: the actor's);
- the metric shares summed over the ranks (min / max ones reduced as such), gradient clipping with the
  non-finite skip, the LR schedule.

Data parallel with torch.distributed when a process group is up (see `verl.workers.engine.distributed`):
the update then equals the one-process update of the whole batch, and every rank returns the same
metrics. With one process nothing of this is active.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import torch

from verl.protocol import DataProto
from verl.workers.engine.batching import lockstep_micro_batches, micro_batches
from verl.workers.engine.distributed import (
    all_reduce_sum,
    dp_rank,
    dp_world_size,
    gradient_sync,
    local_mini_batch_size,
)
from verl.workers.engine.fsdp import needs_lockstep
from verl.workers.engine.optim import clip_and_step, record_optimizer_step, summarize_metrics
from verl.workers.engine.trained import TrainedModel

C = TypeVar("C")

MiniBatchContext = Callable[[float, float], C]
"""``(global_num_tokens, global_num_seqs) -> context`` of one mini-batch"""
MicroBatchLoss = Callable[[DataProto, C, dict[str, float]], torch.Tensor]
"""``(micro, context, metric_shares) -> loss`` to backward; adds the micro-batch's metric shares"""


@dataclass(frozen=True)
class UpdatePlan:
    """How one update call splits its data, as verl's sizes: ``mini_batch_size`` is GLOBAL (samples per
    optimizer step over all ranks), ``micro_batch_size`` PER RANK (rows per forward/backward; None = the
    whole local mini-batch), or ``max_tokens`` real tokens per micro-batch (use_dynamic_bsz)."""

    mini_batch_size: int
    micro_batch_size: int | None
    epochs: int = 1
    max_tokens: int | None = None
    shuffle: bool = False
    grad_clip: float = 1.0


@dataclass(frozen=True)
class RoleUpdate(Generic[C]):
    """What a role brings to one `run_update` call (built by ``Actor.plan_update`` / ``Critic.plan_update``)."""

    data: DataProto
    """this rank's shard, with only the keys the loss reads"""
    plan: UpdatePlan
    prefix: str
    """names the optimizer metrics: ``<prefix>/grad_norm``, ``/skipped_steps``, ``/lr``"""
    mini_batch_context: MiniBatchContext[C]
    micro_batch_loss: MicroBatchLoss[C]
    closing_metrics: dict[str, float] = field(default_factory=dict)
    """recorded after the optimizer steps"""
    no_gradient: Callable[[DataProto], torch.Tensor] | None = None
    """the rows of a mini-batch whose loss has exactly zero gradient (bool per row), or None: those rows get
    no backward pass (`skip_no_gradient_rows`); the mini-batch's counts still include them"""
    metrics_need_forward: bool = True
    """with ``no_gradient``: the skipped rows' metric shares are not all zero, so they get a forward pass
    without a graph (when they are, only a mini-batch whose every row is skipped runs one row, to name them)"""
    loss_includes_dp_size: bool = False
    """the micro-batch loss is already multiplied by the data-parallel size (verl's convention, which the
    actor's policy losses follow: ``global_batch_info["dp_size"]``), so the loop does not multiply again"""
    metric_reductions: Mapping[str, str] = field(default_factory=dict)
    """metrics that are not shares to add up: ``"min"`` or ``"max"`` (the micro-batch loss keeps a running
    min / max of them), combined by min / max over the ranks and the mini-batches"""


def run_update(model: TrainedModel, update: RoleUpdate[C]) -> dict[str, float]:
    """Train ``model`` as ``update`` describes; one value per metric (see `summarize_metrics`)."""
    with model.resident(optimizer=True):
        return _run_update(model, update)


def _run_update(model: TrainedModel, update: RoleUpdate[C]) -> dict[str, float]:
    data, plan, prefix = update.data, update.plan, update.prefix
    model.trained.train()
    local_mini = local_mini_batch_size(plan.mini_batch_size, len(data))
    metrics: dict[str, list[float]] = defaultdict(list)
    # Drawn from the role's own generator: the same on every rank seeded alike, and untouched by
    # whatever else in the process uses torch's global generator.
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=model.generator).item())
    for mini in data.make_iterator(local_mini, epochs=plan.epochs, seed=seed, shuffle=plan.shuffle):
        model.optimizer.zero_grad(set_to_none=True)
        counts = all_reduce_sum({"tokens": mini.batch["response_mask"].sum().item(), "seqs": len(mini)})
        context = update.mini_batch_context(counts["tokens"], counts["seqs"])
        shares: dict[str, float] = defaultdict(float)
        rows = len(mini)
        mini, skipped = skip_no_gradient_rows(model, update, mini)
        if update.no_gradient is not None:
            metrics[f"{prefix}/skipped_backward_frac"].append(1.0 - len(mini) / max(rows, 1))
        micros, real = [], 0
        if len(mini):
            micros, _, real = lockstep_micro_batches(
                mini, plan.micro_batch_size, plan.max_tokens, needs_lockstep(model.trained)
            )
        if skipped is not None and (update.metrics_need_forward or not micros):
            # Their metric shares (e.g. the entropy), without a graph. Shares that are all zero need no pass, but
            # when every row is skipped one row's pass still names the metrics (with its zero shares).
            measured = skipped if update.metrics_need_forward else skipped.select_idxs(np.arange(1))
            with torch.no_grad():
                for micro in micro_batches(measured, plan.micro_batch_size, plan.max_tokens)[0]:
                    update.micro_batch_loss(micro, context, shares)
        if not micros:  # every row skipped: the zero gradient their backward would leave; AdamW still steps
            for param in model.trained.parameters():
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)
        for i, micro in enumerate(micros):
            with gradient_sync(model.trained, sync=i == len(micros) - 1):
                loss = update.micro_batch_loss(micro, context, shares if i < real else defaultdict(float))
                if i >= real:  # a pass that only keeps an FSDP rank in step: no gradient, no metrics
                    loss = loss * 0.0
                # The loss is this rank's share of the global mini-batch loss, and DDP AVERAGES gradients
                # over the ranks; scaling by the world size turns that average into the sum.
                (loss if update.loss_includes_dp_size else loss * dp_world_size()).backward()
        # Each rank holds its shares of the global mini-batch's metrics: their sum is the global value.
        for key, value in reduce_metric_shares(shares, update.metric_reductions).items():
            metrics[key].append(value)
        # DDP reduced the gradients during backward: norm, clipping and the non-finite skip see the
        # same gradients, and so decide the same, on every rank.
        grad_norm, stepped = clip_and_step(model.trained, model.optimizer, plan.grad_clip)
        record_optimizer_step(metrics, prefix, grad_norm, stepped)
    for key, how in update.metric_reductions.items():  # over the mini-batches too
        if metrics.get(key):
            metrics[key] = [min(metrics[key]) if how == "min" else max(metrics[key])]
    for key, value in update.closing_metrics.items():
        metrics[key].append(value)
    if model.lr_scheduler is not None:
        metrics[f"{prefix}/lr"].append(model.lr_scheduler.get_last_lr()[0])
        model.lr_scheduler.step()
    return summarize_metrics(metrics)


def reduce_metric_shares(shares: Mapping[str, float], reductions: Mapping[str, str]) -> dict[str, float]:
    """This rank's metric shares combined over the ranks: summed, except the ``min`` / ``max`` metrics of
    ``reductions``. Those go through the same one all-reduce (every rank's value in a slot of its own, with a
    flag saying it has one), so a rank that has none of them, e.g. no real token, still joins it in step."""
    world, rank = dp_world_size(), dp_rank()
    sums = {key: value for key, value in shares.items() if key not in reductions}
    slots: dict[str, float] = {}
    for key in reductions:
        for r in range(world):
            mine = r == rank and key in shares
            slots[f"{key}@{r}"] = float(shares[key]) if mine else 0.0
            slots[f"{key}@{r}/has"] = 1.0 if mine else 0.0
    reduced = all_reduce_sum({**sums, **slots})
    out = {key: reduced[key] for key in sums}
    for key, how in reductions.items():
        values = [reduced[f"{key}@{r}"] for r in range(world) if reduced[f"{key}@{r}/has"]]
        if values:
            out[key] = min(values) if how == "min" else max(values)
    return out


def skip_no_gradient_rows(
    model: TrainedModel, update: RoleUpdate[C], mini: DataProto
) -> tuple[DataProto, DataProto | None]:
    """``(rows to train, rows skipped or None)``. Rows whose loss has no gradient change nothing when they
    are left out of the backward, as long as the mini-batch's normalisation counts them (it is computed
    before). Only in one process: data-parallel ranks must run the same backward passes to all-reduce."""
    if update.no_gradient is None or dp_world_size() > 1 or needs_lockstep(model.trained):
        return mini, None
    skip = update.no_gradient(mini).cpu().numpy().astype(bool)
    if not skip.any():
        return mini, None
    return mini.select_idxs(np.flatnonzero(~skip)), mini.select_idxs(np.flatnonzero(skip))


def share_of_tokens(mask: torch.Tensor, global_num_tokens: float) -> float:
    """A micro-batch's share of the mini-batch's real tokens: the weight of its per-token-mean metrics."""
    return mask.sum().item() / max(global_num_tokens, 1)


__all__ = [
    "MicroBatchLoss",
    "MiniBatchContext",
    "RoleUpdate",
    "UpdatePlan",
    "reduce_metric_shares",
    "run_update",
    "share_of_tokens",
    "skip_no_gradient_rows",
]
