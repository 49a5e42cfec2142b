"""Which model configs a run loads, read without loading (or building) any weights.

``verl run`` gets its models from a HuggingFace directory, a ``.gguf`` file (converted once into a cached
directory) or, for the demo, the tiny model that ``prepare.tiny_model`` builds (``verl.trainer.prepare``). Doctor
reads the ``config.json`` the run will load: the cached artifact when it is built, else, for the tiny model, the
same config built in memory the way ``verl.models.tiny.make_tiny_model`` builds it (its tokenizer is trained on
the spot, in milliseconds, since the vocabulary size is the tokenizer's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


@dataclass(frozen=True)
class ModelSource:
    """A model config, or why there is none."""

    hf_config: Any
    """the transformers config; None when it cannot be read without downloading or converting"""
    source: str
    """where it came from, or why it is unavailable"""


def tiny_model_hf_config(settings: dict[str, Any]) -> Any:
    """The transformers config ``make_tiny_model(**settings)`` writes (``prepare.tiny_model``), without writing
    anything: its tokenizer is built in memory for the vocabulary size."""
    from verl.models.tiny import CORPORA, build_tiny_tokenizer, tiny_model_config

    kwargs = dict(settings)
    vocab_size = int(kwargs.pop("vocab_size", 384))
    corpus = str(kwargs.pop("corpus", "default"))
    kwargs.pop("seed", None)
    if corpus not in CORPORA:
        raise ValueError(f"unknown tiny-model corpus {corpus!r}; choose one of {sorted(CORPORA)}")
    return tiny_model_config(build_tiny_tokenizer(vocab_size=vocab_size, corpus=CORPORA[corpus]()), **kwargs)


def _from_dir(path: Path, trust_remote_code: bool, **kwargs: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code, **kwargs)


def _with_overrides(hf_config: Any, overrides: Any, key: str) -> Any:
    from verl.models.overrides import apply_config_overrides

    plain = OmegaConf.to_container(overrides, resolve=True) if OmegaConf.is_config(overrides) else overrides
    return apply_config_overrides(hf_config, plain or {}, key) if plain else hf_config


def _gguf_config(file: Path, trust_remote_code: bool) -> ModelSource:
    """A GGUF file's config from its header, when transformers (with gguf) can read it."""
    try:
        hf_config = _from_dir(file.parent, trust_remote_code, gguf_file=file.name)
    except Exception as error:  # gguf / accelerate missing, an architecture transformers cannot map
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return ModelSource(
            None,
            f"{file} is a GGUF file, converted to a HuggingFace directory at the first `verl run` (not yet), and "
            f"its header could not be read here ({first[:160]})",
        )
    return ModelSource(hf_config, f"the header of {file}")


def policy_model(config: Any, prepare_plan: Any) -> ModelSource:
    """The policy's config (actor, reference, rollout), from what ``verl run`` will load."""
    model = config.actor_rollout_ref.model
    key = "actor_rollout_ref.model.path"
    for gguf_key, file, artifact in prepare_plan.gguf_models:
        if gguf_key == key:
            if artifact.ready():
                return _read_dir(artifact.path, model, f"{file}, converted (cached at {artifact.path})")
            return _gguf_config(Path(file), bool(model.trust_remote_code))
    built = prepare_plan.sft_model or prepare_plan.init_model
    if built is not None:
        if built.ready():
            return _read_dir(built.path, model, f"the tiny model prepare built (cached at {built.path})")
        hf_config = tiny_model_hf_config(OmegaConf.to_container(config.prepare.tiny_model, resolve=True))
        return ModelSource(
            _with_overrides(hf_config, model.override_config, "actor_rollout_ref.model.override_config"),
            "prepare.tiny_model (its config, built in memory as the first `verl run` builds it)",
        )
    return model_at(model.path, model, key)


def model_at(path: Any, model_cfg: Any, key: str) -> ModelSource:
    """The config at a model path a config key names, or why it cannot be read."""
    text = str(path or "").strip()
    if not text:
        return ModelSource(None, f"{key} is not set")
    from verl.models.gguf import is_gguf

    if is_gguf(text):
        return _gguf_config(Path(text).expanduser(), bool(getattr(model_cfg, "trust_remote_code", False)))
    local = Path(text).expanduser()
    if not local.is_dir():
        why = "no such directory" if not local.exists() else "not a directory"
        return ModelSource(
            None, f"{key}={text}: {why} (a hub id is downloaded by the run; doctor reads local files only)"
        )
    if not (local / "config.json").is_file():
        return ModelSource(None, f"{key}={text}: no config.json in it")
    return _read_dir(local, model_cfg, f"{local / 'config.json'}")


def _read_dir(path: Path, model_cfg: Any, source: str) -> ModelSource:
    trust = bool(getattr(model_cfg, "trust_remote_code", False))
    try:
        hf_config = _from_dir(path, trust)
    except Exception as error:  # an unknown model_type, remote code not allowed, a malformed file
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return ModelSource(None, f"{path}: transformers cannot read its config ({first[:160]})")
    overrides = getattr(model_cfg, "override_config", None)
    return ModelSource(_with_overrides(hf_config, overrides, "override_config"), source)


def checkpoint_dtype_bytes(hf_config: Any) -> int:
    """Bytes per weight of a checkpoint loaded in its own dtype (transformers 5 loads with dtype="auto")."""
    import torch

    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, torch.float32)
    return torch.empty((), dtype=dtype).element_size()
