"""Model loading and the tiny-model factory."""

from verl.models.loading import (
    is_flash_attn_available,
    load_hf_model,
    load_tokenizer,
    load_value_model,
    resolve_dtype,
)
from verl.models.tiny import build_tiny_tokenizer, make_tiny_model

__all__ = [
    "build_tiny_tokenizer",
    "is_flash_attn_available",
    "load_hf_model",
    "load_tokenizer",
    "load_value_model",
    "make_tiny_model",
    "resolve_dtype",
]
