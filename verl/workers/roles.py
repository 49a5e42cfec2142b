"""Role workers: thin :class:`~verl.single_controller.Worker` classes that wire models, engines and
algorithms together. The controller calls their ``@register``-ed methods through a worker group, in
this process or in Ray actor processes. Each takes a :class:`DataProto` and, besides it, typed values
(``validate``, an :class:`~verl.workers.requests.UpdateRequest`), never string keys in ``meta_info``;
passes return a :class:`DataProto`, updates a plain metrics dict.

``ActorRolloutRefWorker`` is the hybrid engine: one worker holding the actor (trained), the
rollout (fast / hf generate with the actor's own module; vllm holds a copy of the weights, synchronised
to the current policy version before it generates) and, when a KL term needs it, the reference: a frozen
copy, or with LoRA the actor's own module with its adapters disabled. ``CriticWorker`` holds the value model,
``RewardWorker`` the rule-based reward functions.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from verl.agent_loop import AgentLoopRunner, uses_agent_loop
from verl.config import derive_sizes
from verl.config.backends import training_strategy
from verl.config.schema import TrainerConfig
from verl.models import eos_token_ids, load_hf_model, load_value_model, resolve_device, tokenizer_for
from verl.models.base_fingerprint import base_fingerprint, check_same_base, write_fingerprint
from verl.models.lora import adapters_disabled, apply_lora, has_adapters, merged_copy, plain_model_with
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.precision import model_dtype, role_compute_dtype, rollout_compute_dtype
from verl.utils.seeding import set_seed
from verl.utils.threads import configure_torch_threads, threads_for_run
from verl.workers.actor import Actor, compute_log_prob
from verl.workers.critic import Critic
from verl.workers.engine.distributed import (
    consecutive_group,
    gather_rows,
    init_distributed,
    process_group_backend,
    shared_seed,
)
from verl.workers.engine.fsdp import Offload, gathered, shard
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer
from verl.workers.engine.packed_weights import pack_weights
from verl.workers.engine.packing import packed_attention_implementation
from verl.workers.engine.scoring import PolicyScorer
from verl.workers.engine.sharded_checkpoint import full_weights_on_rank0
from verl.workers.engine.trained import TrainedModel
from verl.workers.engine.update_loop import run_update
from verl.workers.errors import (
    ACTOR_UPDATE_KNOBS,
    CRITIC_UPDATE_KNOBS,
    GENERATE_KNOBS,
    LOG_PROB_KNOBS,
    REF_LOG_PROB_KNOBS,
    VALUES_KNOBS,
    explain_oom,
)
from verl.workers.requests import UpdateRequest
from verl.workers.rollout import SamplingParams, get_rollout_class
from verl.workers.rollout.base import with_prompt_fields
from verl.workers.rollout.server import RolloutServer, generate_batch
from verl.workers.rollout.streaming import StreamingPool, StreamingRollout


def prepare_for_training(
    hf_model: torch.nn.Module, model_cfg: Any, optim_cfg: Any, total_steps: int
) -> tuple:
    """Gradient checkpointing (if asked), then the optimizer and LR schedule of a trained role."""
    if model_cfg.enable_gradient_checkpointing:
        # transformers 5 renamed it (the old name warns); older releases have only the old one
        enable = (
            getattr(hf_model, "activation_checkpointing_enable", None)
            or hf_model.gradient_checkpointing_enable
        )
        enable()
    optimizer = build_optimizer(hf_model.parameters(), optim_cfg)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg, total_steps)


def attention_for(configured: str, remove_padding: bool) -> str:
    """The attention implementation to load a model with: one that runs packed batches when
    ``remove_padding`` is on (see verl.workers.engine.packing)."""
    return packed_attention_implementation(configured) if remove_padding else configured


def on_device(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a worker method on the worker's device: DataProto arguments move there, a DataProto result
    comes back to the CPU, where the driver and the other roles read it."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        def move(value: Any) -> Any:
            return value.select().to(self.device) if isinstance(value, DataProto) else value

        result = method(self, *(move(a) for a in args), **{k: move(v) for k, v in kwargs.items()})
        return result.to("cpu") if isinstance(result, DataProto) else result

    return run


def load_policy_model(model_cfg: Any, device: torch.device) -> torch.nn.Module:
    """The policy's causal LM from ``actor_rollout_ref.model`` (path, dtype, attention, overrides), on ``device``:
    the actor's, and the separate rollout worker's copy."""
    return load_hf_model(
        model_cfg.path,
        torch_dtype=model_cfg.torch_dtype,
        attn_implementation=attention_for(model_cfg.attn_implementation, model_cfg.use_remove_padding),
        trust_remote_code=model_cfg.trust_remote_code,
        key="actor_rollout_ref.model.path",
        override_config=model_cfg.override_config,
        override_key="actor_rollout_ref.model.override_config",
    ).to(device)


def sampling_params(config: Any, validate: bool) -> SamplingParams:
    """How the rollout samples: ``rollout`` (or, validating, ``rollout.val_kwargs``) of a trainer config."""
    rollout_cfg = config.actor_rollout_ref.rollout
    section = rollout_cfg.val_kwargs if validate else rollout_cfg
    return SamplingParams.from_config(section, config.data.max_response_length, rollout_cfg.ignore_eos)


def save_hf_metadata(hf_model: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """What a HuggingFace model directory holds besides the weights: config, generation config, tokenizer."""
    hf_model.config.save_pretrained(path)
    if getattr(hf_model, "generation_config", None) is not None:
        hf_model.generation_config.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def write_hf_model(role: TrainedModel, rank: int, path: str | Path) -> None:
    """The role's whole model as a HuggingFace directory (weights and config), written by rank 0, LoRA
    adapters merged into the weights; sharded, the weights are gathered first (a collective)."""
    if role.sharded:
        with role.resident():
            weights = full_weights_on_rank0(role.hf_model)
        if rank == 0:
            plain_model_with(role.hf_model, weights).save_pretrained(path)
    elif rank == 0:
        merged_copy(role.hf_model).save_pretrained(path)


def save_role_checkpoint(
    role: TrainedModel, checkpoint_cfg: Any, tokenizer: Any, rank: int, path: str, background: bool
) -> threading.Thread | None:
    """This rank's part of a checkpoint (see verl.utils.checkpoint), the parts ``checkpoint.save_contents``
    names, plus, from rank 0, the HF config and tokenizer that ``verl export`` turns it into a model directory
    with (and, with ``hf_model``, the whole model there already)."""
    contents = list(checkpoint_cfg.save_contents)
    hf_dir = Path(path) / "huggingface"
    if "hf_model" in contents:
        write_hf_model(role, rank, hf_dir)
    if rank == 0:
        save_hf_metadata(role.hf_model, tokenizer, hf_dir)
    return role.save_checkpoint(path, rank, background, contents)


def load_contents(checkpoint_cfg: Any) -> list[str]:
    """``checkpoint.load_contents``, which defaults to what is saved (verl's ``${.save_contents}``)."""
    contents = checkpoint_cfg.load_contents
    return list(checkpoint_cfg.save_contents if contents is None else contents)


def trainer_config(config: Any) -> DictConfig:
    """The whole trainer config a worker reads, given it or (the seeds' form) its ``actor_rollout_ref``
    section.

    A section taken from a loaded config (``verl.TrainerConfig(...).actor_rollout_ref``) still belongs to
    it, and the whole config is that node's root; a section on its own (a dict, a schema dataclass) gets
    the schema's defaults for every other section.
    """
    if not isinstance(config, DictConfig):
        config = OmegaConf.structured(config) if not isinstance(config, dict) else OmegaConf.create(config)
    if "actor_rollout_ref" in config:
        return config
    root = config._get_root()  # OmegaConf keeps no public way up from a child node
    if root is not config and "actor_rollout_ref" in root and root.actor_rollout_ref is config:
        return root
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), {"actor_rollout_ref": config})


def setup_process(config: Any, rank: int) -> torch.device:
    """Threads, seeds and the data-parallel process group of a worker: a worker in its own process
    starts from nothing the driver set.

    Each rank gets its own seed, so data-parallel ranks sample different responses. The process group
    forms only when the worker group set WORLD_SIZE > 1 (Ray backend); all ranks join it together.
    Returns the device the worker computes on.
    """
    configure_torch_threads(threads_for_run(config))
    set_seed(config.trainer.seed + rank)
    device = resolve_device(config.trainer.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed(process_group_backend(device))
    return device


class ActorRolloutRefWorker(StreamingRollout, Worker):
    """Actor + rollout + reference for one data-parallel rank.

    ``actor_model`` is the causal LM being trained (the rollout generates with it), ``actor`` its
    `Actor` (log-probs and updates), ``ref_model`` the frozen reference copy and ``ref_scorer`` its
    forward pass (both None without a KL term), built once. With LoRA there is no copy (``ref_in_actor``,
    verl's name): the reference is the actor's module run with its adapters disabled, and checkpoints
    hold the adapters alone, with a fingerprint of the base model's files (``base_fingerprint``) that a
    resume checks ``model.path`` against.

    ``config`` is a trainer config or its ``actor_rollout_ref`` section (see `trainer_config`).
    ``total_training_steps`` (the LR schedule's length) defaults to ``trainer.total_training_steps``, or
    1 when unset; ``need_ref`` to whether a KL term needs the reference (``algorithm.use_kl_in_reward`` or
    ``actor.use_kl_loss``). It runs in-process on CPU as well as in a Ray worker.

    With ``trainer.v1.trainer_mode=colocate_async`` the rollout streams from ``pool`` (`StreamingRollout`'s
    calls): generations unfinished at an update go on with the updated module in the next step.
    """

    def __init__(
        self, config: Any, total_training_steps: int | None = None, need_ref: bool | None = None
    ) -> None:
        config = trainer_config(config)
        self.config = config
        self.device = setup_process(config, self.rank)
        arr = config.actor_rollout_ref
        model_cfg = arr.model
        if total_training_steps is None:
            total_training_steps = config.trainer.total_training_steps or 1
        if need_ref is None:
            need_ref = bool(config.algorithm.use_kl_in_reward or arr.actor.use_kl_loss)
        self.tokenizer = tokenizer_for(model_cfg)
        self.sizes = derive_sizes(config)
        self.actor_model = load_policy_model(model_cfg, self.device)
        # LoRA (lora_rank > 0 or lora_adapter_path): adapters injected in place (new, or the saved ones),
        # only they train; the optimizer gets only them.
        self.actor_model = apply_lora(self.actor_model, model_cfg)
        lora = has_adapters(self.actor_model)
        self.base_fingerprint = base_fingerprint(model_cfg.path) if lora else None
        """with LoRA, the fingerprint of model.path's files (verl.models.base_fingerprint), kept in checkpoints"""
        scoring = {
            "remove_padding": model_cfg.use_remove_padding,
            "chunk_size": model_cfg.log_prob_chunk_size,
            "share_prompts": model_cfg.share_prompts,
        }
        self.sharded = training_strategy(config) == "fsdp2"
        self.compute = role_compute_dtype(
            arr.actor.fsdp_config,
            device=self.device,
            weights_dtype=model_dtype(self.actor_model),
            sharded=self.sharded,
            key="actor_rollout_ref.actor.fsdp_config",
        )
        self.ref_model = self.ref_scorer = self.ref_offload = None
        self.ref_in_actor = need_ref and lora
        """the reference is the actor's own module with its adapters disabled (LoRA): no second copy"""
        if need_ref and not lora:
            # The reference starts from the same weights and never trains: a deep copy (taken before the
            # actor is sharded) saves a second load.
            self.ref_model = copy.deepcopy(self.actor_model).eval().requires_grad_(False)
            ref_compute = role_compute_dtype(
                arr.ref.fsdp_config,
                device=self.device,
                weights_dtype=model_dtype(self.ref_model),
                sharded=self.sharded,
                key="actor_rollout_ref.ref.fsdp_config",
            )
            self.ref_scorer = PolicyScorer(self.ref_model, **scoring, compute_dtype=ref_compute.dtype)
            if self.sharded:
                key = "actor_rollout_ref.ref.fsdp_config"
                shard(self.ref_scorer, self.ref_model, arr.ref.fsdp_config, self.device, key)
                self.ref_offload = Offload(self.ref_scorer, arr.ref.fsdp_config, self.device, key)
        optimizer, lr_scheduler = prepare_for_training(
            self.actor_model, model_cfg, arr.actor.optim, total_training_steps
        )
        # Same shuffle seed on every rank; Actor shards its scorer (fsdp2), or wraps it in DDP when data
        # parallelism is on.
        self.actor = Actor(
            self.actor_model,
            arr.actor,
            optimizer,
            lr_scheduler,
            seed=config.trainer.seed,
            fsdp_config=arr.actor.fsdp_config if self.sharded else None,
            fsdp_key="actor_rollout_ref.actor.fsdp_config",
            compute_dtype=self.compute.dtype,
            **scoring,
        )

        self.eos_token_ids = eos_token_ids(self.tokenizer, self.actor_model)
        rollout_cls = get_rollout_class(arr.rollout.name)
        options: dict[str, Any] = {}
        if (
            rollout_cls.owns_weights
        ):  # an inference engine (vllm): its own copy of the weights, its own settings
            options = {
                "config": arr.rollout,
                "max_model_len": config.data.max_prompt_length + config.data.max_response_length,
                "seed": config.trainer.seed + self.rank,
                "device": self.device,
            }
        self.rollout = rollout_cls(
            self.actor_model,
            self.eos_token_ids,
            self.tokenizer.pad_token_id,
            arr.rollout.micro_batch_size,
            **options,
        )
        # An engine that computes with the actor's module computes in the actor's dtype unless rollout.dtype is set.
        if not rollout_cls.owns_weights:
            self.rollout.compute_dtype = rollout_compute_dtype(
                arr.rollout.dtype, self.compute, self.actor_model
            )
        self.policy_version = 0
        """bumped by every update and checkpoint load: the version an engine with its own weights must hold"""
        self.pool = StreamingPool.for_sampling(  # the same seed on every rank: each holds the same pool
            self.sampling_params(False), self.eos_token_ids, self.tokenizer.pad_token_id,
            int(config.trainer.seed), self.device,
        )  # fmt: skip
        tp = int(arr.rollout.tensor_model_parallel_size)
        self.engine_group = consecutive_group(tp) if rollout_cls.owns_weights and tp > 1 else None
        """the ranks sharing one tensor-parallel engine with this one (None: the engine is this rank's alone)"""
        self.server = (
            RolloutServer(self.rollout, arr.rollout.max_num_seqs) if arr.rollout.mode == "async" else None
        )
        self.agent = self._agent_runner() if uses_agent_loop(arr.rollout) else None
        """the agent loops (multi-turn, tools), over the rollout server; None: one reply per prompt"""

    def _agent_runner(self) -> AgentLoopRunner:
        """Agent loops need a server (each sample's turns are separate requests): mode=async's, or one of
        their own."""
        rollout_cfg = self.config.actor_rollout_ref.rollout
        if self.server is None:
            self.server = RolloutServer(self.rollout, rollout_cfg.max_num_seqs)
        return AgentLoopRunner(
            self.config, self.tokenizer, self.server.generate, self.eos_token_ids, self.tokenizer.pad_token_id
        )

    def sampling_params(self, validate: bool) -> SamplingParams:
        return sampling_params(self.config, validate)

    def _pool_decode(
        self, batch: DataProto, enough: Callable[[torch.Tensor], bool], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """colocate_async: the streaming pool decodes with the actor's module, every weight gathered."""
        with self.actor.resident(), gathered(self.actor.scorer):
            return self.rollout.decode_until(
                batch.to(self.device), self.sampling_params(False), enough, generator
            )

    def _pool_version(self, train_step: int) -> int:
        return train_step - 1  # colocated, the module has had every update before this step's

    def _generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """The rollout engine's answer, through the server in rollout.mode=async. An engine with its own
        weights is synchronised to the current policy first, and kept awake for the sync and the whole
        generation; the others generate with the actor's module, every weight gathered (the hybrid engine's
        resharding: FSDP2 gathers once for the whole generation and frees it after)."""
        if self.agent is None and "agent_name" in prompts.non_tensor_batch:
            self.agent = self._agent_runner()  # the data names a loop per sample
        if not self.rollout.owns_weights:
            with gathered(self.actor.scorer):
                return self._generate_here(prompts, sampling, None)
        version = self.policy_version
        with self.rollout.awake():
            if self.rollout.weights_version != version:
                # FSDP2 shards are gathered one tensor at a time as the engine reads them
                self.rollout.sync_weights(self.actor_model, version)
            if self.engine_group is None:
                return self._generate_here(prompts, sampling, version)
            # A tensor-parallel engine: its ranks generate the group's prompts together, drawing with shared
            # per-request seeds, and each keeps its own rows.
            keys = ("input_ids", "attention_mask", "position_ids")
            tensors, mine = gather_rows({key: prompts.batch[key] for key in keys}, self.engine_group)
            seed = shared_seed(self.engine_group)
            output = self.rollout.generate_sequences(
                DataProto.from_dict(tensors=tensors), sampling, weights_version=version, seed=seed
            )
            return output[mine]

    def _generate_here(self, prompts: DataProto, sampling: SamplingParams, version: int | None) -> DataProto:
        """This rank's engine generates: through the agent loops, the server, or one batch call."""
        if self.agent is not None:
            return self.agent.generate_sequences(prompts, sampling, version)
        if self.server is not None:
            return generate_batch(self.server, prompts, sampling, version)
        if version is None:
            return self.rollout.generate_sequences(prompts, sampling)
        return self.rollout.generate_sequences(prompts, sampling, weights_version=version)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*GENERATE_KNOBS)
    @on_device
    def generate_sequences(self, prompts: DataProto, validate: bool = False) -> DataProto:
        """Sample responses; ``validate`` samples with the validation settings (``rollout.val_kwargs``,
        greedy by default).

        The prompts' other per-sample fields come back with the output, so the result is the whole batch
        the next steps need.
        """
        with self.actor.resident():
            output = self._generate(prompts, self.sampling_params(validate))
        return with_prompt_fields(output, prompts)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*LOG_PROB_KNOBS)
    @on_device
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (and ``entropys``) of the responses under the current policy."""
        rollout_cfg = self.config.actor_rollout_ref.rollout
        log_probs, entropy = self.actor.compute_log_prob(
            data,
            rollout_cfg.log_prob_micro_batch_size_per_gpu,
            rollout_cfg.temperature,
            with_entropy=True,
            max_tokens=self.sizes.log_prob_max_tokens,
        )
        return DataProto.from_dict(tensors={"old_log_probs": log_probs, "entropys": entropy})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*REF_LOG_PROB_KNOBS)
    @on_device
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob``: log-probs of the responses under the frozen reference policy (with LoRA, the
        actor's module with its adapters disabled: the base model)."""
        if self.ref_in_actor:
            scorer, context = self.actor.scorer, self._actor_as_base()
        elif self.ref_scorer is not None:
            scorer = self.ref_scorer
            context = self.ref_offload.resident() if self.ref_offload else contextlib.nullcontext()
        else:
            raise RuntimeError(
                "compute_ref_log_prob called but no reference model was built (no KL term is on)"
            )
        with context:
            log_probs, _ = compute_log_prob(
                scorer,
                data,
                self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu,
                self.config.actor_rollout_ref.rollout.temperature,
                max_tokens=self.sizes.ref_max_tokens,
            )
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

    @contextlib.contextmanager
    def _actor_as_base(self) -> Iterator[None]:
        """The actor's weights resident, its LoRA adapters disabled: the base model, for the reference."""
        with self.actor.resident(), adapters_disabled(self.actor_model):
            yield

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS)
    @explain_oom(*ACTOR_UPDATE_KNOBS)
    @on_device
    def update_actor(self, data: DataProto, request: UpdateRequest) -> dict[str, float]:
        """One policy update on ``data`` (with advantages); the ``actor/*`` metrics, the same on every rank."""
        sizes = request.sizes
        correction = self.config.algorithm.rollout_correction
        update = self.actor.plan_update(
            data,
            mini_batch_size=sizes.mini_batch_samples,
            micro_batch_size=sizes.micro_batch_samples,
            temperature=self.config.actor_rollout_ref.rollout.temperature,
            progress=request.progress,
            max_tokens=sizes.actor_max_tokens,
            measure_entropy=request.measure_entropy,
            bypass_correction=correction if correction.bypass_mode else None,
        )
        metrics = run_update(self.actor, update)
        self.policy_version += 1
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_weights(self) -> dict[str, Any] | None:
        """A CPU copy of the policy's whole weights, packed (`pack_weights`), for a rollout with its own model
        (asynchronous training): rank 0's (gathered when sharded, a collective); the other ranks answer None."""
        with self.actor.resident():
            if self.sharded:
                weights = full_weights_on_rank0(self.actor_model)
                return pack_weights(weights) if self.rank == 0 else None
            if self.rank != 0:
                return None
            return pack_weights(self.actor_model.state_dict())  # a copy: torch.cat allocates the buffers

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf(self, path: str) -> None:
        """Write the current policy as a HuggingFace directory (weights, config, tokenizer); rank 0 writes."""
        write_hf_model(self.actor, self.rank, path)
        if self.rank == 0:
            self.tokenizer.save_pretrained(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, background: bool = False) -> None:
        """This rank's part of a checkpoint (see verl.utils.checkpoint), plus, from rank 0, the HF
        config and tokenizer that ``verl export`` turns it into a model directory with (and, with LoRA, the
        fingerprint of the base model's files)."""
        if self.rank == 0 and self.base_fingerprint is not None:
            write_fingerprint(path, self.base_fingerprint)
        self._save_thread = save_role_checkpoint(
            self.actor,
            self.config.actor_rollout_ref.actor.checkpoint,
            self.tokenizer,
            self.rank,
            path,
            background,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore a checkpoint part; with LoRA, refused when ``model.path`` is not the base it was trained on."""
        if self.base_fingerprint is not None:
            key = "actor_rollout_ref.model.path"
            check_same_base(path, self.base_fingerprint, key, self.config.actor_rollout_ref.model.path)
        self.actor.load_checkpoint(
            path, self.rank, load_contents(self.config.actor_rollout_ref.actor.checkpoint)
        )
        self.policy_version += 1

    def get_state(self) -> dict[str, Any] | None:
        """Weights, optimizer and LR schedule: what a restarted worker needs to carry on training (each
        rank's own shards with fsdp2; with dp every rank holds rank 0's, so the others answer None)."""
        return self.actor.training_state() if self.actor.sharded or self.rank == 0 else None

    def set_state(self, state: dict[str, Any]) -> None:
        self.actor.load_training_state(state)
        self.policy_version += 1


class CriticWorker(Worker):
    """The value model of PPO, built from ``critic.model`` (by default the actor's model directory).

    ``value_model`` is the HF token-classification model being trained, ``critic`` its `Critic`.
    """

    def __init__(self, config: Any, total_training_steps: int | None = None) -> None:
        config = trainer_config(config)
        self.config = config
        self.device = setup_process(config, self.rank)
        if total_training_steps is None:
            total_training_steps = config.trainer.total_training_steps or 1
        critic_cfg = config.critic
        model_cfg = critic_cfg.model
        path = model_cfg.path or config.actor_rollout_ref.model.path
        remove_padding = model_cfg.use_remove_padding
        if remove_padding is None:
            remove_padding = config.actor_rollout_ref.model.use_remove_padding
        self.sizes = derive_sizes(config)
        self.value_model = load_value_model(
            path,
            torch_dtype=model_cfg.torch_dtype,
            attn_implementation=attention_for(model_cfg.attn_implementation, remove_padding),
            trust_remote_code=model_cfg.trust_remote_code,
            key="critic.model.path" if model_cfg.path else "actor_rollout_ref.model.path",
            override_config=model_cfg.override_config,
            override_key="critic.model.override_config",
        ).to(self.device)
        optimizer, lr_scheduler = prepare_for_training(
            self.value_model, model_cfg, critic_cfg.optim, total_training_steps
        )
        sharded = training_strategy(config) == "fsdp2"
        compute = role_compute_dtype(
            model_cfg.fsdp_config,
            device=self.device,
            weights_dtype=model_dtype(self.value_model),
            sharded=sharded,
            key="critic.model.fsdp_config",
        )
        self.critic = Critic(
            self.value_model,
            critic_cfg,
            optimizer,
            lr_scheduler,
            seed=config.trainer.seed,
            remove_padding=remove_padding,
            compute_dtype=compute.dtype,
            fsdp_config=model_cfg.fsdp_config if sharded else None,
            fsdp_key="critic.model.fsdp_config",
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*VALUES_KNOBS)
    @on_device
    def compute_values(self, data: DataProto) -> DataProto:
        values = self.critic.compute_values(
            data, self.config.critic.forward_micro_batch_size_per_gpu, self.sizes.critic_forward_max_tokens
        )
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS)
    @explain_oom(*CRITIC_UPDATE_KNOBS)
    @on_device
    def update_critic(self, data: DataProto, request: UpdateRequest) -> dict[str, float]:
        """One value-model update on ``data`` (with returns); the ``critic/*`` metrics, the same on every rank."""
        sizes = request.sizes
        update = self.critic.plan_update(
            data,
            mini_batch_size=sizes.critic_mini_batch_samples,
            micro_batch_size=sizes.critic_micro_batch_samples,
            epochs=sizes.critic_ppo_epochs,
            max_tokens=sizes.critic_max_tokens,
        )
        return run_update(self.critic, update)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, background: bool = False) -> None:
        self._save_thread = save_role_checkpoint(
            self.critic, self.config.critic.checkpoint, None, self.rank, path, background
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.critic.load_checkpoint(path, self.rank, load_contents(self.config.critic.checkpoint))

    def get_state(self) -> dict[str, Any] | None:
        return self.critic.training_state() if self.critic.sharded or self.rank == 0 else None

    def set_state(self, state: dict[str, Any]) -> None:
        self.critic.load_training_state(state)


class RewardWorker(Worker):
    """Rewards: the reward manager named by ``reward_model.reward_manager``, the reward model
    (``reward_model.enable``, on this worker's device) and the weighted terms of ``reward_model.reward_fns``
    (see verl.workers.reward.combine).

    ``compute_score(data, validate=True)`` uses the validation manager (no printed examples). Custom managers can be passed in (they must pickle for Ray), or
    just a ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` function for the
    configured manager to call.
    """

    def __init__(
        self, config: Any, reward_fn: Any = None, val_reward_fn: Any = None, compute_score: Any = None
    ) -> None:
        from verl.workers.reward.combine import build_reward_fns

        config = trainer_config(config)
        device = setup_process(config, self.rank)
        tokenizer = tokenizer_for(config.actor_rollout_ref.model)
        self.reward_fn, self.val_reward_fn = build_reward_fns(
            config, tokenizer, device, reward_fn, val_reward_fn, compute_score
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_score(self, data: DataProto, validate: bool = False) -> DataProto:
        """``token_level_scores`` (the score at each response's last token) and any extra per-sample fields;
        ``validate`` scores with the validation manager."""
        reward_fn = self.val_reward_fn if validate else self.reward_fn
        reward = reward_fn(data, return_dict=True)
        extra = {key: np.array(values, dtype=object) for key, values in reward["reward_extra_info"].items()}
        return DataProto.from_dict(
            tensors={"token_level_scores": reward["reward_tensor"]},
            non_tensors=extra,
            meta_info={"reward_extra_keys": sorted(extra)},  # which columns are reward fields (metrics)
        )
