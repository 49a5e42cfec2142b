"""The one generation component: :class:`RolloutHost` does all generating, whichever worker holds it.

The actor's workers hold one over the policy they train (verl's hybrid engine: the rollout of the synchronous
trainer, and the streaming pool of ``colocate_async``); the separate rollout role's worker
(``separate_async``, :mod:`verl.workers.rollout_worker`) holds one over its own copy of the policy. Either
way the host owns:

- the engine (``rollout.name``: fast, hf, vllm, sglang, dummy), built with the options its kind needs;
- the version of the weights its model holds, and the sync of an engine with weights of its own (vllm,
  sglang) to that version before it generates;
- the server (``rollout.mode=async``) and the agent loops (multi-turn, tools) over it;
- the streaming pool (submit / collect / finish the started generations) and its checkpoint state: of single
  responses, or of agent-loop trajectories (:mod:`verl.workers.rollout.agent_pool`);
- a tensor-parallel engine's rank group.

Engines differ only behind it. The worker that holds it says how to make its model's weights available
(``resident``: on the device; ``gathered``: whole, for an engine that computes with the module) and, for a
pool, which policy version a collect for a given train step generates with.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from verl.agent_loop import AgentLoopRunner, uses_agent_loop
from verl.agent_loop.runner import default_agent_loop
from verl.models import eos_token_ids
from verl.models.loading import resolve_dtype
from verl.protocol import DataProto
from verl.single_controller import Dispatch, register
from verl.utils.precision import ComputeDtype, rollout_compute_dtype
from verl.workers.engine.distributed import gather_rows, shared_seed
from verl.workers.engine.trained import with_tied_names
from verl.workers.rollout import SamplingParams, get_rollout_class
from verl.workers.rollout.agent_pool import AgentPool
from verl.workers.rollout.base import with_prompt_fields
from verl.workers.rollout.chunked import decode_in_chunks
from verl.workers.rollout.server import RolloutServer, generate_batch
from verl.workers.rollout.stats import SERVER_CALLS, SERVER_REQUESTS, SYNC_BUCKETS, SYNC_BYTES, SYNC_SECONDS
from verl.workers.rollout.streaming import StreamingPool
from verl.workers.rollout.weight_sync import sync_settings

VERSION_KEYS = ("min_global_steps", "max_global_steps")
"""verl's per-sample fields: the policy versions the sample's first and last tokens were drawn with"""

Context = Callable[[], contextlib.AbstractContextManager]


def sampling_params(config: Any, validate: bool) -> SamplingParams:
    """How the rollout samples: ``rollout`` (or, validating, ``rollout.val_kwargs``) of a trainer config."""
    rollout_cfg = config.actor_rollout_ref.rollout
    section = rollout_cfg.val_kwargs if validate else rollout_cfg
    return SamplingParams.from_config(section, config.data.max_response_length, rollout_cfg.ignore_eos)


class RolloutHost:
    """The engine over ``model`` and everything around it; see the module docstring.

    ``compute``: the compute dtype of the role whose module an in-process engine runs (``rollout.dtype``
    may override it). ``engine_group``: the ranks sharing one tensor-parallel engine (None: this rank's
    alone). ``pool_version(train_step)``: the version a pool collect for ``train_step`` generates with
    (default: the version held).
    """

    def __init__(
        self,
        config: Any,
        model: torch.nn.Module,
        tokenizer: Any,
        device: torch.device,
        rank: int,
        compute: ComputeDtype,
        *,
        resident: Context = contextlib.nullcontext,
        gathered: Context = contextlib.nullcontext,
        engine_group: Any = None,
        pool_version: Callable[[int], int] | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.device = device
        self.resident, self.gathered = resident, gathered
        self.engine_group = engine_group
        self._pool_version = pool_version
        self.eos_token_ids = eos_token_ids(tokenizer, model)
        self.pad_token_id = tokenizer.pad_token_id
        self.rank = rank
        self.compute = compute
        self._tokenizer = tokenizer
        self._engine: Any = None
        self.server: RolloutServer | None = None
        self.agent: AgentLoopRunner | None = None
        """the agent loops (multi-turn, tools), over the server; None: one reply per prompt"""
        self.version = 0
        """the policy version ``model`` holds (bumped by the owner at every update, load or weight copy)"""
        self.pool = self._pool(uses_agent_loop(config.actor_rollout_ref.rollout))
        self._idle_from: float | None = None
        """when the last generation ended: the rollout sits idle from then until the next one starts"""
        self._synced_since: list[float] = [0.0, 0, 0]
        """seconds, bytes and buckets of the weight syncs since the last batch (the engine's, and copies into the
        model: `count_sync`)"""
        self._copied = False
        """whether weights were copied into the model since the last batch"""
        sync_settings(config)  # (the checkpoint engine's keys, read early: a bad value fails at start-up)
        self._server_seen = (0, 0)
        """the server's requests answered and engine calls at the last batch"""

    @property
    def engine(self) -> Any:
        """The engine, built at its first use: a host that never generates (the actor's, when a separate
        rollout role generates) starts no engine, and an engine with weights of its own loads no second copy."""
        if self._engine is None:
            self._start()
        return self._engine

    def _start(self) -> None:
        """Build the engine (with the options its kind needs), the server and the agent loops the config asks for."""
        arr = self.config.actor_rollout_ref
        engine_cls = get_rollout_class(arr.rollout.name)
        options: dict[str, Any] = {}
        if engine_cls.owns_weights:
            # an inference engine (vllm): its own copy of the weights, its own settings
            options = {
                "config": arr.rollout,
                "max_model_len": self.config.data.max_prompt_length + self.config.data.max_response_length,
                "seed": self.config.trainer.seed + self.rank,
                "device": self.device,
                "merge_lora": arr.model.lora_merge,
            }
        micro = arr.rollout.micro_batch_size
        engine = engine_cls(self.model, self.eos_token_ids, self.pad_token_id, micro, **options)
        engine.calculate_log_probs = bool(arr.rollout.calculate_log_probs)
        if not engine_cls.owns_weights:
            # it computes with the module: in its role's dtype unless rollout.dtype says otherwise
            engine.compute_dtype = rollout_compute_dtype(arr.rollout.dtype, self.compute, self.model)
        self._engine = engine
        if arr.rollout.mode == "async":
            self.server = RolloutServer(engine, arr.rollout.max_num_seqs)
        if uses_agent_loop(arr.rollout):
            self.agent = self._agent_runner()

    def _pool(self, agent_loops: bool) -> StreamingPool | AgentPool:
        """The streaming pool: of responses, or of agent-loop trajectories (multi-turn, tools). The same seed on
        every rank: each holds the same pool."""
        sampling, seed = self.sampling(False), int(self.config.trainer.seed)
        if not agent_loops:
            return StreamingPool.for_sampling(
                sampling, self.eos_token_ids, self.pad_token_id, seed, self.device
            )

        def runner(submit: Any) -> AgentLoopRunner:
            return AgentLoopRunner(
                self.config, self._tokenizer, submit, self.eos_token_ids, self.pad_token_id
            )

        stops = sampling.stop_tokens(self.eos_token_ids)
        return AgentPool(runner, sampling, stops, self.pad_token_id, seed, self.device)

    def submit(self, prompts: DataProto) -> None:
        """Hand prompts (repeated ``n`` times, with their group's ``uid``) to the pool; generated by collects.
        Data that names an agent loop per sample turns an empty pool of responses into one of trajectories."""
        if "agent_name" in prompts.non_tensor_batch and isinstance(self.pool, StreamingPool):
            if len(self.pool):
                raise ValueError("prompts naming agent loops (agent_name) joined a pool of single responses")
            self.pool = self._pool(agent_loops=True)
        self.pool.submit(prompts)

    def load_pool(self, state: dict[str, Any]) -> None:
        """A pool's checkpoint (of trajectories or of responses, as the pool that saved it held)."""
        trajectories = any("turns" in row for rows in state["rows"].values() for row in rows)
        if trajectories != isinstance(self.pool, AgentPool):
            self.pool = self._pool(trajectories)
        self.pool.load_state_dict(state)

    def sampling(self, validate: bool) -> SamplingParams:
        return sampling_params(self.config, validate)

    def describe(self) -> str:
        """The start-up line of what generates here, as the engine will be built (it is not started for it:
        an engine started out of turn, before a resumed run's first step, changed that run)."""
        rollout = self.config.actor_rollout_ref.rollout
        engine_cls = get_rollout_class(rollout.name)
        param = next(self.model.parameters())
        if engine_cls.owns_weights:
            dtype = resolve_dtype(rollout.dtype) if rollout.dtype else param.dtype
        else:
            dtype = rollout_compute_dtype(rollout.dtype, self.compute, self.model) or param.dtype
        parts = [engine_cls.describe(dtype, self.device), f"rollout.mode={rollout.mode}"]
        if rollout.mode == "async" or uses_agent_loop(rollout):
            parts.append(f"served (max_num_seqs {rollout.max_num_seqs})")
        if uses_agent_loop(rollout):
            parts.append(f"agent loop {default_agent_loop(rollout)}")
        if self.engine_group is not None:
            parts.append(f"tensor-parallel over {self.engine_group.size()} ranks")
        return "; ".join(parts)

    def _stats(self, syncs: bool = True) -> dict[str, float]:
        """The server's traffic since the last batch and (``syncs``) the weight syncs since the last one that
        counted them (`verl.workers.rollout.stats`)."""
        stats: dict[str, float] = {}
        if syncs and (self._copied or (self._engine is not None and self._engine.owns_weights)):
            seconds, nbytes, buckets = self._synced_since
            stats = {SYNC_SECONDS: seconds, SYNC_BYTES: nbytes, SYNC_BUCKETS: buckets}
            self._synced_since, self._copied = [0.0, 0, 0], False
        if self.server is not None:
            seen = (self.server.requests_answered, self.server.engine_calls)
            stats[SERVER_REQUESTS] = seen[0] - self._server_seen[0]
            stats[SERVER_CALLS] = seen[1] - self._server_seen[1]
            self._server_seen = seen
        return stats

    def _agent_runner(self) -> AgentLoopRunner:
        """Agent loops need a server (each sample's turns are separate requests): mode=async's, or one of
        their own."""
        if self.server is None:
            self.server = RolloutServer(self.engine, self.config.actor_rollout_ref.rollout.max_num_seqs)
        server = self.server
        return AgentLoopRunner(
            self.config,
            self._tokenizer,
            server.generate,
            self.eos_token_ids,
            self.pad_token_id,
            submit_all=server.generate_all,
        )

    # ------------------------------------------------------------------ one batch

    def generate(self, prompts: DataProto, validate: bool = False, tag_version: bool = False) -> DataProto:
        """Sample responses to ``prompts`` (on the host's device) with the weights held now; ``validate`` samples
        with ``rollout.val_kwargs``. The prompts' other fields come back with the output. ``tag_version``: every
        row carries the version (verl's ``min_global_steps`` / ``max_global_steps``) and the batch the time
        the rollout sat idle before it (``rollout_idle_s``)."""
        start = time.perf_counter()
        with torch.no_grad(), self.resident():
            output = self._generate(prompts, self.sampling(validate))
        output = with_prompt_fields(output, prompts)
        stats = self._stats(syncs=not validate)  # (a validation's syncs count toward the next training batch)
        if not validate:
            output.meta_info.update(stats)
        if tag_version:
            for key in VERSION_KEYS:
                output.non_tensor_batch[key] = np.full(len(output), self.version, dtype=np.int64)
            output.meta_info["rollout_idle_s"] = 0.0 if self._idle_from is None else start - self._idle_from
        self._idle_from = time.perf_counter()
        return output

    def _generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """The engine's answer, through the server in rollout.mode=async. An engine with its own weights is
        synchronised to the version held first, and kept awake for the sync and the whole generation; the
        others generate with the module, every weight gathered (the hybrid engine's resharding: FSDP2 gathers
        once for the whole generation and frees it after)."""
        engine = self.engine  # (built at the first generation)
        if self.agent is None and "agent_name" in prompts.non_tensor_batch:
            self.agent = self._agent_runner()  # the data names a loop per sample
        if not engine.owns_weights:
            with self.gathered():
                return self._generate_here(prompts, sampling, None)
        version = self.version
        with self._synced(engine):
            if self.engine_group is None:
                return self._generate_here(prompts, sampling, version)
            # A tensor-parallel engine: its ranks generate the group's prompts together, drawing with shared
            # per-request seeds, and each keeps its own rows.
            keys = ("input_ids", "attention_mask", "position_ids")
            tensors, mine = gather_rows({key: prompts.batch[key] for key in keys}, self.engine_group)
            seed = shared_seed(self.engine_group)
            output = engine.generate_sequences(
                DataProto.from_dict(tensors=tensors), sampling, weights_version=version, seed=seed
            )
            return output[mine]

    @contextlib.contextmanager
    def _synced(self, engine: Any) -> Iterator[None]:
        """An engine with weights of its own, awake and holding the version held here (synchronised first if
        not: FSDP2 shards are gathered one tensor at a time as the engine reads them)."""
        with engine.awake():
            if engine.weights_version != self.version:
                engine.sync_weights(self.model, self.version)
                self._synced_since[0] += engine.last_sync[0]
                self._synced_since[1] += engine.last_sync[1]
                self._synced_since[2] += engine.last_sync_buckets
            yield

    def _generate_here(self, prompts: DataProto, sampling: SamplingParams, version: int | None) -> DataProto:
        """This rank's engine generates: through the agent loops, the server, or one batch call."""
        if self.agent is not None:
            return self.agent.generate_sequences(prompts, sampling, version)
        if self.server is not None:
            return generate_batch(self.server, prompts, sampling, version)
        if version is None:
            return self.engine.generate_sequences(prompts, sampling)
        return self.engine.generate_sequences(prompts, sampling, weights_version=version)

    # ------------------------------------------------------------------ weights

    def load_weights(self, weights: dict[str, torch.Tensor], version: int, complete: bool = True) -> None:
        """A state dict copied in, as ``version``: the whole model's (every parameter and buffer), or with
        ``complete`` False some of them (LoRA's adapters) over the rest held already. An engine with weights of
        its own takes them at its next generation."""
        self.load_buckets([weights], version, complete)

    def load_buckets(
        self, buckets: Iterable[dict[str, torch.Tensor]], version: int, complete: bool = True
    ) -> tuple[int, int]:
        """`load_weights` from consecutive parts of a state dict (the weight sync's buckets), each copied in and
        dropped before the next is read; ``(buckets, bytes)`` copied."""
        # a gathered state dict may name a tied weight (the LM head) once
        expected = set(self.model.state_dict().keys())
        loaded: set[str] = set()
        unexpected: list[str] = []
        counts = [0, 0]
        for bucket in buckets:
            full_names = with_tied_names(self.model, bucket)
            _, surplus = self.model.load_state_dict(full_names, strict=False)
            unexpected.extend(surplus)
            loaded.update(full_names)
            counts[0] += 1
            counts[1] += sum(t.numel() * t.element_size() for t in bucket.values())
        missing = sorted(expected - loaded)
        if (missing and complete) or unexpected:
            raise RuntimeError(
                f"the actor's weights do not fit the rollout's model: missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}"
            )
        self.version = int(version)
        return counts[0], counts[1]

    def count_sync(self, seconds: float, nbytes: int, buckets: int) -> None:
        """A weight copy into this host's model (the separate rollout role's), counted into the next batch's
        weight-sync figures with the engine's own syncs."""
        self._synced_since[0] += seconds
        self._synced_since[1] += nbytes
        self._synced_since[2] += buckets
        self._copied = True

    # ------------------------------------------------------------------ the streaming pool

    def _decode(
        self, batch: DataProto, enough: Callable[[torch.Tensor], bool], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One decode of the pool's unfinished rows until ``enough``: the fast engine stops its own loop; any
        other engine decodes in chunks, each row prefilled again from its tokens so far (`decode_in_chunks`)."""
        engine, sampling = self.engine, self.sampling(False)
        with self.resident():
            if hasattr(engine, "decode_until"):
                with self.gathered():
                    return engine.decode_until(batch.to(self.device), sampling, enough, generator)
            if not engine.owns_weights:
                with self.gathered():
                    return decode_in_chunks(engine, batch.to(self.device), sampling, enough, generator)
            with self._synced(engine):
                return decode_in_chunks(engine, batch, sampling, enough, generator, self.version)

    def pool_version(self, train_step: int) -> int:
        return self.version if self._pool_version is None else self._pool_version(train_step)

    def collect(
        self, num_groups: int, train_step: int, max_staleness: int, strategy: str = "drop"
    ) -> DataProto:
        """The first ``num_groups`` groups of the pool to finish, generating with the weights held now: the
        batch of RL step ``train_step``. ``strategy`` (verl's ``max_off_policy_strategy``): ``drop`` first
        starts again the groups, finished or not, whose first token is more than ``max_staleness`` versions
        older than that step's policy; ``wait`` instead first finishes, with the weights held now, those that
        have reached ``max_staleness`` (by the next collect they would be past it), so they are trained, not
        restarted (those finished beyond one batch start again at the next collect, past the bound then). The
        stalest finished groups are handed over first."""
        start = time.perf_counter()
        idle = 0.0 if self._idle_from is None else start - self._idle_from
        version = self.pool_version(train_step)
        counts: dict[str, int] = {}
        # past the bound: with wait, only finished groups left over a batch after they reached it
        counts["restarted_groups"] = self.pool.restart_stale(oldest_allowed=train_step - 1 - max_staleness)
        if strategy == "wait":  # those that reached it are finished now, and handed over first
            counts["waited_groups"] = self.pool.finish_stale(
                train_step - max_staleness, self._decode, version
            )
        output = self.pool.collect(num_groups, self._decode, version)
        output.meta_info.update(rollout_idle_s=idle, pool_groups=len(self.pool), **counts)
        output.meta_info.update(self._stats())
        self._idle_from = time.perf_counter()
        return output

    def finish_started(self, train_step: int) -> None:
        """Complete every started generation with the weights held now (``partial_rollout=False``)."""
        self.pool.finish_started(self._decode, self.pool_version(train_step))
        self._idle_from = time.perf_counter()


class HostCalls:
    """The worker calls of a worker holding a :class:`RolloutHost` as ``host``: the pool's, as remote methods
    (``trainer_mode=colocate_async`` on the actor, the streaming ``separate_async`` on the rollout role)."""

    host: RolloutHost

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def submit(self, prompts: DataProto) -> None:
        """Hand prompts (repeated ``n`` times, with their group's ``uid``) to the pool; generated by collects."""
        self.host.submit(prompts)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def collect(
        self, num_groups: int, train_step: int, max_staleness: int, strategy: str = "drop"
    ) -> DataProto:
        return self.host.collect(num_groups, train_step, max_staleness, strategy)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe_rollout(self) -> str:
        return self.host.describe()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def finish_started(self, train_step: int) -> None:
        self.host.finish_started(train_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pool_state(self) -> dict[str, Any]:
        return self.host.pool.state_dict()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_pool(self, state: dict[str, Any]) -> None:
        self.host.load_pool(state)
