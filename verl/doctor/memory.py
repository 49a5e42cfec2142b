"""A peak-memory estimate per role (actor, reference, critic, rollout, reward model), from the model's config
alone: no weights are loaded.

The parameter count comes from building the model on PyTorch's meta device (shapes, no storage) from its
``config.json``, so every architecture transformers knows is counted exactly, tied embeddings once. What each
role holds follows the code of this repository:

* actor: weights in ``model.torch_dtype``; gradients and AdamW's two moment tensors in the trained
  parameters' dtype (``torch.optim.AdamW`` over the parameters: no separate fp32 master copy); with LoRA the
  base weights are frozen and only the adapters (fp32, as peft makes them) have gradients and optimizer state.
  FSDP2 divides all of it by the ranks that shard the model (``fsdp_size``, -1 = all); ``dp`` does not, and
  with more than one rank DDP keeps a second copy of the gradients in its buckets;
* reference: a frozen copy of the weights when a KL term needs it (``StepPlan.ref``); none with LoRA (the actor
  with its adapters disabled is the reference);
* critic: like the actor, for the value model (the causal LM's backbone with a one-label head);
* rollout: the fast / hf engines generate with the actor's own module (under FSDP2 every weight is gathered for
  the generation) and a KV cache of ``rows x (prompt + response)`` positions; vLLM holds its own copy of the
  weights and a KV cache (on a CPU sized as ``verl.workers.rollout.vllm.kv_cache_bytes`` sizes it; on a GPU the
  engine takes ``gpu_memory_utilization`` of the device, and sleeps between generates with
  ``free_cache_engine``);
* activations of the largest pass of each kind (a rough formula, see :data:`ACT_HIDDEN`), and the LM head's
  full-vocabulary logits for ``log_prob_chunk_size`` response positions at once (``verl.workers.engine.scoring``);
* every process: the Python runtime with torch and transformers imported (:data:`RUNTIME_CPU_BYTES`), and a
  CUDA context per GPU process.

Phases do not all hold their memory at once: the peak is the largest sum over the phases of one step (generate,
validate, old log-probs, reference, values, critic update, actor update), each phase counting what is held
throughout plus its own transient memory. Offloaded states (``fsdp_config.param_offload`` /
``optimizer_offload``, GPU only) are on the GPU only in the phases that use them, and in CPU memory otherwise.

The parts: :mod:`verl.doctor.model_shape` counts the models, :mod:`verl.doctor.memory_terms` holds the sizes, the
terms and the trained models' state, :mod:`verl.doctor.memory_rollout` the rollout engine's memory, and
:mod:`verl.doctor.memory_advice` the settings to change and a checkpoint's size; this module adds them up per role.
"""

from __future__ import annotations

from typing import Any

from verl.doctor.batches import BatchReport
from verl.doctor.memory_advice import PHASE_KNOBS, PHASE_NAMES, checkpoint_bytes, phase_knobs, state_knobs
from verl.doctor.memory_rollout import _rollout_terms
from verl.doctor.memory_terms import (
    ACCURACY,
    ACT_HIDDEN,
    ACT_INTER,
    BATCH_BYTES_PER_TOKEN,
    CUDA_CONTEXT_BYTES,
    FWD_HIDDEN,
    FWD_INTER,
    HEAD_FORWARD_COPIES,
    HEAD_TRAIN_COPIES,
    RUNTIME_CPU_BYTES,
    TRAIN_PHASES,
    VLLM_RUNTIME_BYTES,
    Estimate,
    Layout,
    Term,
    TrainedModel,
    _activation_terms,
    _gathered_terms,
    _moved,
    _state_terms,
    layout_of,
)
from verl.doctor.model_shape import (
    Models,
    ModelShape,
    count_model,
    dtype_bytes,
    fmt_count,
    lora_parameters,
    lora_settings,
)
from verl.utils.units import fmt_bytes

__all__ = [
    "ACCURACY",
    "ACT_HIDDEN",
    "ACT_INTER",
    "BATCH_BYTES_PER_TOKEN",
    "CUDA_CONTEXT_BYTES",
    "FWD_HIDDEN",
    "FWD_INTER",
    "HEAD_FORWARD_COPIES",
    "HEAD_TRAIN_COPIES",
    "PHASE_KNOBS",
    "PHASE_NAMES",
    "RUNTIME_CPU_BYTES",
    "TRAIN_PHASES",
    "VLLM_RUNTIME_BYTES",
    "Estimate",
    "Layout",
    "ModelShape",
    "Models",
    "Term",
    "TrainedModel",
    "checkpoint_bytes",
    "count_model",
    "dtype_bytes",
    "estimate_memory",
    "fmt_count",
    "layout_of",
    "lora_parameters",
    "lora_settings",
    "phase_knobs",
    "state_knobs",
]


def estimate_memory(
    config: Any,
    batches: BatchReport,
    models: Models,
    *,
    strategy: str,
    ref: bool,
    critic: bool,
    owns_weights: bool,
    on_gpu: bool,
    gpu_total: int | None = None,
) -> Estimate:
    """The memory of one rank's roles, phase by phase (see the module docstring for what is counted)."""
    arr = config.actor_rollout_ref
    layout = layout_of(config, batches.dp, strategy, on_gpu)
    seq = batches.seq_len
    eager = arr.model.attn_implementation == "eager"
    actor_shape = models.actor
    lora = lora_settings(arr.model)
    trainable = lora_parameters(actor_shape, *lora) if lora else actor_shape.params
    actor_phases = frozenset(
        p for p in batches.passes if p in ("generate", "validate", "old_log_prob", "actor_update")
    )
    if ref and lora:
        actor_phases |= {"ref"}
    actor = TrainedModel(
        "actor",
        actor_shape,
        layout.weight_bytes,
        trainable,
        4 if lora else layout.weight_bytes,
        arr.actor.fsdp_config,
        actor_phases,
        "actor_update",
        lora=lora is not None,
    )
    terms = _state_terms(actor, layout)
    shard = layout.shard(int(arr.actor.fsdp_config.fsdp_size))
    ckpt = bool(arr.model.enable_gradient_checkpointing)
    for phase in ("actor_update", "old_log_prob"):
        if phase in batches.passes:
            terms += _activation_terms("actor", actor_shape, batches.passes[phase], layout, seq, ckpt, eager)
            whole = phase == "actor_update" and not arr.actor.fsdp_config.reshard_after_forward
            terms += _gathered_terms("actor", actor_shape, layout, shard, frozenset({phase}), whole)
    terms += _reference_terms(config, actor_shape, batches, layout, ref, lora is not None, eager)
    if critic and models.critic is not None:
        terms += _critic_terms(config, models.critic, batches, layout)
    terms += _rollout_terms(config, actor_shape, batches, layout, owns_weights, gpu_total)
    if models.reward is not None:
        terms.append(
            Term(
                "reward model",
                "weights",
                models.reward.params * models.reward_bytes,
                f"{fmt_count(models.reward.params)} params x {models.reward_bytes} B (the checkpoint's dtype)",
                "gpu" if on_gpu else "cpu",
            )
        )
    terms += _runtime_terms(config, batches, layout, on_gpu)
    phases = list(batches.passes)
    return Estimate(terms, phases, on_gpu, layout.ranks_per_node)


def _reference_terms(
    config: Any, shape: ModelShape, batches: BatchReport, layout: Layout, ref: bool, lora: bool, eager: bool
) -> list[Term]:
    if not ref or "ref" not in batches.passes:
        return []
    arr = config.actor_rollout_ref
    fsdp_cfg = arr.ref.fsdp_config
    terms = []
    if not lora:  # with LoRA the actor with its adapters disabled is the reference: no copy
        shard = layout.shard(int(fsdp_cfg.fsdp_size))
        over = f" / {shard} ranks (fsdp2)" if shard > 1 else ""
        term = Term(
            "reference",
            "weights",
            shape.params * layout.weight_bytes // shard,
            f"{fmt_count(shape.params)} params x {layout.weight_bytes} B{over}",
        )
        if layout.on_gpu and fsdp_cfg.param_offload:
            terms.append(_moved(term, frozenset({"ref"}), "gpu", "on the GPU only for its pass"))
            terms.append(_moved(term, None, "cpu", "offloaded: in CPU memory between phases"))
        else:
            terms.append(_moved(term, None, "gpu" if layout.on_gpu else "cpu", ""))
        terms += _gathered_terms("reference", shape, layout, shard, frozenset({"ref"}), whole=False)
    ckpt = bool(arr.model.enable_gradient_checkpointing)
    terms += _activation_terms(
        "reference", shape, batches.passes["ref"], layout, batches.seq_len, ckpt, eager
    )
    return terms


def _critic_terms(config: Any, shape: ModelShape, batches: BatchReport, layout: Layout) -> list[Term]:
    critic_cfg = config.critic
    wb = dtype_bytes(critic_cfg.model.torch_dtype)
    phases = frozenset(p for p in ("values", "critic_update") if p in batches.passes)
    model = TrainedModel(
        "critic", shape, wb, shape.params, wb, critic_cfg.model.fsdp_config, phases, "critic_update"
    )
    critic_layout = Layout(
        layout.on_gpu,
        layout.dp,
        layout.strategy,
        layout.ranks_per_node,
        wb,
        layout.compute_bytes if layout.fsdp else wb,
    )
    terms = _state_terms(model, critic_layout)
    ckpt = bool(critic_cfg.model.enable_gradient_checkpointing)
    eager = critic_cfg.model.attn_implementation == "eager"
    for phase in ("critic_update", "values"):
        if phase in batches.passes:
            terms += _activation_terms(
                "critic", shape, batches.passes[phase], critic_layout, batches.seq_len, ckpt, eager
            )
    return terms


def _runtime_terms(config: Any, batches: BatchReport, layout: Layout, on_gpu: bool) -> list[Term]:
    """Each process's runtime, the CUDA context, and the driver's copy of the step's batch."""
    ray = config.trainer.backend == "ray"
    terms = [
        Term(
            "runtime",
            "Python + torch + transformers" + (" (each worker)" if ray else ""),
            RUNTIME_CPU_BYTES,
            f"{fmt_bytes(RUNTIME_CPU_BYTES)} per process (measured)",
        )
    ]
    if ray:
        terms.append(
            Term(
                "runtime",
                "driver process",
                RUNTIME_CPU_BYTES,
                f"{fmt_bytes(RUNTIME_CPU_BYTES)}",
                per_rank=False,
            )
        )
        rewards = int(config.reward_model.num_workers)
        terms.append(
            Term(
                "runtime",
                "reward worker processes",
                rewards * RUNTIME_CPU_BYTES,
                f"{rewards} x {fmt_bytes(RUNTIME_CPU_BYTES)}",
                per_rank=False,
            )
        )
    if on_gpu:
        terms.append(
            Term(
                "runtime",
                "CUDA context",
                CUDA_CONTEXT_BYTES,
                "typical per GPU process (not measured here)",
                "gpu",
            )
        )
    samples = int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n)
    terms.append(
        Term(
            "runtime",
            "the step's batch (driver)",
            samples * batches.seq_len * BATCH_BYTES_PER_TOKEN,
            f"{samples} samples x {batches.seq_len} positions x {BATCH_BYTES_PER_TOKEN} B",
            per_rank=False,
        )
    )
    return terms
