"""The models a run loads, counted for the memory estimate (:mod:`verl.doctor.memory`) without loading any
weights: each model built on PyTorch's meta device from its ``config.json`` (:func:`count_model`), the size of
the actor's LoRA adapters, the bytes of a dtype, and how parameter counts are printed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model: its parameter count and the sizes of its layers."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linears: tuple[tuple[str, int, int], ...] = ()
    """every nn.Linear but the output layer: (module name, in_features, out_features), for LoRA"""
    source: str = ""
    """where the config came from"""
    hf_config: Any = field(default=None, compare=False, repr=False)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes per position: layers x 2 (K and V) x kv heads x head size x dtype."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


def _text_config(hf_config: Any) -> Any:
    return hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config


def count_model(hf_config: Any, source: str = "", kind: str = "causal") -> ModelShape:
    """The :class:`ModelShape` of a transformers config, built on the meta device (no memory, no weights).

    ``kind``: ``causal`` (AutoModelForCausalLM: the actor, reference and rollout), ``value`` (the critic:
    AutoModelForTokenClassification with one label) or ``reward`` (AutoModelForSequenceClassification)."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    builders = {
        "causal": AutoModelForCausalLM,
        "value": AutoModelForTokenClassification,
        "reward": AutoModelForSequenceClassification,
    }
    with torch.device("meta"):
        model = builders[kind].from_config(hf_config)
    output = model.get_output_embeddings() if kind == "causal" else None
    linears = tuple(
        (name, module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
    )
    text = _text_config(hf_config)
    heads = int(text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        layers=int(text.num_hidden_layers),
        hidden=int(text.hidden_size),
        intermediate=int(getattr(text, "intermediate_size", None) or 4 * text.hidden_size),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        vocab=int(text.vocab_size),
        linears=linears,
        source=source,
        hf_config=hf_config,
    )


def _matches(name: str, spec: Any) -> bool:
    """peft's rule: a list names modules by their last part(s), a string is a regular expression matched
    against the whole module name."""
    if spec is None:
        return False
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return any(name == target or name.endswith(f".{target}") for target in spec)


def lora_parameters(shape: ModelShape, rank: int, target_modules: Any, exclude_modules: Any = None) -> int:
    """LoRA adapter parameters: rank x (in + out) for every adapted linear layer. ``all-linear`` adapts every
    linear layer but the output layer, as peft does."""
    total = 0
    for name, fan_in, fan_out in shape.linears:
        targeted = target_modules == "all-linear" or _matches(name, _plain(target_modules))
        if targeted and not _matches(name, _plain(exclude_modules)):
            total += rank * (fan_in + fan_out)
    return total


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def lora_settings(model_cfg: Any) -> tuple[int, Any, Any] | None:
    """(rank, target_modules, exclude_modules) of the actor's LoRA adapters, None without LoRA; a saved adapter
    (``lora_adapter_path``) brings its own, read from its adapter_config.json."""
    if model_cfg.lora_adapter_path is not None:
        try:
            saved = json.loads(
                (Path(model_cfg.lora_adapter_path).expanduser() / "adapter_config.json").read_text()
            )
            return int(saved["r"]), saved.get("target_modules"), saved.get("exclude_modules")
        except (OSError, ValueError, KeyError):
            return int(model_cfg.lora_rank) or 8, model_cfg.target_modules, model_cfg.exclude_modules
    if int(model_cfg.lora_rank) > 0:
        return int(model_cfg.lora_rank), model_cfg.target_modules, model_cfg.exclude_modules
    return None


def fmt_count(n: int) -> str:
    """``7.62B`` / ``1.05M`` / ``384`` parameters."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def dtype_bytes(name: str | None) -> int:
    from verl.models.loading import resolve_dtype

    return resolve_dtype(name or "float32").itemsize


@dataclass(frozen=True)
class Models:
    """The models a run loads, counted (None: not loaded by this run)."""

    actor: ModelShape
    critic: ModelShape | None = None
    reward: ModelShape | None = None
    reward_bytes: int = 4
