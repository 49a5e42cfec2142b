"""Model loading and plumbing (tokenizers, EOS ids, devices, position ids), and the tiny-model factory."""

from verl.models.loading import (
    eos_token_ids,
    is_flash_attn_available,
    load_hf_model,
    load_tokenizer,
    load_value_model,
    resolve_dtype,
    tokenizer_for,
)
from verl.models.plumbing import activation_checkpointing_on, position_ids, resolve_device
from verl.models.tiny import build_tiny_tokenizer, make_tiny_model

__all__ = [
    "activation_checkpointing_on",
    "build_tiny_tokenizer",
    "eos_token_ids",
    "is_flash_attn_available",
    "load_hf_model",
    "load_tokenizer",
    "load_value_model",
    "make_tiny_model",
    "position_ids",
    "resolve_device",
    "resolve_dtype",
    "tokenizer_for",
]
