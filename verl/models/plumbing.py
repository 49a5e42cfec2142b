"""Small model-side helpers every role needs: the device to compute on, position ids, and the
transformers-version differences outside the KV cache (those are in `verl.models.kv_cache`)."""

from __future__ import annotations

import os

import torch


def resolve_device(name: str) -> torch.device:
    """``trainer.device``: cpu, cuda (the worker's GPU: Ray gives each worker its own) or auto."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        from verl.config.errors import ConfigError

        raise ConfigError(
            "trainer.device=cuda but this process sees no CUDA device; use trainer.device=auto or cpu"
        )
    if name == "cuda":
        # An index, always: torch.cuda.set_device refuses a bare "cuda", and a tensor on cuda:0 does not
        # compare equal to torch.device("cuda"). Ray gives each worker one visible GPU (index 0); ranks
        # started by torchrun on one machine take theirs from LOCAL_RANK.
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device(name)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of a left- or right-padded batch: 0 at each row's first real token, counting real tokens
    only (padding gets 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def activation_checkpointing_on(model: torch.nn.Module) -> bool:
    """Whether HF gradient checkpointing is on (the property was renamed in transformers 5)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False
