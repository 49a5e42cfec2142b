"""The RL step of ``trainer.v1.trainer_mode=separate_async``: the rollout role generates ahead of the trainer.

verl's one-step-off order, generalised to ``num_warmup_batches`` = W batches ahead::

    step s:  rollout ← generate(batch s+W)        (queued behind the weights of step s-1)
             batch s ← the rollout's earlier answer (waiting only if it is not finished)
             train on batch s                     (score ∥ log-probs → advantages → critic → actor)
             rollout ← the actor's weights after step s

The rollout role does one thing at a time, in the order the calls were declared, so generation of batch
s+W overlaps the training of batch s, and batch s+W is drawn by the policy of step s-1: W versions older
than the one it trains (W = 0 is the synchronous trainer, computed by another worker). Each sample carries
its version (``max_global_steps``), and the step logs verl's staleness metrics.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from verl.protocol import DataProto
from verl.single_controller.flow import Controller, DataChannel
from verl.trainer.plan import StepPlan
from verl.trainer.step import StepResult, train_on, with_group_ids

ROLLOUT = "rollout"
"""the role name of the separate rollout workers"""


class SeparateAsyncStep:
    """The step function (``fn(flow, plan, step, prompts, more)``) with the batches in flight between steps.

    ``pending`` holds the batches generated ahead, oldest first: channels of the rollout role, or batches
    restored from a checkpoint. The trainer's loop hands each step the next prompts of the data order; the
    first step also takes W more from ``more``, so every batch is trained in data order.
    """

    def __init__(self) -> None:
        self.pending: deque[DataChannel | DataProto] = deque()
        self._last_sync: DataChannel | None = None
        self._primed = False

    def __call__(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
    ) -> StepResult:
        if not self._primed:  # the rollout starts from the actor's weights (a resume's included)
            self._sync_weights(flow, version=step - 1)
            self._primed = True
        depth = plan.rollout_ahead or 0
        if not self.pending:  # the first step, a resume that had nothing in flight, or W = 0
            self._generate(flow, plan, step, prompts)
            for ahead in range(step + 1, min(step + depth, plan.total_steps) + 1):
                self._generate(flow, plan, ahead, next(more))
        elif step + depth <= plan.total_steps:
            self._generate(flow, plan, step + depth, prompts)
        batch = self.pending.popleft()
        metrics: dict[str, float] = {}
        if isinstance(batch, DataChannel):
            start = time.perf_counter()
            ready = batch.get()
            metrics["timing_s/gen"] = time.perf_counter() - start  # the trainer's wait (verl's meaning here)
            metrics["timing_s/generate_async"] = flow.seconds(batch)
            batch = ready
        else:
            metrics["timing_s/gen"] = 0.0
        # A batch restored from a checkpoint comes back with contiguous tensors; the same layout either way
        # keeps a resumed run's float sums those of the uninterrupted one.
        batch = batch.select()  # (a channel's value is never changed in place)
        for key, tensor in list(batch.batch.items()):
            batch.batch[key] = tensor.contiguous()
        metrics.update(staleness_metrics(batch, step))
        if self._last_sync is not None and self._last_sync.ready():
            metrics["timing_s/update_weights"] = flow.seconds(self._last_sync)
        result = train_on(flow, plan, step, batch, more, [metrics])
        self._sync_weights(flow, version=step)
        return result

    def _generate(self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto) -> None:
        groups = with_group_ids(prompts, f"{step}-0").repeat(plan.n, interleave=True)
        self.pending.append(
            flow.call(ROLLOUT, "generate_sequences", prompts=groups, name="generate_async", background=True)
        )

    def _sync_weights(self, flow: Controller, version: int) -> None:
        """The actor's weights (after its last update, in the actor role's order) into the rollout, queued
        behind the generations already declared there. Neither call holds up the end of the step."""
        weights = flow.call("actor_rollout", "get_weights", name="get_weights", background=True)
        self._last_sync = flow.call(
            ROLLOUT, "set_weights", weights=weights, version=version, name="update_weights", background=True
        )

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The batches in flight, finished (a checkpoint waits for them): a resume trains exactly these."""
        return {"pending": [b.get() if isinstance(b, DataChannel) else b for b in self.pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = deque(state.get("pending", []))


def staleness_metrics(batch: DataProto, step: int) -> dict[str, float]:
    """verl's ``training/off_policy/trajectory_staleness/*``: policy versions between a sample's last token and
    the policy this step trains, (step - 1) - max_global_steps; and how long the rollout sat idle before it
    generated the batch (``timing_s/rollout_idle``)."""
    versions = batch.non_tensor_batch.get("max_global_steps")
    if versions is None:
        return {}
    staleness = (step - 1) - np.asarray(versions, dtype=np.int64)
    metrics = {
        f"training/off_policy/trajectory_staleness/{name}": float(fn(staleness))
        for name, fn in (("mean", np.mean), ("max", np.max), ("min", np.min))
    }
    idle = batch.meta_info.get("rollout_idle_s")
    if idle is not None:
        metrics["timing_s/rollout_idle"] = float(idle)
    return metrics
