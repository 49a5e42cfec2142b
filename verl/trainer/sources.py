"""Batch sources: where the one RL step (:func:`verl.trainer.step.rl_step`) takes the batch it trains on.

The step is the same in every trainer mode; the mode (``trainer.v1.trainer_mode``, ``async_training``)
only chooses the source:

- :class:`SyncSource` (``sync``): generate the step's groups now, on the actor's workers (verl's hybrid
  engine), with ReMax's greedy baseline first when the estimator needs it.
- :class:`AheadSource` (``separate_async``): a rollout role of its own generates ``num_warmup_batches``
  batches ahead; after each update the actor's weights are copied to it (verl's one-step-off order,
  generalised to W batches ahead).
- :class:`~verl.trainer.pool_source.PoolSource` (``separate_async`` with ``async_training.staleness_threshold``
  > 0, and ``colocate_async``): prompts go into a streaming pool, each batch is the first groups to finish,
  unfinished generations carry over the weight updates (partial rollouts, each token's version kept).
  :func:`~verl.trainer.pool_source.source_for` picks the source of a config's mode.

A source is asked for a batch (:meth:`BatchSource.batch`), for more groups by DAPO's dynamic sampling
(:meth:`BatchSource.refill`), is told when the step's update is declared (:meth:`BatchSource.step_done`:
the weight sync), and checkpoints its own state (:meth:`BatchSource.state_dict`), so a resume trains
exactly what the uninterrupted run did in every mode. Groups are formed by :mod:`verl.trainer.groups`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from verl.protocol import DataProto
from verl.single_controller.channels import resolved
from verl.single_controller.flow import Controller, DataChannel
from verl.trainer.groups import groups_of, repeat_with_baselines, with_group_ids
from verl.trainer.plan import StepPlan
from verl.workers.rollout.base import concat_prompts

ROLLOUT = "rollout"
"""the role name of the separate rollout workers"""

Metrics = list[DataChannel | dict[str, float]]


def generate_groups(
    flow: Controller,
    plan: StepPlan,
    prompts: DataProto,
    tag: str,
    role: str = "actor_rollout",
    name: str = "gen",
    background: bool = False,
) -> DataChannel:
    """Give each prompt a uid (its group), repeat it ``plan.n`` times and sample the responses on ``role``
    (``background``: calls that may outlive the step that declares them, as generation ahead does).

    ReMax (Li et al. 2023, arXiv 2310.10505): first one greedy response per prompt, whose reward becomes
    the baseline of the prompt's group (``reward_baselines``).
    """
    groups = group_prompts(flow, plan, prompts, tag, role, background)
    return flow.call(role, "generate_sequences", prompts=groups, name=name, background=background)


def group_prompts(
    flow: Controller, plan: StepPlan, prompts: DataProto, tag: str, role: str, background: bool = False
) -> DataProto | DataChannel:
    """The prompts as groups (:func:`groups_of`), with ReMax's greedy baseline (generated on ``role`` and
    scored) when the estimator needs one."""
    if not plan.remax_baseline:
        return groups_of(prompts, plan.n, tag)
    prompts = with_group_ids(prompts, tag)
    greedy = flow.call(
        role, "generate_sequences", prompts=prompts, validate=True, name="gen_max", background=background
    )
    greedy_scores = flow.call(
        "reward", "compute_score", data=greedy, validate=True, name="reward_max", background=background
    )
    return flow.driver(
        repeat_with_baselines, name="remax_baseline", prompts=prompts, scores=greedy_scores, n=plan.n,
        background=background,
    )  # fmt: skip


class BatchSource:
    """Where the step's batch comes from. ``batches`` counts the batches handed out (a custom step in an
    asynchronous mode that never asks is refused after its first step)."""

    role = "actor_rollout"
    """the role that generates the training batches"""

    def __init__(self) -> None:
        self.batches = 0

    def batch(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
    ) -> tuple[DataChannel | DataProto, Metrics]:
        """The groups step ``step`` trains on (``prompts`` are the step's prompts of the data order; ``more``
        the prompts after them), and metric dicts about how they were made."""
        self.batches += 1
        return self._batch(flow, plan, step, prompts, more)

    def _batch(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
    ) -> tuple[DataChannel | DataProto, Metrics]:
        raise NotImplementedError

    def refill(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, attempt: int
    ) -> DataChannel:
        """DAPO's dynamic sampling: groups of further ``prompts``, generated now (``attempt``: 1, 2, ...)."""
        return generate_groups(flow, plan, prompts, tag=f"{step}-{attempt}")

    def step_done(self, flow: Controller, plan: StepPlan, step: int) -> None:
        """The step's update is declared: what the source does after it (the asynchronous weight sync)."""

    def validation_role(self, flow: Controller, step: int) -> str:
        """The role that generates with the policy trained for ``step`` steps, for validation: the role
        that generates the training batches (the actor's, or the separate rollout role once it has the
        weights), so no second engine is started."""
        return "actor_rollout"

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class SyncSource(BatchSource):
    """``trainer_mode=sync``: the step's groups are generated now, by the policy being trained."""

    def _batch(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
    ) -> tuple[DataChannel, Metrics]:
        return generate_groups(flow, plan, prompts, tag=f"{step}-0"), []


class AheadSource(BatchSource):
    """``trainer_mode=separate_async``: the rollout role generates W = ``num_warmup_batches`` batches ahead::

        step s:  rollout ← generate(batch s+W)        (queued behind the weights of step s-1)
                 batch s ← the rollout's earlier answer (waiting only if it is not finished)
                 (the step trains on batch s)
                 rollout ← the actor's weights after step s

    The rollout role does one thing at a time, in the order the calls were declared, so generation of batch
    s+W overlaps the training of batch s, and batch s+W is drawn by the policy of step s-1: W versions older
    than the one it trains (W = 0 is the synchronous trainer, computed by another worker). Each sample
    carries its version (``max_global_steps``), and the step logs verl's staleness metrics.

    A fractional W (verl 0.9.1's: ``ahead`` whole batches plus ``extra`` = floor(fraction x train_batch_size)
    prompts) keeps exactly that many prompts in flight: by step s the rollout has had the prompts up to
    (s + ahead) x train_batch_size + extra of the data order, so each step hands it the tail of one batch and
    the head of the next, each part generated by one call. A batch is still a fixed set of prompts in data
    order: its first ``extra`` prompts drawn by the policy of step s-ahead-2, the rest by that of step
    s-ahead-1 (1.5: half the batch one version old, half two).

    ``pending`` holds the batches in flight, oldest (the next trained) first, each as the parts generated so
    far: channels of the rollout role, or batches restored from a checkpoint. The first step also takes from
    ``more`` the prompts batches it needs, so every batch is trained in data order.
    """

    role = ROLLOUT

    def __init__(self, ahead: int = 1, extra: int = 0) -> None:
        super().__init__()
        self.ahead = ahead
        """whole batches generated ahead of the one trained"""
        self.extra = extra
        """prompts in flight beyond those (a fractional window)"""
        self.pending: deque[list[DataChannel | DataProto]] = deque()
        self.queued: deque[DataProto] = deque()
        """prompts of the data order received from the trainer's loop, not yet handed to the rollout"""
        self.generated: int | None = 0
        """prompts of the data order handed to the rollout so far (None: a checkpoint that did not count them)"""
        self._last_sync: DataChannel | None = None
        self._primed = False
        self._flow: Controller | None = None

    def _batch(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
    ) -> tuple[DataProto, Metrics]:
        self._start(flow, version=step - 1)
        self._declare_generation(flow, plan, step, prompts, more)
        parts = self.pending.popleft()
        channels = [part for part in parts if isinstance(part, DataChannel)]
        start = time.perf_counter()
        batch = _joined([_finished(part) for part in parts])
        metrics: dict[str, float] = {"timing_s/gen": time.perf_counter() - start if channels else 0.0}
        if channels:  # the trainer's wait (verl's meaning here), and the rollout's own time
            metrics["timing_s/generate_async"] = sum(flow.seconds(channel) for channel in channels)
        # A batch restored from a checkpoint comes back with contiguous tensors; the same layout either way
        # keeps a resumed run's float sums those of the uninterrupted one.
        batch = batch.select()  # (a channel's value is never changed in place)
        for key, tensor in list(batch.batch.items()):
            batch.batch[key] = tensor.contiguous()
        metrics.update(self._batch_metrics(batch, step))
        if self._last_sync is not None and self._last_sync.ready():
            metrics["timing_s/update_weights"] = flow.seconds(self._last_sync)
        return batch, [metrics]

    def step_done(self, flow: Controller, plan: StepPlan, step: int) -> None:
        self._before_sync(flow, step)
        self._sync_weights(flow, version=step)

    def validation_role(self, flow: Controller, step: int) -> str:
        self._start(flow, version=step)  # (validation before the first step: the weights it starts from)
        return ROLLOUT

    def _start(self, flow: Controller, version: int) -> None:
        """The first time: the rollout takes the actor's weights (a resume's included) as ``version``."""
        self._flow = flow
        if not self._primed:
            self._prime(flow)
            self._sync_weights(flow, version=version)
            self._primed = True

    def _prime(self, flow: Controller) -> None:
        """Before the first weight sync (at the start, or of a resumed run)."""

    def _declare_generation(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, more: Iterator[DataProto]
    ) -> None:
        """Queue the generation of the prompts the rollout should have by step ``step``: those of batches up
        to ``step + ahead`` and ``extra`` more (none past the last step), one call per part of a batch."""
        size = plan.train_batch_size
        if self.generated is None:  # a checkpoint from before the count: whole batches were in flight
            self.generated = (step - 1 + len(self.pending)) * size
        target = min(plan.total_steps * size, (step + self.ahead) * size + self.extra)
        feed = itertools.chain([prompts], more)
        while self.generated + sum(len(q) for q in self.queued) < target:
            self.queued.append(next(feed))
        while self.generated < target:
            batch_step, offset = divmod(self.generated, size)
            count = min(target - self.generated, size - offset)
            self._generate(flow, plan, step, batch_step + 1, offset, take_prompts(self.queued, count))
            self.generated += count

    def _batch_metrics(self, batch: DataProto, step: int) -> dict[str, float]:
        return staleness_metrics(batch, step)

    def _before_sync(self, flow: Controller, step: int) -> None:
        """After the step's update is declared, before the rollout takes the new weights."""

    def _generate(
        self, flow: Controller, plan: StepPlan, step: int, batch_step: int, offset: int, prompts: DataProto
    ) -> None:
        """Queue the generation of ``prompts``, those from ``offset`` on of the batch of step ``batch_step``."""
        tag = f"{batch_step}-0" if offset == 0 else f"{batch_step}-0+{offset}"
        while len(self.pending) <= batch_step - step:  # pending[0] is the batch of this step
            self.pending.append([])
        self.pending[batch_step - step].append(
            generate_groups(flow, plan, prompts, tag, ROLLOUT, "generate_async", background=True)
        )

    def refill(
        self, flow: Controller, plan: StepPlan, step: int, prompts: DataProto, attempt: int
    ) -> DataChannel:
        """DAPO's refill, from the rollout role: generated with the weights it holds, after the batches
        already queued there."""
        return generate_groups(flow, plan, prompts, f"{step}-{attempt}", ROLLOUT, "gen_refill")

    def _sync_weights(self, flow: Controller, version: int) -> None:
        """The actor's weights (after its last update, in the actor role's order) into the rollout, queued
        behind the generations already declared there. Neither call holds up the end of the step."""
        # after the first (whole) copy, LoRA's adapters alone: the base never changes
        weights = flow.call(
            "actor_rollout", "get_weights", trained_only=self._primed, name="get_weights", background=True
        )
        self._last_sync = flow.call(
            ROLLOUT, "set_weights", weights=weights, version=version, name="update_weights", background=True
        )

    def state_dict(self) -> dict[str, Any]:
        """The batches in flight, finished (a checkpoint waits for them; a batch part generated, as that
        part), and the prompts received for later ones: a resume trains exactly these."""
        pending = [_joined([_finished(part) for part in parts]) for parts in self.pending]
        return {"pending": pending, "queued": list(self.queued), "generated": self.generated}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = deque([batch] for batch in state.get("pending", []))
        self.queued = deque(state.get("queued", []))
        self.generated = state.get("generated")


def _finished(batch: DataChannel | DataProto) -> DataProto:
    return one_rank(resolved(batch))


def _joined(parts: list[DataProto]) -> DataProto:
    """A batch generated in parts (a fractional window), in order: the rows concatenated, and the rollout's
    per-call figures in ``meta_info`` (seconds, bytes, counts: all additive) summed."""
    if len(parts) == 1:
        return parts[0]
    batch = DataProto.concat(parts)
    for key, value in batch.meta_info.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            batch.meta_info[key] = sum(part.meta_info.get(key, 0) for part in parts)
    return batch


def take_prompts(queued: deque[DataProto], count: int) -> DataProto:
    """The first ``count`` prompts of ``queued`` (batches of the data order), removed from it."""
    parts = []
    while count > 0:
        head = queued.popleft()
        if len(head) > count:
            head, rest = head[:count], head[count:]
            queued.appendleft(rest)
        parts.append(head)
        count -= len(head)
    return concat_prompts(parts) if len(parts) > 1 else parts[0]  # (batches of different widths)


def one_rank(answer: DataProto | list[DataProto]) -> DataProto:
    """The batch of a call to a one-rank role, or rank 0's of a ONE_TO_ALL call (every rank's is the same)."""
    return answer[0] if isinstance(answer, list) else answer


def staleness_metrics(batch: DataProto, step: int) -> dict[str, float]:
    """verl's ``training/off_policy/*`` of a batch trained at ``step`` (the policy of step - 1 generated the
    freshest samples possible), each as mean / max / min over the samples: ``trajectory_staleness`` (policy
    versions between a sample's last token and that policy), ``trajectory_staleness_worst`` (the same of its
    first token: a generation continued or finished under newer weights shows its age here) and
    ``trajectory_spans`` (the versions it was drawn across); and how long the rollout sat idle before it
    generated the batch (``timing_s/rollout_idle``)."""
    last = batch.non_tensor_batch.get("max_global_steps")
    if last is None:
        return {}
    last = np.asarray(last, dtype=np.int64)
    first = np.asarray(batch.non_tensor_batch.get("min_global_steps", last), dtype=np.int64)
    metrics: dict[str, float] = {}
    for quantity, values in (
        ("trajectory_staleness", (step - 1) - last),
        ("trajectory_staleness_worst", (step - 1) - first),
        ("trajectory_spans", last - first + 1),
    ):
        for name, fn in (("mean", np.mean), ("max", np.max), ("min", np.min)):
            metrics[f"training/off_policy/{quantity}/{name}"] = float(fn(values))
    idle = batch.meta_info.get("rollout_idle_s")
    if idle is not None:
        metrics["timing_s/rollout_idle"] = float(idle)
    return metrics
