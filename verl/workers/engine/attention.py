"""``verl_sdpa``: transformers' SDPA attention, with grouped-query heads left grouped on a CPU.

transformers' ``sdpa`` attention repeats a grouped-query model's key and value heads to every query head
whenever the call has a mask (any padded batch), because CUDA's fused kernels refuse grouped heads with a
mask. torch's CPU flash kernel takes them (``enable_gqa``): the same numbers bit for bit, without the copies,
and autograd keeps the unrepeated keys and values for the backward. On SmolLM2-135M (9 query, 3 key-value
heads) one 16-row update micro-batch of the smollm2_arithmetic recipe keeps 668 instead of 784 MiB for its
backward, and runs ~2% faster (docs/performance.md). Every other call (a GPU, a model without grouped heads,
a position bias, a paged cache, attention weights asked for) is transformers' own SDPA.

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
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def register_grouped_sdpa() -> str:
    """Make ``attn_implementation="verl_sdpa"`` available to transformers (idempotent); returns the name."""
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # its masks are SDPA's
    return GROUPED_SDPA
