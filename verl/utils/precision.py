"""The dtype a role computes in on a CPU, and the autocast context that applies it.

``fsdp_config.mixed_precision.param_dtype`` (verl's key) names the dtype the forward and backward compute
in; the weights, their gradients and the optimizer stay in the weights' own dtype (``model.torch_dtype``),
as verl's mixed precision keeps fp32 master weights. Unset, it is bf16 on a GPU (verl's default), and on a
CPU bf16 where the CPU has bf16 instructions (``avx512_bf16`` or AMX), the weights' dtype elsewhere: without
them torch emulates bf16, several times slower than fp32 (docs/performance.md, "bf16 on a CPU", has what it
gains where it is there).

The plain (``dp``) strategy applies it with ``torch.autocast`` around the whole model, LM head included (as
verl's actor does); the log-softmax and entropy are computed in fp32 from the logits. The rollout engines
that generate with the actor's module (fast, hf) compute in the actor's dtype unless ``rollout.dtype`` says
otherwise, so the rollout's log-probs and the update's come from the same arithmetic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from verl.models.loading import resolve_dtype
from verl.utils.cpu import bf16_kernels_capped, read_cpuinfo


@dataclass(frozen=True)
class ComputeDtype:
    """The dtype a role's forward and backward compute in (None: the weights' own) and why."""

    dtype: torch.dtype | None
    reason: str

    def describe(self, role: str) -> str:
        name = "the weights' dtype" if self.dtype is None else str(self.dtype).removeprefix("torch.")
        return f"{role} computes in {name} ({self.reason})"


def choose_compute_dtype(
    asked: str | None,
    *,
    device: torch.device,
    weights_dtype: torch.dtype,
    cpu_bf16: bool | None = None,
    key: str = "fsdp_config.mixed_precision.param_dtype",
) -> ComputeDtype:
    """Resolve ``param_dtype`` for one role. ``cpu_bf16``: whether this CPU has bf16 instructions (None:
    read /proc/cpuinfo)."""
    if asked is not None:
        dtype = resolve_dtype(asked, key)
        return ComputeDtype(None if dtype == weights_dtype else dtype, key)
    if weights_dtype != torch.float32:
        return ComputeDtype(None, f"{key} unset: the weights are {str(weights_dtype).removeprefix('torch.')}")
    if device.type == "cuda":
        return ComputeDtype(torch.bfloat16, f"{key} unset: bf16 on a GPU, as verl")
    if device.type != "cpu":
        return ComputeDtype(None, f"{key} unset on {device.type}")
    if cpu_bf16 is None:
        capped = bf16_kernels_capped()
        if capped:
            return ComputeDtype(None, f"{key} unset: {capped} caps the CPU kernels below bf16")
        cpu_bf16 = read_cpuinfo().bf16_fast
    if not cpu_bf16:
        return ComputeDtype(None, f"{key} unset: this CPU has no bf16 instructions (avx512_bf16 / AMX)")
    return ComputeDtype(torch.bfloat16, f"{key} unset: this CPU has bf16 instructions")


@contextlib.contextmanager
def compute_in(dtype: torch.dtype | None, device: torch.device | str = "cpu") -> Iterator[None]:
    """Autocast to ``dtype`` (nothing when None).

    Where gradients flow, without autocast's cache of cast weights: that cache is one per process, and any
    thread's autocast exit clears it, so with roles in threads of one process (the local backend: actor ∥
    critic, actor ∥ rollout role) a training forward would sometimes reuse a weight's cast and sometimes
    cast it again, and its gradients would differ in the last bits from run to run (measured, torch 2.13).
    Inference keeps the cache: a cast gives the same values whether cached or not."""
    if dtype is None:
        yield
        return
    with torch.autocast(torch.device(device).type, dtype=dtype, cache_enabled=not torch.is_grad_enabled()):
        yield


def _frozen_linear_weights(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The fp32 weights of ``model``'s linear layers that nothing trains and only a linear layer uses (not one
    tied to the embeddings, whose lookup autocast leaves in fp32), and that are not DTensor shards."""
    linear_weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    elsewhere = {
        id(p)
        for m in model.modules()
        if not isinstance(m, torch.nn.Linear)
        for p in m.parameters(recurse=False)
    }
    return [
        p
        for key, p in linear_weights.items()
        if key not in elsewhere
        and not p.requires_grad
        and p.dtype == torch.float32
        and type(p.data) is torch.Tensor  # not a DTensor shard
    ]


@contextlib.contextmanager
def frozen_linear_weights_in(model: torch.nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """The frozen weights of ``model``'s linear layers (a LoRA base, a reference) held in ``dtype`` for the
    duration: cast once, where ``torch.autocast`` would cast each of them again in every forward and
    every backward of every micro-batch (its cache is off where gradients flow, ``compute_in``).

    The same numbers: autocast's matmul casts the weight to its dtype and a weight already in it passes
    through. Only the weights `_frozen_linear_weights` selects; the float32 originals are put back afterwards.
    Nothing when ``dtype`` is None or the weights are sharded (FSDP2 casts its own)."""
    if dtype is None:
        yield
        return
    frozen = _frozen_linear_weights(model)
    originals = [p.data for p in frozen]
    try:
        for p in frozen:
            p.data = p.data.to(dtype)
        yield
    finally:
        for p, original in zip(frozen, originals, strict=True):
            p.data = original


def hold_frozen_weights_in(model: torch.nn.Module, dtype: torch.dtype | None) -> int:
    """A LoRA model computed in ``dtype`` (bf16): its frozen linear weights held in ``dtype`` for good, and its
    other frozen weights copied out of the checkpoint file they were loaded from; the number of bytes freed.

    The same numbers as `frozen_linear_weights_in` (every matmul of a frozen base weight runs in ``dtype``
    under autocast; LoRA's merge into a weight for decoding, `verl.models.lora.round_merged`, rounds without bias
    onto bf16's grid, where this base lies), without
    the fp32 copies it puts back: SmolLM2-135M's base is 0.21 GB of bf16 instead of 0.54 GB of fp32. A LoRA base
    never trains and is never saved (checkpoints hold the adapters, `verl export` reads the base from its
    path). The copies matter as much: transformers maps the safetensors file into memory, and while any tensor
    of it lives its pages count in the process's RSS. Nothing when ``dtype`` is None."""
    if dtype is None:
        return 0
    before = sum(p.numel() * p.element_size() for p in model.parameters())
    for p in _frozen_linear_weights(model):
        p.data = p.data.to(dtype)
    for p in model.parameters():
        if not p.requires_grad and type(p.data) is torch.Tensor and p.dtype != dtype:
            p.data = p.data.clone()  # out of the file's memory map, which is unmapped once nothing uses it
    return before - sum(p.numel() * p.element_size() for p in model.parameters())


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of a module's first floating-point parameter (float32 when it has none)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def role_compute_dtype(
    fsdp_cfg: Any, *, device: torch.device, weights_dtype: torch.dtype, sharded: bool, key: str
) -> ComputeDtype:
    """The autocast dtype of one role's scorer. FSDP2 (``sharded``) applies ``param_dtype`` itself through
    its MixedPrecisionPolicy (chosen alike: `verl.workers.engine.fsdp.mixed_precision`), so its scorer does
    not autocast."""
    choice = choose_compute_dtype(
        fsdp_cfg.mixed_precision.param_dtype,
        device=device,
        weights_dtype=weights_dtype,
        key=f"{key}.mixed_precision.param_dtype",
    )
    if sharded:
        policy = choice.describe("FSDP2's mixed-precision policy")
        return ComputeDtype(None, f"{key}.mixed_precision: {policy}")
    return choice


def rollout_compute_dtype(
    asked: str | None, actor: ComputeDtype, model: torch.nn.Module
) -> torch.dtype | None:
    """The autocast dtype of a rollout engine that generates with the actor's module: ``rollout.dtype``,
    else the actor's."""
    if asked is None:
        return actor.dtype
    dtype = resolve_dtype(asked, "actor_rollout_ref.rollout.dtype")
    return None if dtype == model_dtype(model) else dtype


def actor_compute_choice(config: Any) -> ComputeDtype:
    """What the actor computes in, decided from the config as its worker decides it (the start-up line, the
    step plan)."""
    from verl.models.plumbing import resolve_device

    arr = config.actor_rollout_ref
    return choose_compute_dtype(
        arr.actor.fsdp_config.mixed_precision.param_dtype,
        device=resolve_device(config.trainer.device),
        weights_dtype=resolve_dtype(arr.model.torch_dtype),
        key="actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
    )


def actor_compute_line(config: Any) -> str:
    """The start-up line of what the actor computes in (`actor_compute_choice`)."""
    from verl.config.backends import training_strategy

    line = actor_compute_choice(config).describe("actor")
    if training_strategy(config) == "fsdp2":
        line += "; FSDP2 gathers the weights in it (MixedPrecisionPolicy)"
    return line
