"""KV caches across transformers versions (the forward's keyword for it, a fresh one), and the row
bookkeeping for filling one cache per distinct prompt and sharing it among the rows that repeat it."""

from __future__ import annotations

import inspect
from typing import Any

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
