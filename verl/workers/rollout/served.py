"""What the inference engines with their own copy of the weights share (vllm, sglang).

Such an engine is built from the actor's config with random weights and holds the policy only after
`ServedEngine.sync_weights`, which records the policy version it now holds. Every generate names the version
it expects and is refused (`StaleWeightsError`) when the engine holds another: a rollout never runs on stale
weights by accident. On a GPU an engine may sleep between generates (``free_cache_engine``: KV cache freed,
weights offloaded); every call that needs it awake wakes it first and puts it back to sleep after.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from omegaconf import OmegaConf

from verl.models.loading import resolve_dtype
from verl.models.lora import adapter_delta, has_adapters, round_merged
from verl.protocol import DataProto
from verl.workers.rollout.base import (
    RolloutEngine,
    SamplingParams,
    StaleWeightsError,
    TokenRequest,
    TokenResponse,
    batch_from_responses,
    requests_from_batch,
)
from verl.workers.rollout.weight_sync import bucketed_stream, sync_settings

T = TypeVar("T")
logger = logging.getLogger(__name__)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A full tensor: an FSDP2 shard (DTensor) gathered from every rank (a collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A model's weights under their HF names, one full tensor at a time (FSDP2 shards gathered tensor by
    tensor: every rank must iterate alike), tied weights under each of their names (an engine does not tie an
    output head it is not given). With LoRA adapters, the base weights alone: the adapters are skipped and
    each adapted layer's ``base_layer`` is named as the plain model names it."""
    lora = has_adapters(model)
    for name, tensor in model.state_dict(keep_vars=False).items():
        if lora and ".lora_" in name:
            continue
        yield (name.replace(".base_layer.", ".") if lora else name), full(tensor)


def merged_weight(module: torch.nn.Module, base: torch.Tensor) -> torch.Tensor:
    """A peft LoRA layer's weight with its active adapters merged in (`verl.models.lora.adapter_delta`, the
    adapters gathered whole), in float32; ``base`` is its base layer's full weight."""
    delta = adapter_delta(module, full)
    return base.float() if delta is None else base.float() + delta


def adapted_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``model``'s peft LoRA layers by the HF name of the weight they adapt (``...q_proj.weight``)."""
    from peft.tuners.lora import LoraLayer

    return {f"{prefix}.weight": m for prefix, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_policy_weights(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`policy_weights` with each LoRA layer's adapters merged into its weight (verl's
    ``model.lora.merge``, `merged_weight`), the merged weight rounded once, to the engine's ``dtype``, without
    bias (`verl.models.lora.round_merged`: rounded to nearest bf16, a small update to a bf16 base is lost).
    The engine then generates with plain weights, without LoRA kernels."""
    layers = adapted_layers(model)
    for index, (name, tensor) in enumerate(policy_weights(model)):
        delta = adapter_delta(layers[name], full) if name in layers else None
        yield name, tensor if delta is None else round_merged(tensor.float() + delta, dtype, index)


def start_in_process(start: Callable[[], T]) -> T:
    """Run an engine's start-up without letting it change this process's torch thread count or random
    generators: vLLM's CPU worker replaces torch.set_num_threads with a no-op, and engines seed the process's
    generators with their own seed; the trainer sharing the process keeps its own of both."""
    set_num_threads = torch.set_num_threads
    state = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        return start()
    finally:
        torch.set_num_threads = set_num_threads
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.random.set_rng_state(state[2])
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)


def known_engine_args(extra: Any, args_class: Any, engine: str) -> dict[str, Any]:
    """``rollout.engine_kwargs.<engine>`` as keyword arguments, without the names ``args_class`` (the engine's
    argument dataclass) does not have: older verl configs carry defaults later engines dropped
    (``swap_space``, ``disable_mm_preprocessor_cache``), which would stop the engine from starting. What is
    dropped is logged."""
    import dataclasses

    given = OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else dict(extra or {})
    if not dataclasses.is_dataclass(args_class):
        return given
    known = {field.name for field in dataclasses.fields(args_class)}
    dropped = sorted(set(given) - known)
    if dropped:
        logger.warning(
            "actor_rollout_ref.rollout.engine_kwargs.%s: %s %s not arguments of %s; not passed",
            engine,
            ", ".join(dropped),
            "is" if len(dropped) == 1 else "are",
            engine,
        )
    return {name: value for name, value in given.items() if name in known}


class ServedEngine(RolloutEngine):
    """The version bookkeeping, private directory and sleep / wake of an engine with its own weights.

    A subclass implements `_import` (refuse a model it cannot serve, import its package), `_start` (start the
    engine from ``self.dir``; set ``sleeps``), `_load` (make the engine hold a model's weights), `_generate`
    (answer requests) and, if it can sleep, `_release` / `_resume`."""

    owns_weights = True
    returns_log_probs = True
    sleeps = False
    """whether the engine sleeps between generates (set by the subclass: GPU and free_cache_engine)"""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        micro_batch_size: int | None = None,
        *,
        config: Any,
        max_model_len: int,
        seed: int = 0,
        device: torch.device | None = None,
        merge_lora: bool = False,
    ) -> None:
        """``config`` is the ``actor_rollout_ref.rollout`` section; ``max_model_len`` the longest prompt +
        response the run makes (``rollout.max_model_len`` overrides it); ``seed`` the engine's sampling seed;
        ``device`` the worker's (the actor's weights may sit on the CPU, offloaded, while it trains on a GPU;
        unset: the weights'); ``merge_lora`` (``model.lora_merge``): a LoRA policy reaches the engine as full
        weights with its adapters merged in, at every sync (`merged_policy_weights`), instead of the base once
        and the adapters through the engine's LoRA support. ``micro_batch_size`` is not read: the engine
        schedules the whole batch itself."""
        self.merge_lora = bool(merge_lora) and has_adapters(model)
        """whether the engine gets merged weights (and holds no adapters of its own)"""
        module = self._import(model)
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.weights_version: int | None = None
        # an engine refuses stop ids outside its vocabulary; such an id is never generated, so stops nothing
        vocab = model.config.get_text_config().vocab_size
        self.stop_ids = [token for token in self.eos_token_ids if token < vocab]
        self.dir = Path(tempfile.mkdtemp(prefix=f"verl-{type(self).__name__.lower()}-"))
        """a private directory (system temp, never a user's path): the config the engine is built from"""
        weakref.finalize(self, shutil.rmtree, self.dir, True)
        model.config.to_json_file(self.dir / "config.json")
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.to_json_file(self.dir / "generation_config.json")
        self._sleeping = False
        self._awake_depth = 0
        param = next(model.parameters())
        dtype = resolve_dtype(config.dtype) if config.dtype else param.dtype
        self.dtype, self.device = dtype, device or param.device
        self.last_sync: tuple[float, int] = (0.0, 0)
        """the last weight sync's seconds and bytes"""
        self.last_sync_buckets = 0
        """the buckets of the last weight sync (`verl.workers.rollout.weight_sync`)"""
        self.sync = sync_settings(config)
        """the checkpoint engine's backend and bucket size (``rollout.checkpoint_engine``)"""
        self._counts = [0, 0]
        """buckets and bytes of the sync under way"""
        self._syncing_version = 0
        """the policy version of the sync under way"""
        self._start(
            module,
            model,
            config,
            dtype,
            self.device,
            int(config.max_model_len or max_model_len),
            seed,
        )
        self._sleep()

    # -- weights ------------------------------------------------------------------------------------

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        """Make the engine hold ``model``'s weights (the policy) as policy ``version``."""
        start, self._counts = time.perf_counter(), [0, 0]
        self._syncing_version = version
        with self.awake():
            self._load(model)
        self.weights_version = version
        self.last_sync = (time.perf_counter() - start, self._counts[1])
        self.last_sync_buckets = self._counts[0]

    def _policy_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """:func:`policy_weights` (:func:`merged_policy_weights` with ``merge_lora``) produced a bucket at a time
        (``update_weights_bucket_megabytes``: at most one bucket of gathered full tensors alive besides the
        engine's copy), buckets and bytes counted into the sync's figures."""
        weights = merged_policy_weights(model, self.dtype) if self.merge_lora else policy_weights(model)
        return bucketed_stream(weights, self.sync.bucket_bytes, self._counts)

    def check_version(self, expected: int | None) -> None:
        if expected is not None and expected != self.weights_version:
            held = (
                "its random initial weights"
                if self.weights_version is None
                else f"version {self.weights_version}"
            )
            raise StaleWeightsError(
                f"generate asked for policy version {expected}, but the {type(self).__name__} engine holds "
                f"{held}: sync the actor's weights first (sync_weights)"
            )

    # -- generation ---------------------------------------------------------------------------------

    def generate_tokens(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        for version in {request.weights_version for request in requests}:
            self.check_version(version)
        with self.awake():
            return self._generate(requests)

    def generate_sequences(
        self,
        prompts: DataProto,
        sampling: SamplingParams,
        weights_version: int | None = None,
        seed: int | None = None,
    ) -> DataProto:
        """The batch API; ``seed`` gives row r the sampling seed seed + r (what the ranks of a tensor-parallel
        engine need to draw alike)."""
        responses = self.generate_tokens(requests_from_batch(prompts, sampling, weights_version, seed))
        return batch_from_responses(prompts, responses, self.eos_token_ids, self.pad_token_id, sampling)

    # -- memory (GPU) -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def awake(self) -> Iterator[None]:
        """The engine awake inside (re-entrant: a sync and the generate calls of one rollout, each awake on its
        own, share one wake-up and one sleep when the caller holds this around them)."""
        if self._sleeping:
            self._resume()
            self._sleeping = False
        self._awake_depth += 1
        try:
            yield
        finally:
            self._awake_depth -= 1
            if self._awake_depth == 0:
                self._sleep()

    def _sleep(self) -> None:
        if self.sleeps and not self._sleeping:
            self._release()
            self._sleeping = True

    # -- what a subclass implements -----------------------------------------------------------------

    def _import(self, model: torch.nn.Module) -> Any:
        raise NotImplementedError

    def _start(
        self,
        module: Any,
        model: torch.nn.Module,
        config: Any,
        dtype: torch.dtype,
        device: torch.device,
        max_model_len: int,
        seed: int,
    ) -> None:
        raise NotImplementedError

    def _load(self, model: torch.nn.Module) -> None:
        raise NotImplementedError

    def _generate(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def _resume(self) -> None:
        raise NotImplementedError
