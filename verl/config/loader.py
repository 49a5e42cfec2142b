"""Loading, checking and describing configs.

``load_config`` layers three sources, later ones winning: the schema defaults (``schema.py``), a recipe YAML
(``verl/config/recipes/<name>.yaml`` or any file path) and ``key=value`` command-line overrides. Every key is
checked against the schema before merging, so a typo fails fast with the nearest valid key; the result is
resolved, validated and read-only. Sizes derived from the config (samples per step, gradient accumulation, ...)
come from :func:`derive_sizes` and are never written back.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.config.schema import SFTConfig, TrainerConfig

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
"""directory holding the built-in recipes (``<name>.yaml``)"""

TRUNCATION_MODES = ("error", "left", "right")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LR_SCHEDULERS = ("constant", "cosine")
KL_CTRL_TYPES = ("fixed", "adaptive")


class ConfigError(ValueError):
    """A config problem: unknown key, wrong type, bad value, missing recipe or malformed override."""


# --------------------------------------------------------------------------------------------------------------
# recipes
# --------------------------------------------------------------------------------------------------------------
def list_recipes() -> list[str]:
    """Names of the built-in recipes (``verl/config/recipes/*.yaml`` without the suffix), sorted."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _default_recipe(schema: type) -> str | None:
    if issubclass(schema, SFTConfig):
        return "sft"
    if issubclass(schema, TrainerConfig):
        return "grpo"
    return None


def resolve_recipe(config: str | Path) -> Path:
    """Path of a recipe: a bare name (``grpo``) is looked up in the built-in recipes, anything else is a path."""
    text = str(config)
    is_name = (
        isinstance(config, str)
        and "/" not in text
        and "\\" not in text
        and not text.endswith((".yaml", ".yml"))
    )
    if is_name:
        path = RECIPES_DIR / f"{text}.yaml"
        if path.is_file():
            return path
        raise ConfigError(f"unknown recipe {text!r}; available recipes: {', '.join(list_recipes())}")
    path = Path(text).expanduser()
    if path.is_file():
        return path
    builtin = RECIPES_DIR / Path(text).name
    if isinstance(config, str) and "/" not in text and builtin.is_file():
        return builtin
    raise ConfigError(f"config file not found: {text}; available recipes: {', '.join(list_recipes())}")


# --------------------------------------------------------------------------------------------------------------
# schema introspection
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Field:
    """One dotted path of a schema: a section (nested dataclass) or a leaf value."""

    path: str
    type_: Any
    section: bool
    freeform: bool


def _is_freeform(tp: Any) -> bool:
    return tp is dict or typing.get_origin(tp) is dict


@cache
def schema_fields(schema: type) -> dict[str, _Field]:
    """Every valid dotted key of a dataclass schema (sections included), in declaration order."""
    out: dict[str, _Field] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            path = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(tp):
                out[path] = _Field(path, tp, section=True, freeform=False)
                walk(tp, f"{path}.")
            else:
                out[path] = _Field(path, tp, section=False, freeform=_is_freeform(tp))

    walk(schema, "")
    return out


def _type_name(tp: Any) -> str:
    """Readable name of a type hint: ``int``, ``int or null``, ``list of float``, ``any``."""
    if tp is Any:
        return "any"
    if dataclasses.is_dataclass(tp):
        return "a section (mapping)"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if _is_freeform(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _tail_ratio(a: str, b: str) -> float:
    """Similarity of two dotted paths after dropping their common leading sections."""
    sa, sb = a.split(".") if a else [], b.split(".") if b else []
    i = 0
    while i < min(len(sa), len(sb)) and sa[i] == sb[i]:
        i += 1
    ta, tb = ".".join(sa[i:]), ".".join(sb[i:])
    if not ta and not tb:
        return 1.0
    if not ta:  # a is an ancestor of b: the key sits one level too high
        return 0.7
    return _ratio(ta, tb)


def _leaf_similarity(leaf: str, cand: str) -> float:
    """Similarity of two leaf names: characters, whole ``_``-words, or an abbreviation (``temp``)."""
    words, cand_words = set(leaf.split("_")), set(cand.split("_"))
    coverage = len(words & cand_words) / len(words)
    prefix = 0.85 if len(leaf) >= 3 and cand.startswith(leaf) else 0.0
    return max(_ratio(leaf, cand), 0.9 * coverage, prefix)


def suggest_key(key: str, schema: type = TrainerConfig) -> str | None:
    """Nearest valid dotted key to an unknown one, or None when nothing is close.

    Each candidate gets the larger of two difflib-based scores:

    * path: similarity of the two paths after their common leading sections are dropped (shared prefixes
      would otherwise make every sibling look alike), e.g. ``data.train.batch_size`` -> ``data.train_batch_size``;
    * leaf: 0.8 x leaf-name similarity (characters, whole ``_`` words, or abbreviation) + 0.2 x similarity of
      the parent sections, which finds the right leaf in the wrong place:
      ``actor_rollout_ref.actor.lrr`` -> ``actor_rollout_ref.actor.optim.lr``, ``data.total_epochs`` ->
      ``trainer.total_epochs``.

    Ancestors of the key are never suggested. Below a score of 0.6 there is no suggestion.
    """
    leaf = key.rsplit(".", 1)[-1]
    parent = key.rpartition(".")[0]
    best, best_score = None, 0.0
    for cand in schema_fields(schema):
        if key.startswith(cand + "."):
            continue
        c_leaf = cand.rsplit(".", 1)[-1]
        c_parent = cand.rpartition(".")[0]
        by_path = _tail_ratio(key, cand)
        by_leaf = 0.8 * _leaf_similarity(leaf, c_leaf) + 0.2 * _tail_ratio(parent, c_parent)
        score = max(by_path, by_leaf)
        if score > best_score + 1e-9:
            best, best_score = cand, score
    return best if best_score >= 0.6 else None


# --------------------------------------------------------------------------------------------------------------
# key and type checking
# --------------------------------------------------------------------------------------------------------------
def _unknown_key_error(path: str, schema: type, where: str) -> ConfigError:
    fields = schema_fields(schema)
    suggestion = suggest_key(path, schema)
    if suggestion is not None:
        hint = f"did you mean '{suggestion}'?"
    else:
        parts = path.split(".")
        parent = ""
        for i in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:i]) in fields:
                parent = ".".join(parts[:i])
                break
        prefix = f"{parent}." if parent else ""
        children = [p[len(prefix) :] for p in fields if p.startswith(prefix) and "." not in p[len(prefix) :]]
        hint = f"valid keys under '{parent}': " if parent else "valid top-level keys: "
        hint += ", ".join(children)
    return ConfigError(f"{where}unknown config key '{path}'; {hint}")


def _check_keys(node: Any, schema: type, where: str, prefix: str = "") -> None:
    """Check a plain nested mapping (a parsed YAML file or override) against the schema's keys."""
    fields = schema_fields(schema)
    for raw_key, value in node.items():
        path = f"{prefix}{raw_key}"
        info = fields.get(path)
        if info is None:
            while isinstance(value, Mapping) and value:  # name the full dotted key: model.path, not model
                key, value = next(iter(value.items()))
                path = f"{path}.{key}"
            raise _unknown_key_error(path, schema, where)
        if info.section:
            if isinstance(value, Mapping):
                _check_keys(value, schema, where, f"{path}.")
            elif value is not None:
                raise ConfigError(
                    f"{where}'{path}' is a section and expects a mapping of its keys, got {value!r}"
                )
        elif isinstance(value, Mapping) and not info.freeform and info.type_ is not Any:
            raise ConfigError(
                f"{where}'{path}' expects {_type_name(info.type_)}, not a mapping (got {_short(value)}); "
                f"'{path}' has no sub-keys"
            )


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(node, Mapping):
        for k, v in node.items():
            path = f"{prefix}{k}"
            out[path] = v
            out.update(_flatten(v, f"{path}."))
    return out


def _merge(
    base: DictConfig, src: DictConfig, plain: Mapping[str, Any], schema: type, where: str
) -> DictConfig:
    """Merge ``src`` into ``base``, turning OmegaConf type errors into one-line ConfigErrors."""
    try:
        return typing.cast(DictConfig, OmegaConf.merge(base, src))
    except OmegaConfBaseException as e:
        raise _type_error(e, plain, schema, where) from None


def _type_error(e: OmegaConfBaseException, plain: Mapping[str, Any], schema: type, where: str) -> ConfigError:
    full_key = getattr(e, "full_key", None)
    first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
    if not full_key:
        return ConfigError(f"{where}{first_line}")
    path = re.sub(r"\[.*$", "", str(full_key))
    info = schema_fields(schema).get(path)
    flat = _flatten(plain)
    if info is None or path not in flat:
        return ConfigError(f"{where}'{full_key}': {first_line}")
    return ConfigError(f"{where}'{path}' expects {_type_name(info.type_)}, got {_short(flat[path])}")


# --------------------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------------------
def _parse_override(override: str) -> tuple[DictConfig, dict[str, Any]]:
    if not isinstance(override, str) or "=" not in override:
        raise ConfigError(
            f"malformed override {override!r}: expected key=value (e.g. data.train_batch_size=16)"
        )
    key, _, _value = override.partition("=")
    key = key.strip().lstrip("+")
    if not key or not re.fullmatch(r"[A-Za-z_][\w\-]*(\.[A-Za-z_0-9][\w\-]*)*", key):
        raise ConfigError(f"malformed override {override!r}: expected key=value with a dotted key before '='")
    try:
        dot = OmegaConf.from_dotlist([f"{key}={_value}"])
        plain = typing.cast(dict, OmegaConf.to_container(dot, resolve=False))
    except OmegaConfBaseException as e:
        raise ConfigError(f"malformed override {override!r}: {str(e).splitlines()[0]}") from None
    return dot, plain


def _load_yaml(path: Path) -> tuple[DictConfig, dict[str, Any]]:
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError, OSError, OmegaConf grammar errors
        msg = " ".join(str(e).split())
        raise ConfigError(f"{path}: cannot parse YAML: {msg}") from None
    if loaded is None or (isinstance(loaded, ListConfig) and len(loaded) == 0):
        loaded = OmegaConf.create({})
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: a config file must be a mapping of sections, got a list")
    return loaded, typing.cast(dict, OmegaConf.to_container(loaded, resolve=False))


def load_config(
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    schema: type = TrainerConfig,
    *,
    check: bool = True,
) -> DictConfig:
    """Build a read-only config: schema defaults <- recipe YAML <- ``key=value`` overrides.

    ``config`` is a recipe name (``grpo``, see :func:`list_recipes`), a path to a YAML file, or None for the
    schema's default recipe (``grpo`` for TrainerConfig, ``sft`` for SFTConfig). Overrides use
    ``OmegaConf.from_dotlist`` semantics (values parsed as YAML: ``trainer.logger=[console]``); a leading ``+``
    is accepted and ignored. Interpolations are resolved. With ``check`` (the default) values are validated
    (:func:`validate`). Raises :class:`ConfigError` on any problem.
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    cfg = OmegaConf.structured(schema)

    if config is None:
        config = _default_recipe(schema)
    if config is not None:
        path = resolve_recipe(config)
        where = f"{path}: "
        src, plain = _load_yaml(path)
        _check_keys(plain, schema, where)
        cfg = _merge(cfg, src, plain, schema, where)

    for override in overrides:
        dot, plain = _parse_override(override)
        where = f"override {override!r}: "
        _check_keys(plain, schema, where)
        cfg = _merge(cfg, dot, plain, schema, where)

    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        raise ConfigError(
            f"cannot resolve '{key}': {msg}" if key else f"cannot resolve config: {msg}"
        ) from None

    if check:
        validate(cfg)
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_readonly(cfg, True)
    return cfg


# --------------------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------------------
def as_file_list(value: Any) -> list[str]:
    """Normalise ``data.train_files``/``val_files`` (None, a path, or a list of paths) to a list of str."""
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [str(value)]
    if isinstance(value, (list, tuple, ListConfig)) and all(isinstance(v, (str, Path)) for v in value):
        return [str(v) for v in value]
    raise ConfigError(f"expected a file path or a list of file paths, got {_short(value)}")


def _is_trainer(cfg: DictConfig) -> bool:
    tp = OmegaConf.get_type(cfg)
    if isinstance(tp, type) and issubclass(tp, TrainerConfig):
        return True
    return "actor_rollout_ref" in cfg


def _choice(errors: list[str], key: str, value: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        errors.append(f"{key} must be one of {', '.join(allowed)}; got {value!r}")


def _at_least(errors: list[str], key: str, value: Any, low: int) -> None:
    if value is not None and value < low:
        errors.append(f"{key} must be >= {low}; got {value}")


def _files(errors: list[str], key: str, value: Any) -> None:
    try:
        as_file_list(value)
    except ConfigError:
        errors.append(f"{key} must be a file path or a list of file paths; got {_short(value)}")


def _optim_errors(errors: list[str], prefix: str, optim: Any) -> None:
    _choice(errors, f"{prefix}.lr_scheduler_type", optim.lr_scheduler_type, LR_SCHEDULERS)
    if not 0.0 <= optim.lr_warmup_steps_ratio <= 1.0:
        errors.append(f"{prefix}.lr_warmup_steps_ratio must be in [0, 1]; got {optim.lr_warmup_steps_ratio}")
    if not 0.0 <= optim.min_lr_ratio <= 1.0:
        errors.append(f"{prefix}.min_lr_ratio must be in [0, 1]; got {optim.min_lr_ratio}")
    if len(optim.betas) != 2:
        errors.append(f"{prefix}.betas must be two numbers [beta1, beta2]; got {list(optim.betas)}")


def validate(cfg: DictConfig) -> None:
    """Check value constraints of a TrainerConfig or SFTConfig; raise one ConfigError listing every problem."""
    errors: list[str] = []
    if _is_trainer(cfg):
        data, arr = cfg.data, cfg.actor_rollout_ref
        actor, rollout = arr.actor, arr.rollout
        _files(errors, "data.train_files", data.train_files)
        _files(errors, "data.val_files", data.val_files)
        _choice(errors, "data.truncation", data.truncation, TRUNCATION_MODES)
        _at_least(errors, "data.max_prompt_length", data.max_prompt_length, 1)
        _at_least(errors, "data.max_response_length", data.max_response_length, 1)
        _at_least(errors, "data.train_batch_size", data.train_batch_size, 1)
        _at_least(errors, "data.val_batch_size", data.val_batch_size, 1)
        if not str(arr.model.path).strip():
            errors.append("actor_rollout_ref.model.path is required (a model directory or hub id); got ''")
        _choice(errors, "actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
        _at_least(errors, "actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size, 1)
        _at_least(
            errors,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            actor.ppo_micro_batch_size_per_gpu,
            1,
        )
        _at_least(errors, "actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs, 1)
        _optim_errors(errors, "actor_rollout_ref.actor.optim", actor.optim)
        _at_least(errors, "actor_rollout_ref.rollout.n", rollout.n, 1)
        _at_least(errors, "actor_rollout_ref.rollout.val_kwargs.n", rollout.val_kwargs.n, 1)
        _at_least(errors, "actor_rollout_ref.rollout.micro_batch_size", rollout.micro_batch_size, 1)
        _choice(errors, "algorithm.kl_ctrl.type", cfg.algorithm.kl_ctrl.type, KL_CTRL_TYPES)
        if (
            data.train_batch_size >= 1
            and actor.ppo_mini_batch_size >= 1
            and data.train_batch_size % actor.ppo_mini_batch_size
        ):
            errors.append(
                f"data.train_batch_size ({data.train_batch_size}) must be divisible by "
                f"actor_rollout_ref.actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size})"
            )
        if not errors:
            try:
                derive_sizes(cfg)
            except ConfigError as e:
                errors.append(str(e))
    else:
        data = cfg.data
        _files(errors, "data.train_files", data.train_files)
        _files(errors, "data.val_files", data.val_files)
        _choice(errors, "data.truncation", data.truncation, TRUNCATION_MODES)
        _at_least(errors, "data.max_length", data.max_length, 1)
        _at_least(errors, "data.train_batch_size", data.train_batch_size, 1)
        if not str(cfg.model.path).strip():
            errors.append("model.path is required (a model directory or hub id); got ''")
        _optim_errors(errors, "optim", cfg.optim)
    if errors:
        raise ConfigError("invalid config: " + "; ".join(errors))


# --------------------------------------------------------------------------------------------------------------
# derived sizes
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DerivedSizes:
    """Batch arithmetic of one RL step, derived once from a TrainerConfig and never written back into it."""

    prompts_per_step: int
    """data.train_batch_size"""
    samples_per_step: int
    """prompts_per_step * rollout.n"""
    mini_batch_samples: int
    """samples per optimizer step: ppo_mini_batch_size * rollout.n"""
    micro_batch_samples: int
    """samples per forward/backward pass: ppo_micro_batch_size_per_gpu, or the whole mini-batch"""
    grad_accum_steps: int
    """micro-batches per optimizer step: mini_batch_samples // micro_batch_samples"""
    optimizer_steps_per_rl_step: int
    """ppo_epochs * train_batch_size // ppo_mini_batch_size"""

    def describe(self) -> str:
        """Readable multi-line summary for logs."""
        n = self.samples_per_step // self.prompts_per_step
        mini_batches = self.samples_per_step // self.mini_batch_samples
        epochs = self.optimizer_steps_per_rl_step // mini_batches

        def plural(count: int, word: str, suffix: str = "s") -> str:
            return f"{count} {word}{'' if count == 1 else suffix}"

        return "\n".join(
            [
                "batch sizes per RL step:",
                f"  prompts per step:            {self.prompts_per_step}",
                f"  samples per step:            {self.samples_per_step} ({self.prompts_per_step} prompts x {n})",
                f"  mini-batch:                  {self.mini_batch_samples} samples"
                f" ({plural(mini_batches, 'mini-batch', 'es')} per epoch)",
                f"  micro-batch:                 {self.micro_batch_samples} samples"
                f" ({plural(self.grad_accum_steps, 'gradient-accumulation step')} per mini-batch)",
                f"  optimizer steps per RL step: {self.optimizer_steps_per_rl_step}"
                f" ({plural(epochs, 'epoch')} x {plural(mini_batches, 'mini-batch', 'es')})",
            ]
        )


def derive_sizes(cfg: DictConfig) -> DerivedSizes:
    """Compute the batch arithmetic of a TrainerConfig (see :class:`DerivedSizes`); raises ConfigError."""
    data, actor, rollout = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    prompts = int(data.train_batch_size)
    n = int(rollout.n)
    mini_prompts = int(actor.ppo_mini_batch_size)
    if prompts < 1 or n < 1 or mini_prompts < 1:
        raise ConfigError(
            "data.train_batch_size, actor_rollout_ref.rollout.n and actor_rollout_ref.actor.ppo_mini_batch_size "
            f"must be >= 1; got {prompts}, {n}, {mini_prompts}"
        )
    if prompts % mini_prompts:
        raise ConfigError(
            f"data.train_batch_size ({prompts}) must be divisible by "
            f"actor_rollout_ref.actor.ppo_mini_batch_size ({mini_prompts})"
        )
    mini = mini_prompts * n
    micro_cfg = actor.ppo_micro_batch_size_per_gpu
    micro = mini if micro_cfg is None else int(micro_cfg)
    if micro < 1 or mini % micro:
        raise ConfigError(
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu ({micro}) must divide the mini-batch of "
            f"{mini} samples (ppo_mini_batch_size {mini_prompts} x rollout.n {n})"
        )
    return DerivedSizes(
        prompts_per_step=prompts,
        samples_per_step=prompts * n,
        mini_batch_samples=mini,
        micro_batch_samples=micro,
        grad_accum_steps=mini // micro,
        optimizer_steps_per_rl_step=int(actor.ppo_epochs) * prompts // mini_prompts,
    )


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------
def to_yaml(cfg: DictConfig) -> str:
    """The config as YAML text (interpolations resolved), e.g. to save next to a run's outputs."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain nested dicts and lists (interpolations resolved), e.g. for loggers."""
    return typing.cast(dict, OmegaConf.to_container(cfg, resolve=True))


def sft_overrides(settings: Mapping[str, Any]) -> list[str]:
    """Turn ``prepare.sft`` settings into ``load_config(..., schema=SFTConfig)`` overrides.

    Keys are dotted SFTConfig keys (``optim.lr``) or bare leaf names (``lr``, ``train_batch_size``,
    ``total_training_steps``), which are unique in SFTConfig. Values are passed through as YAML.
    """
    fields = schema_fields(SFTConfig)
    by_leaf: dict[str, list[str]] = {}
    for path, info in fields.items():
        if not info.section:
            by_leaf.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    out = []
    for key, value in settings.items():
        key = str(key)
        if key in fields:
            path = key
        elif len(by_leaf.get(key, [])) == 1:
            path = by_leaf[key][0]
        elif key in by_leaf:
            raise ConfigError(f"prepare.sft: ambiguous key '{key}'; use one of {', '.join(by_leaf[key])}")
        else:
            raise _unknown_key_error(key, SFTConfig, "prepare.sft: ")
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        out.append(f"{path}={json.dumps(value)}")
    return out
