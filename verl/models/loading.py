"""Loading HuggingFace causal LMs and tokenizers from local directories (or hub ids).

Every path is checked before transformers sees it (:func:`check_model_dir`): a missing directory, an
empty one, one without ``config.json`` or without tokenizer files is an :class:`~verl.errors.InputError`
naming the config key, the path, what is missing and the nearest existing sibling, rather than an
``OSError`` about repo ids or a tensor error many steps later. A model's ``override_config`` is applied
to its config by :mod:`verl.models.overrides`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from verl.errors import InputError, UserError, describe_error
from verl.models.overrides import apply_config_overrides, naming_overrides, plain_overrides

logger = logging.getLogger(__name__)

T = TypeVar("T")

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)
"""Any of these makes a directory a tokenizer directory (fast, config, sentencepiece, BPE / WordPiece vocab)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelNotFoundError(InputError, FileNotFoundError):
    """A model or tokenizer directory the config names does not exist (also a FileNotFoundError)."""


def looks_like_hub_id(path: str | os.PathLike) -> bool:
    """``org/name`` (what ``from_pretrained`` downloads), as opposed to a local path."""
    text = str(path)
    return bool(_HUB_ID.match(text)) and ".." not in text


def _label(path: Any, key: str | None) -> str:
    return f"{key}={path}" if key else str(path)


def _entries(directory: Path) -> list[Path]:
    """The visible entries of ``directory``, none when it cannot be listed."""
    try:
        return sorted(e for e in directory.iterdir() if not e.name.startswith("."))
    except OSError:
        return []


def _holdings(directory: Path) -> str:
    entries = [e.name + ("/" if e.is_dir() else "") for e in _entries(directory)]
    return ", ".join(entries[:8]) + (", ..." if len(entries) > 8 else "")


def _model_dirs_below(directory: Path, depth: int = 2) -> list[Path]:
    """Directories under ``directory`` (at most ``depth`` levels) that hold a config.json: where the model
    is when the user named its parent (a run directory, a checkpoint, a download folder)."""
    found: list[Path] = []
    level = [directory]
    for _ in range(depth):
        level = [d for parent in level for d in _entries(parent) if d.is_dir()]
        found.extend(d for d in level if (d / "config.json").is_file())
        if found or len(level) > 200:
            break
    return found


def check_model_dir(
    path: str | os.PathLike | None,
    key: str | None = None,
    *,
    need_config: bool = True,
    need_tokenizer: bool = False,
    tokenizer_key: str | None = None,
) -> str:
    """Check a model (or tokenizer) directory before loading it; returns what to pass to ``from_pretrained``.

    A local path must be a directory holding ``config.json`` (unless ``need_config`` is false, for a
    tokenizer-only directory) and, with ``need_tokenizer``, tokenizer files. A path that does not exist
    but looks like a hub id (``org/name``) is returned as it is, for ``from_pretrained`` to download.
    Each problem is an InputError naming ``key`` (the config key), the path, what is missing and, for a
    typo, the nearest existing sibling; ``tokenizer_key`` is the key that would name a tokenizer elsewhere.
    Only reads; never creates anything.
    """
    from verl.utils.paths import missing_path_hint, path_exists

    if path is None or not str(path).strip():
        from verl.config import ConfigError

        raise ConfigError(
            f"{key or 'the model path'} is not set: give a model directory or a hub id (org/name)"
        )
    given = str(path).strip()
    local = Path(given).expanduser()
    label = _label(given, key)
    what = "model" if need_config else "tokenizer"
    if not path_exists(local, label, InputError):
        if looks_like_hub_id(given):
            return given
        raise ModelNotFoundError(
            f"{label}: the {what} directory does not exist{missing_path_hint(local, dirs=True)} "
            "(a path that is not a local directory must be a Hugging Face hub id, org/name)"
        )
    if not local.is_dir():
        parent = local.parent
        hint = (
            f"; give its directory: {key or 'the path'}={parent}"
            if (parent / "config.json").is_file()
            else ""
        )
        raise InputError(f"{label}: is a file, not a {what} directory{hint}")
    try:
        empty = not any(local.iterdir())
    except OSError as exc:
        raise InputError(f"{label}: cannot list the directory ({exc.strerror or exc})") from exc
    if empty:
        raise InputError(f"{label}: the directory is empty: not a Hugging Face {what} directory")
    if need_config:
        config_file = local / "config.json"
        if not config_file.is_file():
            below = _model_dirs_below(local)
            hint = (
                f"; did you mean {below[0]}?"
                if len(below) == 1
                else f"; model directories under it: {', '.join(map(str, below[:4]))}"
                if below
                else f"; it holds {_holdings(local)}"
            )
            raise InputError(f"{label}: no config.json: not a Hugging Face model directory{hint}")
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"{label}: config.json is not readable JSON ({exc})") from exc
        if not isinstance(config, dict):
            raise InputError(f"{label}: config.json holds a {type(config).__name__}, not a JSON object")
    if need_tokenizer and not any((local / name).is_file() for name in TOKENIZER_FILES):
        fix = (
            f"set {tokenizer_key} to a directory that holds one"
            if tokenizer_key
            else "not a tokenizer directory"
        )
        raise InputError(f"{label}: no tokenizer files (tokenizer.json / tokenizer_config.json): {fix}")
    return str(local)


def _from_pretrained(load: Callable[[], T], source: str, key: str | None, what: str) -> T:
    """``load()``, with the OSError (or, for a local directory, ValueError) transformers raises for a path
    it cannot use turned into an InputError naming ``key`` and the path."""
    local = Path(source).is_dir()
    try:
        return load()
    except OSError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if local:
            raise InputError(f"{_label(source, key)}: cannot load the {what} ({reason})") from exc
        parent = Path(source).expanduser().parent
        hint = ""
        if parent != Path(".") and parent.is_dir():  # org/ exists here: more likely a local typo
            from verl.utils.paths import missing_path_hint

            hint = missing_path_hint(source, dirs=True)
        raise InputError(
            f"{_label(source, key)}: neither a local directory nor downloadable from the Hugging Face hub "
            f"({reason}){hint}; check the path, or the hub id, the network and HF_TOKEN"
        ) from exc
    except ValueError as exc:
        if not local or isinstance(exc, UserError):  # a ConfigError (override_config) says what to fix
            raise
        raise InputError(f"{_label(source, key)}: cannot load the {what} ({exc})") from exc
    except Exception as exc:
        # A local directory with corrupt weights (SafetensorError, a truncated torch file): the files are at
        # fault, not verl; `--debug` still shows the library's traceback.
        if not local or isinstance(exc, UserError):
            raise
        reason = describe_error(exc)
        weights = sorted(
            p.name for p in Path(source).iterdir() if p.suffix in (".safetensors", ".bin", ".pt")
        )
        files = f" ({', '.join(weights)})" if weights else ""
        raise InputError(
            f"{_label(source, key)}: cannot load the {what}; are its weight files{files} whole? ({reason})"
        ) from exc


def model_config_dict(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``config.json`` of a local model directory as a dict; None when it is not one (a hub id)."""
    config_file = Path(path).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def max_positions(config: dict[str, Any]) -> int | None:
    """The longest sequence a model config allows: ``max_position_embeddings`` (``n_positions`` in GPT-2
    style configs) times a linear / dynamic / yarn RoPE scaling factor; None when the config has none."""
    limit = config.get("max_position_embeddings", config.get("n_positions"))
    text = config.get("text_config")
    if limit is None and isinstance(text, dict):
        return max_positions(text)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return None
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        if kind in ("linear", "dynamic", "yarn") and isinstance(factor, (int, float)) and factor > 1:
            limit = int(limit * factor)
    return limit


def check_fits_model(
    model_path: str | os.PathLike | None,
    longest: int,
    what: str,
    also: str = "",
    overrides: Mapping[str, Any] | None = None,
) -> None:
    """Raise a ConfigError when ``longest`` tokens (``what``: the config keys that add up to it, e.g.
    ``"data.max_prompt_length + data.max_response_length"``) exceed what the model at ``model_path`` allows
    (its config.json's ``max_position_embeddings``, after the model's ``override_config`` ``overrides``: a
    run that raises the limit there loads the model with it). Does nothing for a hub id or a config
    without a limit. ``also`` is another way to fix it, appended to the message."""
    if model_path is None or not str(model_path).strip():
        return
    config = model_config_dict(model_path)
    if config is not None:
        config = {**config, **plain_overrides(overrides)}
    limit = max_positions(config) if config is not None else None
    if limit is None or longest <= limit:
        return
    from verl.config import ConfigError

    raise ConfigError(
        f"{what} = {longest} tokens is longer than the model allows: max_position_embeddings = {limit} in "
        f"{Path(model_path).expanduser() / 'config.json'}; lower {what.replace(' + ', ' / ')} to fit"
        + (f" {also}" if also else "")
    )


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype, key: str = "torch_dtype") -> torch.dtype:
    """The torch dtype a config's ``torch_dtype`` names; an unknown name is a ConfigError naming ``key``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        from verl.config import ConfigError

        raise ConfigError(f"{key}={dtype!r}: unknown torch_dtype; choose one of {', '.join(sorted(DTYPES))}")
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


def load_tokenizer(
    path: str | Path, trust_remote_code: bool = False, *, key: str | None = None
) -> PreTrainedTokenizerBase:
    """Load a tokenizer and make sure it can pad (left padding is what generation needs).

    ``path`` is a directory holding tokenizer files (or a hub id); ``key`` is the config key that named
    it, for the errors (see :func:`check_model_dir`)."""
    source = check_model_dir(path, key, need_config=False, need_tokenizer=True)
    return _load_tokenizer(source, trust_remote_code, key)


def _load_tokenizer(source: str, trust_remote_code: bool, key: str | None) -> PreTrainedTokenizerBase:
    tokenizer = _from_pretrained(
        lambda: AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code),
        source,
        key,
        "tokenizer",
    )
    ensure_pad_token(tokenizer, _label(source, key))
    tokenizer.padding_side = "left"
    return tokenizer


def tokenizer_for(model_cfg: Any, section: str = "actor_rollout_ref.model") -> PreTrainedTokenizerBase:
    """The tokenizer of a model config section (``section``: ``actor_rollout_ref.model``, SFT's ``model``):
    ``tokenizer_path`` when set, else the model's own directory, which is then checked to be a whole model
    directory (config.json and tokenizer files), so that a bad model path fails here, before any data is
    read, with the key to fix."""
    if model_cfg.tokenizer_path:
        return load_tokenizer(
            model_cfg.tokenizer_path, model_cfg.trust_remote_code, key=f"{section}.tokenizer_path"
        )
    key = f"{section}.path"
    source = check_model_dir(
        model_cfg.path, key, need_tokenizer=True, tokenizer_key=f"{section}.tokenizer_path"
    )
    return _load_tokenizer(source, model_cfg.trust_remote_code, key)


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
        raise InputError(
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
    *,
    key: str | None = None,
    override_config: Mapping[str, Any] | None = None,
    override_key: str = "override_config",
    **kwargs: Any,
) -> PreTrainedModel:
    """Load any causal LM directory (Qwen2, Llama, Phi, ...) with `AutoModelForCausalLM`; ``key`` is the
    config key that named ``path``, for the errors (see :func:`check_model_dir`).

    ``override_config`` (verl's ``model.override_config``, named ``override_key`` in the errors) is applied
    to the model's HuggingFace config before the weights load (see :func:`apply_config_overrides`)."""
    dtype = resolve_dtype(torch_dtype)
    source = check_model_dir(path, key)
    overrides = plain_overrides(override_config)

    def load() -> PreTrainedModel:
        extra = dict(kwargs)
        if overrides:
            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
            extra["config"] = apply_config_overrides(config, overrides, override_key)
        return AutoModelForCausalLM.from_pretrained(
            source,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            **extra,
        )

    return _from_pretrained(naming_overrides(load, overrides, override_key, source), source, key, "model")


def load_value_model(
    path: str | Path,
    torch_dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
    *,
    key: str | None = None,
    override_config: Mapping[str, Any] | None = None,
    override_key: str = "override_config",
) -> PreTrainedModel:
    """A causal LM's backbone with a scalar head on every token (``AutoModelForTokenClassification``, one label).

    The head is new (randomly initialised) when ``path`` holds a causal LM; its dropout is switched off
    so that values are a deterministic function of the weights. ``key`` is the config key that named
    ``path``, for the errors (see :func:`check_model_dir`); ``override_config`` as in :func:`load_hf_model`
    (applied after the head's settings, so it has the last word).
    """
    dtype = resolve_dtype(torch_dtype)
    source = check_model_dir(path, key)
    overrides = plain_overrides(override_config)

    def load() -> PreTrainedModel:
        config = AutoConfig.from_pretrained(source, num_labels=1, trust_remote_code=trust_remote_code)
        config.classifier_dropout = 0.0  # read by transformers' token-classification heads
        apply_config_overrides(config, overrides, override_key)
        return AutoModelForTokenClassification.from_pretrained(
            source,
            config=config,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )

    return _from_pretrained(
        naming_overrides(load, overrides, override_key, source), source, key, "value model"
    )
