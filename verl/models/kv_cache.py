"""KV caches across transformers versions (the forward's keyword for it, a fresh one), the row bookkeeping
for filling one cache per distinct prompt and sharing it among the rows that repeat it, and the prefix that
every prompt of a batch starts with, computed once (`common_prefix`, `forward_prompts`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch


def cache_keyword(module: torch.nn.Module) -> str:
    """transformers 5 renamed the forward's ``past_key_values`` to ``cache``."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def new_cache(config: Any) -> Any:
    """An empty ``DynamicCache`` for a model config."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers < 4.56
        return DynamicCache()


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(representative, inverse)`` for the distinct rows of a 2-D tensor: ``rows[representative]`` holds
    each distinct row once, and ``inverse[i]`` is the index of row ``i``'s among them (so a per-distinct
    result ``r`` expands back to every row as ``r[inverse]``)."""
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    representative = torch.empty(int(inverse.max()) + 1, dtype=torch.long, device=inverse.device)
    representative.scatter_(0, inverse, torch.arange(len(inverse), device=inverse.device))
    return representative, inverse


def leading_padding_columns(attention_mask: torch.Tensor) -> int:
    """How many leading columns are padding in every row of a left-padded batch (never attended to)."""
    return int(attention_mask.long().cumsum(-1).eq(0).all(0).sum())


MIN_PREFIX_TOKENS_SAVED = 16
"""A common prompt prefix is computed once only when that saves at least this many token passes (its length
times the other prompts): the pass it adds reads every layer's weights once more, which a role header of a few
tokens would not repay."""


class PromptPrefix(NamedTuple):
    """How a batch of left-padded prompts is computed: the real tokens every prompt starts with (``length``
    of them; 0 = none shared) once, as one row, then from column ``start`` on each prompt's rest, whose real
    tokens ``suffix_mask`` marks (``[rows, width - start]``: the prefix's own columns masked out).

    A chat template puts the same system prompt and role header in front of every question: on SmolLM2's
    arithmetic recipe 26 of a prompt's ~47 tokens."""

    length: int
    start: int
    suffix_mask: torch.Tensor
    columns: slice = slice(0, 0)
    """the prefix's columns in the first row"""

    def cache_mask(self) -> torch.Tensor:
        """The attention mask of the keys and values the prompts leave in a cache: the shared prefix's
        ``length`` columns, then the suffix columns (``[rows, length + width - start]``)."""
        mask = self.suffix_mask
        return torch.cat([mask.new_ones(mask.shape[0], self.length), mask], dim=1)


def no_prefix(attention_mask: torch.Tensor) -> PromptPrefix:
    """Every prompt computed whole (leading columns that are padding in every row skipped)."""
    start = leading_padding_columns(attention_mask)
    return PromptPrefix(0, start, attention_mask[:, start:])


def common_prefix(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, min_saved: int = MIN_PREFIX_TOKENS_SAVED
) -> PromptPrefix:
    """The longest run of real tokens that every row of left-padded, distinct prompts starts with, kept short
    of each row's last token (that position's output is each row's own); shared only when it saves at
    least ``min_saved`` token passes, and only for left-padded rows (real tokens up to the last column)."""
    rows, width = input_ids.shape
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    if rows < 2 or not bool(mask[:, -1].all()) or int(lengths.min()) < 2:
        return no_prefix(attention_mask)
    shortest = int(lengths.min()) - 1
    offsets = width - lengths  # each row's first real column
    columns = offsets[:, None] + torch.arange(shortest, device=input_ids.device)[None, :]
    aligned = input_ids.gather(1, columns)  # each row's first `shortest` real tokens
    differs = (aligned != aligned[:1]).any(0)
    length = int(differs.long().argmax()) if bool(differs.any()) else shortest
    if length * (rows - 1) < min_saved:
        return no_prefix(attention_mask)
    keep = torch.arange(width, device=input_ids.device)[None, :] >= (offsets + length)[:, None]
    suffix = mask & keep
    start = int(offsets.min()) + length
    first = int(offsets[0])
    return PromptPrefix(
        length, start, suffix[:, start:].to(attention_mask.dtype), slice(first, first + length)
    )


def forward_prompts(
    forward: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Any,
    prefix: PromptPrefix,
    **kwargs: Any,
) -> Any:
    """``forward`` (an HF model or decoder taking the cache as ``kwargs``) over left-padded prompts, filling
    ``cache``: ``prefix.length`` shared tokens first as one row, its keys and values copied to every row
    (the copy's backward adds the rows' gradients into the one prefix), then the rest of each prompt.

    Returns the second pass's output: positions ``prefix.start`` onwards, so its last column is each prompt's
    last token. The cache then holds ``prefix.cache_mask()``'s columns."""
    rows = input_ids.shape[0]
    if prefix.length:
        span = prefix.columns
        forward(
            input_ids=input_ids[:1, span],
            attention_mask=attention_mask[:1, span],
            position_ids=position_ids[:1, span],
            use_cache=True,
            **kwargs,
        )
        cache.reorder_cache(torch.zeros(rows, dtype=torch.long, device=input_ids.device))
    return forward(
        input_ids=input_ids[:, prefix.start :],
        attention_mask=prefix.cache_mask(),
        position_ids=position_ids[:, prefix.start :],
        use_cache=True,
        **kwargs,
    )
