"""``load_hf_model`` with the keyword names of the seeds' snippets, and ``is_flash_attn_available``.

The loading itself is :func:`verl.models.load_hf_model`; this wrapper adds the one decision a user's call
needs on a machine without FlashAttention: ``attn_implementation="flash_attention_2"`` falls back to
``sdpa`` (the same attention, computed by PyTorch) with a logged warning, so the same line runs on a
laptop CPU and on a GPU with flash-attn installed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from verl.models import is_flash_attn_available
from verl.models import load_hf_model as _load_hf_model

__all__ = ["is_flash_attn_available", "load_hf_model"]

logger = logging.getLogger(__name__)


def load_hf_model(
    model_name_or_path: str | Path,
    torch_dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
    **kwargs: Any,
) -> PreTrainedModel:
    """A causal LM (``AutoModelForCausalLM``) from a model directory: Qwen2, Llama, Phi, OPT, ...

    ``torch_dtype`` is a torch dtype or its name (``"bfloat16"``). ``attn_implementation`` is passed to
    transformers; ``flash_attention_2`` without a usable flash-attn (no CUDA device, or the package not
    installed) loads with ``sdpa`` instead and logs a warning. Other keywords go to ``from_pretrained``.
    """
    if attn_implementation == "flash_attention_2" and not is_flash_attn_available():
        logger.warning(
            "attn_implementation=%s needs the flash-attn package and a CUDA device (pip install "
            "flash-attn); loading %s with sdpa instead",
            attn_implementation,
            model_name_or_path,
        )
        attn_implementation = "sdpa"
    return _load_hf_model(
        model_name_or_path,
        torch_dtype=torch_dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
        **kwargs,
    )
