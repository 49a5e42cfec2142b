"""The weights the lean decode step reads, gathered once per ``generate_sequences`` call: q/k/v and gate/up
fused, and the matmul each projection uses (oneDNN prepacked, oneDNN over the module's weights, or F.linear)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from verl.models.lora import adapter_delta, round_merged


def onednn_linear_available() -> bool:
    """Whether this torch has oneDNN's prepacked linear (CPU builds with MKL-DNN: the usual wheels)."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


def onednn_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN's linear computes in on this CPU: bf16 needs avx512bw/vl/dq or avx_ne_convert (an
    AVX2-only CPU raises at the weight's reorder); F.linear computes bf16 anywhere."""
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return (torch.float32, torch.bfloat16)
    return (torch.float32,)


MATMULS = ("packed", "onednn", "torch")


class _Linear:
    """``y = x W^T + b`` for one projection, or several fused (their outputs concatenated).

    How, by ``matmul``:

    * ``"packed"``: W reordered once per call into oneDNN's blocked layout (``torch.ops.mkldnn``, what
      inductor's frozen CPU graphs call): a copy of the weights, ~150 us per projection to make;
    * ``"onednn"``: the same oneDNN kernel over W as it is (no copy unless fused): 10-30% slower than
      packed at these shapes;
    * ``"torch"``: ``F.linear`` (MKL's sgemm), HF's own arithmetic: the logits are bit-identical to HF's.

    On this machine's AVX-512 CPU oneDNN runs the decode shapes (16-64 rows x 128-2048 features) 1.3-2.5x
    faster than ``F.linear`` in float32 (``benchmarks/rollout_speed.py --matmuls``). Same float32
    arithmetic, another summation order: the logits agree with HF's to float32 rounding. ``compute_dtype``
    (oneDNN paths only): the input is cast to it first, the weight copied in it: what an outer
    ``torch.autocast`` does to ``F.linear``, which it does not know to do to oneDNN's op.
    """

    __slots__ = ("weight", "bias", "parts", "onednn", "compute_dtype")

    def __init__(
        self,
        projections: list[tuple[torch.Tensor, torch.Tensor | None]],
        matmul: str,
        fuse: bool,
        compute_dtype: torch.dtype | None,
    ) -> None:
        self.onednn = matmul != "torch"
        self.compute_dtype = compute_dtype if self.onednn else None  # F.linear: autocast casts it
        self.parts = None
        if len(projections) > 1 and not fuse and matmul != "packed":
            self.parts = [_Linear([p], matmul, False, compute_dtype) for p in projections]
            self.weight = self.bias = None
            return
        weight = projections[0][0] if len(projections) == 1 else torch.cat([w for w, _ in projections])
        bias = _concat_bias(projections)
        weight = weight.detach()
        if self.compute_dtype is not None:
            weight = weight.to(self.compute_dtype)
            bias = None if bias is None else bias.to(self.compute_dtype)
        if matmul == "packed":
            weight = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.parts is not None:
            return torch.cat([part(x) for part in self.parts], dim=-1)
        if not self.onednn:
            return F.linear(x, self.weight, self.bias)
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def _concat_bias(projections: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor | None:
    if all(bias is None for _, bias in projections):
        return None
    if len(projections) == 1:
        return projections[0][1].detach()
    biases = [weight.new_zeros(weight.shape[0]) if bias is None else bias for weight, bias in projections]
    return torch.cat(biases).detach()


def projection(
    module: torch.nn.Module, dtype: torch.dtype | None = None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias a projection computes with: an ``nn.Linear``'s own, or for a peft LoRA layer its
    base weight with its active adapters merged in (`verl.models.lora.adapter_delta`), rounded once to
    ``dtype`` (None: the base weight's), without bias (`verl.models.lora.round_merged`, ``seed`` fixing its
    thresholds). Nothing is added while the adapters are disabled (the reference policy) or already merged."""
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    delta = adapter_delta(module)
    if delta is None:
        return base.weight, base.bias
    merged = base.weight.detach().float() + delta
    return round_merged(merged, dtype or base.weight.dtype, seed), base.bias


def _base_weight(module: torch.nn.Module) -> torch.Tensor:
    """A projection's own weight (a peft LoRA layer's base layer's)."""
    return (module.get_base_layer() if hasattr(module, "get_base_layer") else module).weight


def adapted(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a peft LoRA layer (its decode weight is a merged copy)."""
    return hasattr(module, "lora_A")


@dataclass
class _LayerWeights:
    """One decoder layer: its norms' weights and its projections (q/k/v and gate/up fused or not)."""

    ln1: torch.Tensor
    ln1_eps: float
    qkv: _Linear
    o: _Linear
    ln2: torch.Tensor
    ln2_eps: float
    gate_up: _Linear
    down: _Linear


@dataclass
class LeanWeights:
    """What the lean step reads of a model, gathered once per ``generate_sequences`` call (the actor updates
    the parameters in place between calls, so nothing is kept across calls)."""

    embed: torch.Tensor
    final_norm: torch.Tensor
    final_eps: float
    lm_head: _Linear
    layers: list[_LayerWeights]
    matmul: str
    fused: bool

    matmul_override: ClassVar[str | None] = None
    """force one of ``MATMULS`` (tests, ablations); None: ``packed`` for models up to ``pack_limit_bytes``,
    else ``onednn``, ``torch`` where this torch has no oneDNN"""
    pack_limit_bytes = 256 * 2**20
    """prepack models whose projections take up to this much (the 4M model: 16 MB; SmolLM2-135M's 0.5 GB
    is not copied: ``onednn`` over its own weights), and any model the decode copies anyway (LoRA adapters
    merged in, or weights cast to the autocast dtype)"""
    fuse_limit_bytes = 64 * 2**20
    """fuse q/k/v and gate/up (a copy) when those weights take up to this much (~16M fp32 parameters):
    one matmul instead of three / two saves ~20% of a step while per-op overhead dominates (1M model:
    0.93 vs 1.14 ms per step at batch 1)"""

    @classmethod
    def gather(cls, model: torch.nn.Module) -> LeanWeights:
        inner = model.model
        compute_dtype = _autocast_dtype()
        layers_linears = [
            (
                layer.self_attn.q_proj,
                layer.self_attn.k_proj,
                layer.self_attn.v_proj,
                layer.self_attn.o_proj,
                layer.mlp.gate_proj,
                layer.mlp.up_proj,
                layer.mlp.down_proj,
            )
            for layer in inner.layers
        ]
        # A merged weight has its base weight's shape and dtype: the choices below read the base weights, and
        # each layer's adapters are merged only as it is packed (one layer's float32 copies alive at a time).
        bases = [[_base_weight(lin) for lin in group] for group in layers_linears]
        nbytes = [[w.numel() * w.element_size() for w in group] for group in bases]
        all_bytes = sum(map(sum, nbytes)) + model.lm_head.weight.numel() * model.lm_head.weight.element_size()
        fused_bytes = sum(b[0] + b[1] + b[2] + b[4] + b[5] for b in nbytes)
        dtype = compute_dtype or model.lm_head.weight.dtype
        # The decode computes from a copy anyway when adapters are merged in or autocast casts the weights:
        # then packing that copy costs nothing extra.
        copied = any(adapted(lin) for group in layers_linears for lin in group) or dtype != bases[0][0].dtype
        matmul = cls.matmul_override
        onednn_computes = dtype in onednn_dtypes()
        if matmul is None:
            on_cpu = model.lm_head.weight.device.type == "cpu"  # oneDNN's ops here are CPU kernels
            if not on_cpu or not onednn_linear_available() or not onednn_computes:
                matmul = "torch"
            else:
                matmul = "packed" if copied or all_bytes <= cls.pack_limit_bytes else "onednn"
        if matmul not in MATMULS:
            raise ValueError(f"matmul {matmul!r}: one of {MATMULS}")
        if matmul != "torch" and not onednn_computes:
            raise ValueError(
                f"matmul {matmul!r} in {dtype}: oneDNN computes only {onednn_dtypes()} on this CPU"
            )
        fuse = matmul == "packed" or fused_bytes <= cls.fuse_limit_bytes

        def linear(*projections: tuple[torch.Tensor, torch.Tensor | None]) -> _Linear:
            return _Linear(list(projections), matmul, fuse, compute_dtype)

        layers = []
        for index, (layer, group) in enumerate(zip(inner.layers, layers_linears, strict=True)):
            # merging costs a matmul: once; each projection's own rounding thresholds (`round_merged`)
            q, k, v, o, gate, up, down = (
                projection(lin, compute_dtype, seed=8 * index + slot) for slot, lin in enumerate(group)
            )
            layers.append(
                _LayerWeights(
                    ln1=layer.input_layernorm.weight,
                    ln1_eps=layer.input_layernorm.variance_epsilon,
                    qkv=linear(q, k, v),
                    o=linear(o),
                    ln2=layer.post_attention_layernorm.weight,
                    ln2_eps=layer.post_attention_layernorm.variance_epsilon,
                    gate_up=linear(gate, up),
                    down=linear(down),
                )
            )
        return cls(
            embed=inner.embed_tokens.weight,
            final_norm=inner.norm.weight,
            final_eps=inner.norm.variance_epsilon,
            lm_head=linear(projection(model.lm_head, compute_dtype, seed=8 * len(layers))),
            layers=layers,
            matmul=matmul,
            fused=fuse,
        )


def _autocast_dtype() -> torch.dtype | None:
    """The dtype of an enclosing ``torch.autocast("cpu")``, None outside one."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return None
