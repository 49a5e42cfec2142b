"""Loading HuggingFace causal LMs and tokenizers from local directories."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown torch_dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def is_flash_attn_available() -> bool:
    """True when the flash-attn package is importable and a CUDA device is present."""
    return importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load a tokenizer and make sure it can pad (left padding is what generation needs)."""
    tokenizer = AutoTokenizer.from_pretrained(
        str(Path(path).expanduser()), trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token_id is None:
        # Many base models ship without a pad token; EOS is the conventional stand-in.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_hf_model(
    path: str | Path,
    torch_dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
    **kwargs: Any,
) -> PreTrainedModel:
    """Load any causal LM directory (Qwen2, Llama, Phi, ...) with `AutoModelForCausalLM`."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model directory {path} does not exist")
    return AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=resolve_dtype(torch_dtype),
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
        **kwargs,
    )


def load_value_model(
    path: str | Path,
    torch_dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A causal LM's backbone with a scalar head on every token (``AutoModelForTokenClassification``, one label).

    The head is new (randomly initialised) when ``path`` holds a causal LM; its dropout is switched off
    so that values are a deterministic function of the weights.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model directory {path} does not exist")
    config = AutoConfig.from_pretrained(str(path), num_labels=1, trust_remote_code=trust_remote_code)
    config.classifier_dropout = 0.0  # read by transformers' token-classification heads
    return AutoModelForTokenClassification.from_pretrained(
        str(path),
        config=config,
        dtype=resolve_dtype(torch_dtype),
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
