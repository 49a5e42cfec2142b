"""What every worker process sets up before its role's work: the whole trainer config from what it was given
(`trainer_config`), threads, seeds, device and process group (`setup_process`), the policy model
(`load_policy_model`, with the attention implementation of `attention_for`), a trained model's optimizer and
LR schedule (`prepare_for_training`), and `on_device`, which runs a worker method on the worker's device.
Used by the role workers (verl.workers.roles) and the separate rollout worker (verl.workers.rollout_worker).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from verl.config.schema import TrainerConfig
from verl.models import load_hf_model, resolve_device
from verl.protocol import DataProto
from verl.utils.heap import trim_after_long_call
from verl.utils.seeding import set_seed
from verl.utils.threads import configure_torch_threads, threads_for_run
from verl.workers.engine.attention import register_grouped_sdpa
from verl.workers.engine.distributed import init_distributed, process_group_backend
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer
from verl.workers.engine.packing import packed_attention_implementation


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
    ``remove_padding`` is on (see verl.workers.engine.packing), and for ``sdpa`` otherwise ``verl_sdpa``
    (the same SDPA, grouped-query heads not repeated on a CPU: verl.workers.engine.attention)."""
    if remove_padding:
        return packed_attention_implementation(configured)
    return register_grouped_sdpa() if configured == "sdpa" else configured


def on_device(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a worker method on the worker's device: DataProto arguments move there, a DataProto result
    comes back to the CPU, where the driver and the other roles read it. A long call's freed memory goes back
    to the system (`trim_after_long_call`), so the next phase does not pile its peak on top of it."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        def move(value: Any) -> Any:
            return value.select().to(self.device) if isinstance(value, DataProto) else value

        start = time.perf_counter()
        result = method(self, *(move(a) for a in args), **{k: move(v) for k, v in kwargs.items()})
        trim_after_long_call(time.perf_counter() - start)
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
