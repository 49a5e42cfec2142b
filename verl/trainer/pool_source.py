"""The streaming pool's batch source (fully asynchronous training and ``colocate_async``), its staleness bound,
and :func:`source_for`, which picks the source of a config's trainer mode among these and
:mod:`verl.trainer.sources`' (whose interface every source has)."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from verl.protocol import DataProto
from verl.single_controller.flow import Controller, DataChannel
from verl.trainer.plan import StepPlan
from verl.trainer.sources import (
    ROLLOUT,
    AheadSource,
    BatchSource,
    SyncSource,
    group_prompts,
    one_rank,
    staleness_metrics,
    take_prompts,
)

logger = logging.getLogger(__name__)


class PoolSource(AheadSource):
    """Fully asynchronous training (``async_training.staleness_threshold`` > 0): the rollout streams.

    verl's fully-async trainer lets the rollout generate up to (1 + staleness_threshold) x the prompts of a
    weight-sync window. Here the rollout's pool holds, besides the batches it generates ahead, ``extra``
    = ceil(staleness_threshold x train_batch_size) more prompts, and each batch is the first
    ``train_batch_size`` groups of the pool to finish (stalest first), not a fixed set of prompts: the
    slowest generations are left running and trained in a later step. With ``partial_rollout`` they go on
    under the new weights (each token's version recorded); without it they are finished under their old
    weights before the rollout takes the new ones. A group whose first token is older than ``max_staleness``
    versions, finished or not, starts again (``strategy`` drop); with wait (verl's dropless strategy) an
    unfinished one is finished first and trained once it has reached that age. Every prompt of the data order is trained exactly once::

        step s:  rollout <- submit prompts up to batch s+W plus `extra`     (W = ``ahead``)
                 rollout <- collect(the first train_batch_size groups)      (batch s+W)
                 batch s <- the rollout's earlier collect
                 (the step trains on batch s)
                 rollout <- finish_started()                                (partial_rollout=False only)
                 rollout <- the actor's weights after step s

    ``colocated`` (``trainer_mode=colocate_async``): the pool is the actor's own and generates with its
    module, so W = 0 and no weights move; ``extra`` is floor(num_warmup_batches x train_batch_size) prompts
    (verl 0.9.1's fractional windows: 1.5 is one and a half batches). Separate, a fractional
    num_warmup_batches adds its fraction's prompts to ``extra`` (the pool holds them as verl's does).
    """

    def __init__(
        self,
        extra: int,
        partial_rollout: bool,
        max_staleness: int,
        colocated: bool = False,
        ahead: int = 0,
        strategy: str = "drop",
    ) -> None:
        super().__init__(ahead, extra)
        self.colocated = colocated
        self.role = "actor_rollout" if colocated else ROLLOUT
        """whose pool: the separate rollout role's, or (colocate_async) the actor's"""
        self.partial_rollout = partial_rollout
        self.max_staleness = max_staleness
        self.strategy = strategy
        """verl's max_off_policy_strategy: what the pool does with a generation that grows too old"""
        self.submitted = 0
        self.refilled = 0
        """prompts DAPO's refills submitted besides the data order's share (the pool's size accounts for them)"""
        self.stale_samples = 0
        """samples trained so far whose first token an older policy than the step's drew (verl's count)"""
        self._pool_state: dict[str, Any] | None = None

    def _prime(self, flow: Controller) -> None:
        if self._pool_state is not None:  # a resumed run's generations in flight, back into the rollout
            flow.groups[self.role].load_pool(self._pool_state)
            self._pool_state = None

    def _declare_generation(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
    ) -> None:
        size = plan.train_batch_size
        first = step if not self.pending else step + self.ahead
        last = min(step + self.ahead, plan.total_steps)
        # prompts the rollout should have had by now (refills besides)
        target = min(plan.total_steps * size, last * size + self.extra) + self.refilled
        self.queued.append(prompts)
        while self.submitted + sum(len(q) for q in self.queued) < target:  # prompts received so far
            self.queued.append(next(more))
        if self.submitted < target:
            self._submit(flow, plan, target - self.submitted)
        for ahead in range(first, last + 1):
            self.pending.append([
                flow.call(
                    self.role, "collect", num_groups=size, train_step=ahead, max_staleness=self.max_staleness,
                    strategy=self.strategy, name="generate_async", background=True,
                )
            ])  # fmt: skip

    def _submit(self, flow: Controller, plan: StepPlan, count: int) -> None:
        """The next ``count`` prompts of the data order, as groups, into the rollout's pool."""
        self._submit_prompts(flow, plan, take_prompts(self.queued, count))

    def _submit_prompts(self, flow: Controller, plan: StepPlan, prompts: DataProto) -> None:
        groups = group_prompts(flow, plan, prompts, f"p{self.submitted}", self.role, background=True)
        self.submitted += len(prompts)
        flow.call(self.role, "submit", prompts=groups, name="submit", background=True)

    def refill(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, attempt: int
    ) -> DataChannel:
        """DAPO's refill, from the pool: the prompts join it, and as many groups as they make are collected
        (the first to finish: older unfinished ones may come first)."""
        self._submit_prompts(flow, plan, prompts)
        self.refilled += len(prompts)
        collect = dict(
            num_groups=len(prompts), train_step=step, max_staleness=self.max_staleness, strategy=self.strategy
        )
        answer = flow.call(self.role, "collect", **collect, name="gen_refill")
        return flow.driver(one_rank, name="refill_batch", answer=answer)

    def _batch_metrics(self, batch: DataProto, step: int) -> dict[str, float]:
        metrics = staleness_metrics(batch, step)
        first = np.asarray(batch.non_tensor_batch["min_global_steps"], dtype=np.int64)
        last = np.asarray(batch.non_tensor_batch["max_global_steps"], dtype=np.int64)
        self.stale_samples += int(np.sum(first < step - 1))
        partial = first != last
        metrics.update(
            {
                "fully_async/partial/total_partial_num": float(partial.sum()),
                "fully_async/partial/partial_ratio": float(partial.mean()),
                "fully_async/partial/max_partial_span": float(np.max(last - first)),
                "fully_async/count/stale_samples_processed": float(self.stale_samples),
                "fully_async/pool/groups": float(batch.meta_info.get("pool_groups", 0)),
            }
        )
        if self.strategy == "wait":  # (not verl's: it logs no count of the generations it waited for)
            metrics["fully_async/count/waited_groups"] = float(batch.meta_info.get("waited_groups", 0))
        # (wait: finished groups left over a batch after they reached the bound, past it by the next collect)
        metrics["fully_async/count/restarted_groups"] = float(batch.meta_info.get("restarted_groups", 0))
        return metrics

    def _before_sync(self, flow: Controller, step: int) -> None:
        if not self.partial_rollout:
            flow.call(self.role, "finish_started", train_step=step, name="finish_started", background=True)

    def _sync_weights(self, flow: Controller, version: int) -> None:
        if not self.colocated:  # colocated, the pool generates with the actor's own module
            super()._sync_weights(flow, version)

    def validation_role(self, flow: Controller, step: int) -> str:
        return self.role if self.colocated else super().validation_role(flow, step)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._last_sync is not None:
            self._last_sync.get()  # the rollout has done everything declared: its pool is settled
        pool = self._pool_state
        if self._flow is not None and self._primed:
            pool = self._flow.groups[self.role].pool_state()[0]
        state.update(
            queued=list(self.queued),
            submitted=self.submitted,
            refilled=self.refilled,
            stale_samples=self.stale_samples,
            pool=pool,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.queued = deque(state["queued"])
        self.submitted = int(state["submitted"])
        self.refilled = int(state.get("refilled", 0))
        self.stale_samples = int(state["stale_samples"])
        self._pool_state = state["pool"]


def source_for(config: Any, plan: StepPlan) -> BatchSource:
    """The source of ``trainer.v1.trainer_mode``: sync, separate_async (streaming when
    ``async_training.staleness_threshold`` > 0) or colocate_async (the actor's own pool)."""
    fully, v1 = config.async_training, config.trainer.v1
    size = plan.train_batch_size
    pool = dict(
        max_staleness=staleness_bound(v1.sampler.max_off_policy_threshold),
        strategy=v1.sampler.max_off_policy_strategy,
    )
    if v1.trainer_mode == "colocate_async":  # verl's: num_warmup_batches more batches in flight (1.5: 1.5 x)
        extra = math.floor(v1.colocate_async.num_warmup_batches * size)
        _warn_if_carried_over_is_dropped(v1.sampler, lag=0)
        return PoolSource(extra=extra, partial_rollout=True, colocated=True, **pool)
    if v1.trainer_mode != "separate_async":
        return SyncSource()
    ahead, extra = warmup_window(v1.separate_async.num_warmup_batches, size)
    if fully.staleness_threshold <= 0:
        return AheadSource(ahead, extra)
    _warn_if_carried_over_is_dropped(v1.sampler, lag=ahead)
    return PoolSource(
        extra=extra + math.ceil(fully.staleness_threshold * size),
        partial_rollout=bool(fully.partial_rollout),
        ahead=ahead,
        **pool,
    )


def warmup_window(batches: float, size: int) -> tuple[int, int]:
    """verl 0.9.1's ``num_warmup_batches`` as (whole batches, prompts more): floor(batches x ``size``) prompts in
    all, as verl's asynchronous trainers fetch them one prompt at a time (1.5 x 4: one batch and 2 prompts)."""
    whole = math.floor(batches)
    return whole, math.floor(batches * size) - whole * size


def _warn_if_carried_over_is_dropped(sampler: Any, lag: int) -> None:
    """A pool ``lag`` versions behind the trainer trains a generation carried over a batch (finished early, or
    still running) with a span of at least ``lag`` + 2 versions: under a smaller bound, ``drop`` starts every
    such generation again, and the pool's extra prompts only generate to be thrown away. (``wait`` is refused
    there at start-up: it cannot hold such a bound.)"""
    bound = sampler.max_off_policy_threshold
    if sampler.max_off_policy_strategy == "drop" and bound is not None and bound < lag + 2:
        logger.warning(
            "trainer.v1.sampler.max_off_policy_threshold=%d: every generation the pool carries over a batch "
            "trains with a span of at least %d versions, so each is started again and its tokens thrown away "
            "(fully_async/count/restarted_groups); a threshold of %d or more trains them",
            bound, lag + 2, lag + 2,
        )  # fmt: skip


NO_BOUND = 2**31
"""``max_staleness`` for verl 0.9.1's ``max_off_policy_threshold=null``: older than any run, so no unfinished
generation is ever restarted"""


def staleness_bound(threshold: int | None) -> int:
    """The pool's ``max_staleness`` for ``trainer.v1.sampler.max_off_policy_threshold`` (null: no bound). verl
    counts a prompt's versions inclusively, ``(global_steps - prompt_step + 1) / parameter_sync_step``, and
    lets through at most ``threshold``: a first token at most ``threshold - 1`` versions older than the policy
    it trains."""
    return NO_BOUND if threshold is None else int(threshold) - 1
