"""``model.override_config``: settings of a model's HuggingFace config (its config.json) that a run
overrides before the weights load, e.g. ``{"max_position_embeddings": 32768, "attention_dropout": 0.0}``.

An override names an attribute the config has (a misspelt one is a ConfigError naming the key and the nearest
attribute, not a new attribute nothing reads), and a model that cannot be built from the overridden config
is a ConfigError naming the overrides, not a problem with the weight files. Used by the loaders of
:mod:`verl.models.loading` and by ``verl doctor``, which reads the model's shape from the same config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from difflib import get_close_matches
from typing import Any, TypeVar

from transformers import PretrainedConfig

from verl.errors import UserError, describe_error

T = TypeVar("T")


def plain_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``model.override_config`` as a plain dict (an OmegaConf node is converted; None is empty)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(overrides, DictConfig):
        return OmegaConf.to_container(overrides, resolve=True)
    return dict(overrides or {})


def _override_names(config: PretrainedConfig) -> list[str]:
    """The attribute names of a HF config an override may set: what its config.json holds, and aliases."""
    return sorted(set(config.to_dict()) | set(getattr(config, "attribute_map", {}) or {}))


def apply_config_overrides(
    config: PretrainedConfig, overrides: Mapping[str, Any], key: str = "override_config"
) -> PretrainedConfig:
    """Set each ``name: value`` of ``overrides`` on a HuggingFace config (in place; returned): verl's
    ``model.override_config``, e.g. ``{"max_position_embeddings": 32768, "attention_dropout": 0.0}``.

    Only attributes the config has can be set: an unknown name is a ConfigError naming ``key.name``, the
    config class and the nearest known attribute, because transformers would keep a misspelt one as a new
    attribute that nothing reads. A mapping given for a nested config (``text_config``) is applied to it
    key by key.
    """
    from verl.config.errors import ConfigError

    for name, value in overrides.items():
        known = _override_names(config)
        if name not in known:
            close = get_close_matches(str(name), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{key}.{name}: {type(config).__name__} has no attribute {name!r}{hint} (override_config "
                "sets attributes of the model's config.json; it cannot add new ones)"
            )
        current = getattr(config, name)
        if isinstance(current, PretrainedConfig) and isinstance(value, Mapping):
            apply_config_overrides(current, value, f"{key}.{name}")
        else:
            setattr(config, name, value)
    return config


def naming_overrides(
    load: Callable[[], T], overrides: Mapping[str, Any], key: str, source: str
) -> Callable[[], T]:
    """``load``, with a failure to build the model from an overridden config (a size that no longer fits the
    weights, a value of the wrong type) reported as a ConfigError naming the overrides rather than as a
    problem with the weight files."""
    if not overrides:
        return load

    def run() -> T:
        from verl.config.errors import ConfigError, short_repr

        try:
            return load()
        except (OSError, UserError):
            raise
        except Exception as error:
            raise ConfigError(
                f"{key}={short_repr(dict(overrides))}: {source} cannot be loaded with these overrides "
                f"({describe_error(error)})"
            ) from error

    return run
