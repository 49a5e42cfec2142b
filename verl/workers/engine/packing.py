"""Padding-free forward passes: the rows of a batch packed into one sequence, attention kept inside each.

A rollout batch is padded twice (prompts on the left, responses on the right), and with response
lengths that vary most of a padded batch can be padding. Packed, the model sees only the real tokens:
``input_ids`` of shape ``[1, T]`` (T = real tokens of the micro-batch), each row's ``position_ids``
starting again at 0, and the row boundaries as ``cu_seq_lens`` (cumulative lengths) — the keyword
arguments transformers' flash-attention path reads for variable-length batches. So with
``attn_implementation=flash_attention_2`` (GPU) the packed forward runs flash-attn's varlen kernel.

For SDPA and eager attention, where transformers would attend over the whole packed row with a
T x T block-diagonal mask, this module registers the attention implementation ``verl_varlen``: with
``cu_seq_lens_q`` present it gathers the rows into a ``[rows, max_len]`` batch *for the attention only*
(the linear layers, the bulk of the work, stay on the T real tokens) and runs causal SDPA on it; any
call without them (generation, padded passes) is SDPA as ``verl_sdpa`` runs it
(`verl.workers.engine.attention`), so the same model serves the rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from verl.workers.engine.attention import grouped_sdpa_attention

VARLEN_ATTENTION = "verl_varlen"
# Attention implementations that run a packed batch natively: cu_seq_lens go straight to their kernel.
NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3", VARLEN_ATTENTION)


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed sequence; plain SDPA when the call is not packed.

    ``query`` is ``[1, heads, T, head_dim]`` (``key`` / ``value`` may have fewer heads: GQA). Each
    sequence is copied into its own row of a right-padded ``[rows, heads, max_len, head_dim]`` batch;
    with right padding a causal mask alone is exact for every real query (it never reaches a later
    key, so never a pad), and the pads' outputs are dropped when the rows are packed again.
    """
    kwargs.pop("cu_seq_lens_k", None)
    kwargs.pop("max_length_k", None)
    if cu_seq_lens_q is None:
        return grouped_sdpa_attention(module, query, key, value, attention_mask, **kwargs)
    lengths = cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]
    max_len = int(max_length_q) if max_length_q is not None else int(lengths.max())
    offsets = torch.arange(max_len, device=query.device)
    real = offsets[None, :] < lengths[:, None]  # [rows, max_len]
    # Pads read token 0; their outputs are never used.
    gather = torch.where(real, cu_seq_lens_q[:-1, None] + offsets[None, :], 0).flatten()
    rows = lengths.numel()

    def to_rows(x: torch.Tensor) -> torch.Tensor:
        # [1, heads, T, d] -> [rows, heads, max_len, d]
        return x[0][:, gather].unflatten(1, (rows, max_len)).transpose(0, 1)

    kwargs.pop("is_causal", None)
    out, _ = grouped_sdpa_attention(
        module, to_rows(query), to_rows(key), to_rows(value), None, is_causal=True, **kwargs
    )
    # out: [rows, max_len, heads, d] -> the real positions, in packed order: [1, T, heads, d]
    return out.flatten(0, 1)[real.flatten()].unsqueeze(0), None


def register_varlen_attention() -> None:
    """Make ``attn_implementation="verl_varlen"`` available to transformers (idempotent)."""
    AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention)
    # Padded calls (generation) build their masks exactly as SDPA does.
    AttentionMaskInterface.register(VARLEN_ATTENTION, sdpa_mask)


def packed_attention_implementation(configured: str) -> str:
    """The implementation to load a model with when it will run packed batches (registering
    ``verl_varlen`` when that is the one)."""
    if configured in NATIVE_VARLEN:
        return configured
    register_varlen_attention()
    return VARLEN_ATTENTION


@dataclass
class PackedBatch:
    """The real tokens of a padded ``[rows, width]`` batch as one sequence, and the way back.

    ``token_index[i]`` is where packed token ``i`` sits in the flattened padded batch (rows * width).
    """

    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    cu_seq_lens: torch.Tensor  # [rows + 1], int32
    max_length: int
    token_index: torch.Tensor  # [T]

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a transformers model's forward."""
        cu = self.cu_seq_lens
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            # An all-ones mask tells transformers there is no padding (no T x T mask is built); the
            # sequence boundaries come from cu_seq_lens.
            "attention_mask": torch.ones_like(self.input_ids),
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedBatch:
    """Drop the padding of a batch whose real tokens are contiguous in each row (left- and/or right-padded)."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    token_index = mask.flatten().nonzero().squeeze(-1)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = lengths.cumsum(0)
    return PackedBatch(
        input_ids=input_ids.flatten()[token_index].unsqueeze(0),
        position_ids=position_ids.flatten()[token_index].unsqueeze(0),
        cu_seq_lens=cu,
        max_length=int(lengths.max()),
        token_index=token_index,
    )


def packed_positions(packed: PackedBatch, padded_positions: torch.Tensor, numel: int) -> torch.Tensor:
    """Where each flat padded position (all of them real tokens) sits in the packed sequence."""
    to_packed = torch.full((numel,), -1, dtype=torch.long, device=packed.token_index.device)
    to_packed[packed.token_index] = torch.arange(len(packed.token_index), device=to_packed.device)
    found = to_packed[padded_positions]
    if bool((found < 0).any()):
        raise ValueError(
            "a position to score is padding: the batch's attention_mask and response_mask disagree"
        )
    return found
