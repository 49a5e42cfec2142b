"""Loading HuggingFace causal LMs and tokenizers from local directories."""

from __future__ import annotations

import importlib.util
import logging
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

logger = logging.getLogger(__name__)

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
    """True when a CUDA device is present and the ``flash_attn`` package imports (a build that does not
    match the installed torch fails to import, and counts as unavailable)."""
    if importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available():
        return False
    try:
        import flash_attn  # noqa: F401
    except Exception:  # an ABI mismatch raises ImportError, OSError or RuntimeError
        return False
    return True


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load a tokenizer and make sure it can pad (left padding is what generation needs)."""
    tokenizer = AutoTokenizer.from_pretrained(
        str(Path(path).expanduser()), trust_remote_code=trust_remote_code
    )
    ensure_pad_token(tokenizer, str(path))
    tokenizer.padding_side = "left"
    return tokenizer


def tokenizer_for(model_cfg: Any) -> PreTrainedTokenizerBase:
    """The tokenizer of a model config section (``actor_rollout_ref.model``, SFT's ``model``):
    ``tokenizer_path`` when set, else the model's own directory."""
    return load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation_config EOS ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase, where: str = "the tokenizer") -> None:
    """Give a tokenizer without a pad token its EOS token as pad (logged), or fail when it has neither.

    Many base models ship without a pad token and EOS is the conventional stand-in: padding is masked
    out by the attention mask, so which id fills it does not matter. A new token would need a resized
    embedding, which is not this function's call to make.
    """
    if tokenizer.pad_token_id is not None:
        return
    if tokenizer.eos_token is None:
        raise ValueError(
            f"{where}: the tokenizer has neither a pad nor an eos token, so batches cannot be padded; "
            "use a tokenizer that defines one (actor_rollout_ref.model.tokenizer_path)"
        )
    logger.warning(
        "%s: the tokenizer has no pad token; using its eos token %r (id %s) as pad",
        where,
        tokenizer.eos_token,
        tokenizer.eos_token_id,
    )
    tokenizer.pad_token = tokenizer.eos_token


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
