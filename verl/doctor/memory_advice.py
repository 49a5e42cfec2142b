"""What the memory estimate (:mod:`verl.doctor.memory`) advises, and the disk a run's checkpoints take: the
settings that bound each phase's transient memory and those that shrink what is held throughout, with their
current values, the phases' printed names, and one checkpoint's size.
"""

from __future__ import annotations

from typing import Any

from verl.doctor.model_shape import Models, dtype_bytes, lora_parameters, lora_settings
from verl.workers.errors import (
    ACTOR_UPDATE_KNOBS,
    CRITIC_UPDATE_KNOBS,
    GENERATE_KNOBS,
    LOG_PROB_KNOBS,
    REF_LOG_PROB_KNOBS,
    VALUES_KNOBS,
    knob_advice,
)

PHASE_KNOBS: dict[str, tuple[str, ...]] = {
    "generate": GENERATE_KNOBS,
    "validate": ("data.val_batch_size", *GENERATE_KNOBS),
    "old_log_prob": LOG_PROB_KNOBS,
    "ref": REF_LOG_PROB_KNOBS,
    "actor_update": ACTOR_UPDATE_KNOBS,
    "values": VALUES_KNOBS,
    "critic_update": CRITIC_UPDATE_KNOBS,
}
"""the settings that bound each phase's transient memory: the lists verl.workers.errors gives with an
out-of-memory error in that worker method"""

PHASE_NAMES = {
    "generate": "generation",
    "validate": "validation generation",
    "old_log_prob": "old log-prob pass",
    "ref": "reference pass",
    "values": "critic value pass",
    "actor_update": "actor update",
    "critic_update": "critic update",
}


def state_knobs(config: Any, on_gpu: bool) -> list[str]:
    """What shrinks the memory held throughout (weights, gradients, optimizer state), with current values."""
    arr = config.actor_rollout_ref
    out = []
    if not arr.model.lora_rank and arr.model.lora_adapter_path is None:
        out.append(
            "set actor_rollout_ref.model.lora_rank=32 (LoRA: gradients and optimizer state for adapters only)"
        )
    if dtype_bytes(arr.model.torch_dtype) > 2:
        out.append(f"set actor_rollout_ref.model.torch_dtype=bfloat16 (now {arr.model.torch_dtype})")
    ranks = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    out.append(
        f"shard over more ranks: trainer.backend=ray (now {config.trainer.backend}), trainer.n_gpus_per_node "
        f"(now {config.trainer.n_gpus_per_node}, {ranks} rank(s) in all) with actor_rollout_ref.actor.strategy=fsdp2"
    )
    if on_gpu:
        for key in (
            "actor_rollout_ref.actor.fsdp_config.param_offload=true",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
            "actor_rollout_ref.ref.fsdp_config.param_offload=true",
        ):
            advice = knob_advice(key, config)
            if advice:
                out.append(advice)
        if arr.rollout.name == "vllm":
            out.append(knob_advice("actor_rollout_ref.rollout.gpu_memory_utilization", config) or "")
    return [line for line in out if line]


def phase_knobs(config: Any, phase: str, budgeted: bool = False) -> list[str]:
    """``lower key (now v)`` for each setting bounding ``phase``'s transient memory: the token budgets when its
    micro-batches are formed by tokens (``budgeted``, use_dynamic_bsz), the row counts otherwise."""
    knobs = [
        knob
        for knob in PHASE_KNOBS.get(phase, ())
        if not ("max_token_len" in knob and not budgeted)
        and not ("micro_batch_size_per_gpu" in knob and budgeted)
    ]
    return [a for a in (knob_advice(k, config) for k in knobs) if a]


def checkpoint_bytes(config: Any, models: Models) -> int:
    """One checkpoint's size (what every ``trainer.save_freq`` steps writes): per trained role, its weights
    (with LoRA the adapters alone) for ``model``, the AdamW state for ``optimizer``, the whole weights again for
    ``hf_model``."""
    arr = config.actor_rollout_ref
    lora = lora_settings(arr.model)
    wb = dtype_bytes(arr.model.torch_dtype)
    full = models.actor.params * wb
    if lora:
        adapters = lora_parameters(models.actor, *lora) * 4
        roles = [(arr.actor.checkpoint, adapters, 2 * adapters, full)]
    else:
        roles = [(arr.actor.checkpoint, full, 2 * full, full)]
    if models.critic is not None:
        cb = dtype_bytes(config.critic.model.torch_dtype)
        critic = models.critic.params * cb
        roles.append((config.critic.checkpoint, critic, 2 * critic, critic))
    total = 0
    for checkpoint, weights, optimizer, hf_model in roles:
        contents = set(checkpoint.save_contents)
        total += ("model" in contents) * weights + ("optimizer" in contents) * optimizer
        total += ("hf_model" in contents) * hf_model
    return total
