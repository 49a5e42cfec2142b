"""KV caches across transformers versions: the forward's keyword for it, and a fresh one."""

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
