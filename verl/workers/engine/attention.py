"""``verl_sdpa``: transformers' SDPA attention, with grouped-query heads left grouped on a CPU.

transformers' ``sdpa`` attention repeats a grouped-query model's key and value heads to every query head
whenever the call has a mask (any padded batch), because CUDA's fused kernels refuse grouped heads with a
mask. torch's CPU flash kernel takes them (``enable_gqa``): the same numbers bit for bit, without the copies,
and autograd keeps the unrepeated keys and values for the backward. On SmolLM2-135M (9 query, 3 key-value
heads) one 16-row update micro-batch of the smollm2_arithmetic recipe keeps 668 instead of 784 MiB for its
backward, and runs ~2% faster (docs/performance.md). Short sequences (up to
``MATMUL_ATTENTION_MAX_SCORES`` scores) take two float32 matmuls instead of the flash kernel, whose backward
is slow at these sizes: the recipe's update 10-15% faster. Every other call (a GPU, a model without grouped
heads, a position bias, a paged cache, attention weights asked for) is transformers' own SDPA.

Workers load a model configured with ``attn_implementation: sdpa`` with this one (`attention_for`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "verl_sdpa"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``sdpa_attention_forward``'s result (``[batch, q_len, heads, head_dim]``); on a CPU with grouped heads
    computed by one ``scaled_dot_product_attention(..., enable_gqa=True)`` call."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    special = any(kwargs.get(name) is not None for name in ("position_bias", "cache")) or kwargs.get(
        "output_attentions", False
    )
    if query.device.type != "cpu" or not grouped or special:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    q_length = query.shape[2]
    # transformers' rule: the causal flag only without a mask, and never for one query (a decode step)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and q_length > 1 and attention_mask is None)
    if causal and key.shape[2] > q_length:  # a prefill into an empty static cache, as transformers crops it
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = query.shape[0] * query.shape[1] * q_length * key.shape[2]
    mask_4d = attention_mask is None or attention_mask.dim() == 4
    if dropout == 0.0 and mask_4d and scores <= MATMUL_ATTENTION_MAX_SCORES:
        out = grouped_matmul_attention(query, key, value, attention_mask, scale, causal)
    else:
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scale,
            is_causal=causal,
            enable_gqa=True,
        )
    return out.transpose(1, 2).contiguous(), None


MATMUL_ATTENTION_MAX_SCORES = 1 << 22
"""attention scores (batch x heads x queries x keys) up to which a CPU call is two float32 matmuls: 16 MB of
scores per layer kept for the backward, where the flash kernel keeps none. On SmolLM2's update micro-batch
(16 rows, 24 queries over 71 keys) forward and backward took 3.3 ms against the bf16 flash kernel's 7.0 ms, and
1.4 against 5.9 ms over 30 keys (2-core AVX-512 EPYC); longer sequences take the flash kernel."""


def grouped_matmul_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v in float32 (the inputs' dtype out), each key/value head serving its group
    of query heads without copies: ``[batch, heads, queries, dim]``. ``mask`` is SDPA's (True or 0 where a
    query may attend; False or -inf where not). A query that may attend to nothing gets a finite uniform
    average, as transformers' eager attention gives it (SDPA's kernels differ; such rows are padding)."""
    batch, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    if causal:
        mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
    # a 4D mask is [batch or 1, heads or 1, queries, keys]: each head's goes to its group's place
    if mask is not None and mask.dim() == 4:
        per_head = (kv_heads, group) if mask.shape[1] > 1 else (1, 1)
        mask = mask.view(mask.shape[0], *per_head, *mask.shape[-2:])
    with torch.autocast(query.device.type, enabled=False):  # float32 matmuls, also in a bf16 forward
        q = query.float().reshape(batch, kv_heads, group * queries, dim)  # a group's heads in a row
        scores = torch.matmul(q * scale, key.float().transpose(-1, -2))
        scores = scores.view(batch, kv_heads, group, queries, keys)
        if mask is not None:
            lowest = torch.finfo(torch.float32).min
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, lowest)
            else:
                scores = scores + mask.float().clamp(min=lowest)
        probs = scores.softmax(dim=-1).view(batch, kv_heads, group * queries, keys)
        return torch.matmul(probs, value.float()).view(batch, heads, queries, dim).to(query.dtype)


def register_grouped_sdpa() -> str:
    """Make ``attn_implementation="verl_sdpa"`` available to transformers (idempotent); returns the name."""
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # its masks are SDPA's
    return GROUPED_SDPA
