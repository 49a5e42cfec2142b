"""Role workers: thin :class:`~verl.single_controller.Worker` classes that wire models, engines and
algorithms together. The controller calls their ``@register``-ed methods through a worker group, in
this process or in Ray actor processes; each method takes and returns a :class:`DataProto`.

``ActorRolloutRefWorker`` is the hybrid engine: one worker holding the actor (trained), the
rollout (generates with the actor's own weights, so there is nothing to synchronise) and,
when a KL term needs it, a frozen reference copy. ``CriticWorker`` holds the value model,
``RewardWorker`` the rule-based reward functions.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.config import derive_sizes
from verl.models import load_hf_model, load_tokenizer, load_value_model
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.seeding import configure_torch_threads, set_seed
from verl.workers.actor import Actor
from verl.workers.critic import Critic
from verl.workers.engine.distributed import init_distributed
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer
from verl.workers.engine.packing import packed_attention_implementation
from verl.workers.errors import (
    ACTOR_UPDATE_KNOBS,
    CRITIC_UPDATE_KNOBS,
    GENERATE_KNOBS,
    LOG_PROB_KNOBS,
    REF_LOG_PROB_KNOBS,
    VALUES_KNOBS,
    explain_oom,
)
from verl.workers.rollout import SamplingParams, get_rollout_class


def eos_token_ids(tokenizer: Any, model: torch.nn.Module) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation_config EOS ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def prepare_for_training(module: torch.nn.Module, model_cfg: Any, optim_cfg: Any, total_steps: int) -> tuple:
    """Gradient checkpointing (if asked), then the optimizer and LR schedule of a trained role."""
    if model_cfg.enable_gradient_checkpointing:
        module.gradient_checkpointing_enable()
    optimizer = build_optimizer(module.parameters(), optim_cfg)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg, total_steps)


def attention_for(configured: str, remove_padding: bool) -> str:
    """The attention implementation to load a model with: one that runs packed batches when
    ``remove_padding`` is on (see verl.workers.engine.packing)."""
    return packed_attention_implementation(configured) if remove_padding else configured


def resolve_device(name: str) -> torch.device:
    """``trainer.device``: cpu, cuda (the worker's GPU: Ray gives each worker its own) or auto."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but this worker sees no CUDA device")
    return torch.device(name)


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


def save_hf_metadata(module: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """What a HuggingFace model directory holds besides the weights: config, generation config, tokenizer."""
    module.config.save_pretrained(path)
    if getattr(module, "generation_config", None) is not None:
        module.generation_config.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def setup_process(config: Any, rank: int) -> torch.device:
    """Threads, seeds and the data-parallel process group of a worker: a worker in its own process
    starts from nothing the driver set.

    Each rank gets its own seed, so data-parallel ranks sample different responses. The process group
    forms only when the worker group set WORLD_SIZE > 1 (Ray backend); all ranks join it together.
    Returns the device the worker computes on.
    """
    configure_torch_threads(config.trainer.torch_threads)
    set_seed(config.trainer.seed + rank)
    device = resolve_device(config.trainer.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed("nccl" if device.type == "cuda" else "gloo")
    return device


class ActorRolloutRefWorker(Worker):
    """Actor + rollout + reference for one data-parallel rank."""

    def __init__(self, config: Any, total_training_steps: int, need_ref: bool) -> None:
        self.config = config
        self.device = setup_process(config, self.rank)
        arr = config.actor_rollout_ref
        model_cfg = arr.model
        self.tokenizer = load_tokenizer(
            model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code
        )
        self.sizes = derive_sizes(config)
        self.module = load_hf_model(
            model_cfg.path,
            torch_dtype=model_cfg.torch_dtype,
            attn_implementation=attention_for(model_cfg.attn_implementation, model_cfg.use_remove_padding),
            trust_remote_code=model_cfg.trust_remote_code,
        ).to(self.device)
        optimizer, lr_scheduler = prepare_for_training(
            self.module, model_cfg, arr.actor.optim, total_training_steps
        )
        # Same shuffle seed on every rank; Actor wraps the module in DDP when data parallelism is on.
        self.actor = Actor(
            self.module,
            arr.actor,
            optimizer,
            lr_scheduler,
            seed=config.trainer.seed,
            **self.scoring_options(),
        )

        self.eos_token_ids = eos_token_ids(self.tokenizer, self.module)
        rollout_cls = get_rollout_class(arr.rollout.name)
        self.rollout = rollout_cls(
            self.module, self.eos_token_ids, self.tokenizer.pad_token_id, arr.rollout.micro_batch_size
        )
        self.ref_module = None
        if need_ref:
            # The reference starts from the same weights and never trains: a deep copy saves a second load.
            self.ref_module = copy.deepcopy(self.module).eval().requires_grad_(False)

    def scoring_options(self) -> dict[str, Any]:
        model_cfg = self.config.actor_rollout_ref.model
        return {
            "remove_padding": model_cfg.use_remove_padding,
            "chunk_size": model_cfg.log_prob_chunk_size,
            "share_prompts": model_cfg.share_prompts,
        }

    def sampling_params(self, validate: bool) -> SamplingParams:
        rollout_cfg = self.config.actor_rollout_ref.rollout
        section = rollout_cfg.val_kwargs if validate else rollout_cfg
        return SamplingParams.from_config(section, self.config.data.max_response_length)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*GENERATE_KNOBS)
    @on_device
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses; ``meta_info["validate"]`` switches to the greedy validation settings.

        The prompts' other per-sample fields come back with the output, so the result is the whole batch
        the next steps need.
        """
        sampling = self.sampling_params(bool(prompts.meta_info.get("validate", False)))
        output = self.rollout.generate_sequences(prompts, sampling)
        # Fields the rollout does not produce (uid, ground truth, reward baselines, ...) pass through.
        for key, values in prompts.non_tensor_batch.items():
            output.non_tensor_batch.setdefault(key, values)
        for key, tensor in prompts.batch.items():
            output.batch.setdefault(key, tensor)
        output.meta_info = {**prompts.meta_info, **output.meta_info}
        return output

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
        if self.ref_module is None:
            raise RuntimeError(
                "compute_ref_log_prob called but no reference model was built (no KL term is on)"
            )
        ref_actor = Actor(self.ref_module, self.config.actor_rollout_ref.actor, **self.scoring_options())
        log_probs, _ = ref_actor.compute_log_prob(
            data,
            self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu,
            self.config.actor_rollout_ref.rollout.temperature,
            max_tokens=self.sizes.ref_max_tokens,
        )
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*ACTOR_UPDATE_KNOBS)
    @on_device
    def update_actor(self, data: DataProto) -> DataProto:
        sizes = data.meta_info["sizes"]
        metrics = self.actor.update_policy(
            data,
            mini_batch_size=sizes.mini_batch_samples,
            micro_batch_size=sizes.micro_batch_samples,
            temperature=self.config.actor_rollout_ref.rollout.temperature,
            progress=data.meta_info.get("progress", 0.0),
            max_tokens=sizes.actor_max_tokens,
        )
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf(self, path: str) -> None:
        """Write the current policy as a HuggingFace directory (weights, config, tokenizer); rank 0 writes."""
        if self.rank == 0:
            self.module.save_pretrained(path)
            self.tokenizer.save_pretrained(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, background: bool = False) -> None:
        """This rank's part of a checkpoint (see verl.utils.checkpoint), plus, from rank 0, the HF
        config and tokenizer that ``verl export`` turns it into a model directory with."""
        if self.rank == 0:
            save_hf_metadata(self.module, self.tokenizer, Path(path) / "huggingface")
        self._save_thread = self.actor.save_checkpoint(path, self.rank, background)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.actor.load_checkpoint(path, self.rank)

    def get_state(self) -> dict[str, Any]:
        """Weights, optimizer and LR schedule: what a restarted worker needs to carry on training."""
        return self.actor.training_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.actor.load_training_state(state)


class CriticWorker(Worker):
    """The value model of PPO, built from ``critic.model`` (by default the actor's model directory)."""

    def __init__(self, config: Any, total_training_steps: int) -> None:
        self.config = config
        self.device = setup_process(config, self.rank)
        critic_cfg = config.critic
        model_cfg = critic_cfg.model
        path = model_cfg.path or config.actor_rollout_ref.model.path
        remove_padding = model_cfg.use_remove_padding
        if remove_padding is None:
            remove_padding = config.actor_rollout_ref.model.use_remove_padding
        self.sizes = derive_sizes(config)
        self.module = load_value_model(
            path,
            torch_dtype=model_cfg.torch_dtype,
            attn_implementation=attention_for(model_cfg.attn_implementation, remove_padding),
            trust_remote_code=model_cfg.trust_remote_code,
        ).to(self.device)
        optimizer, lr_scheduler = prepare_for_training(
            self.module, model_cfg, critic_cfg.optim, total_training_steps
        )
        self.critic = Critic(
            self.module,
            critic_cfg,
            optimizer,
            lr_scheduler,
            seed=config.trainer.seed,
            remove_padding=remove_padding,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*VALUES_KNOBS)
    @on_device
    def compute_values(self, data: DataProto) -> DataProto:
        values = self.critic.compute_values(
            data, self.config.critic.forward_micro_batch_size_per_gpu, self.sizes.critic_forward_max_tokens
        )
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @explain_oom(*CRITIC_UPDATE_KNOBS)
    @on_device
    def update_critic(self, data: DataProto) -> DataProto:
        sizes = data.meta_info["sizes"]
        metrics = self.critic.update_critic(
            data,
            mini_batch_size=sizes.critic_mini_batch_samples,
            micro_batch_size=sizes.critic_micro_batch_samples,
            epochs=sizes.critic_ppo_epochs,
            max_tokens=sizes.critic_max_tokens,
        )
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, background: bool = False) -> None:
        if self.rank == 0:
            save_hf_metadata(self.module, None, Path(path) / "huggingface")
        self._save_thread = self.critic.save_checkpoint(path, self.rank, background)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.critic.load_checkpoint(path, self.rank)

    def get_state(self) -> dict[str, Any]:
        return self.critic.training_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.critic.load_training_state(state)


class RewardWorker(Worker):
    """Rule-based rewards: the reward manager named by ``reward_model.reward_manager``.

    ``compute_score`` uses the validation manager (no printed examples) when the batch's
    ``meta_info["validate"]`` is set. Custom managers can be passed in (they must pickle for Ray), or
    just a ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` function for the
    configured manager to call.
    """

    def __init__(
        self, config: Any, reward_fn: Any = None, val_reward_fn: Any = None, compute_score: Any = None
    ) -> None:
        from verl.workers.reward import load_reward_manager

        setup_process(config, self.rank)
        model_cfg = config.actor_rollout_ref.model
        tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
        num_examine = config.reward_model.num_examine
        self.reward_fn = reward_fn or load_reward_manager(config, tokenizer, num_examine, compute_score)
        self.val_reward_fn = val_reward_fn or load_reward_manager(config, tokenizer, 0, compute_score)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_score(self, data: DataProto) -> DataProto:
        """``token_level_scores`` (the score at each response's last token) and any extra per-sample fields."""
        reward_fn = self.val_reward_fn if data.meta_info.get("validate") else self.reward_fn
        reward = reward_fn(data, return_dict=True)
        extra = {key: np.array(values, dtype=object) for key, values in reward["reward_extra_info"].items()}
        return DataProto.from_dict(tensors={"token_level_scores": reward["reward_tensor"]}, non_tensors=extra)
