"""Configuration: typed schema (``schema.py``), recipes (``recipes/*.yaml``) and the loader (``loader.py``)."""

from verl.config.loader import (
    ConfigError,
    DerivedSizes,
    as_file_list,
    derive_sizes,
    list_recipes,
    load_config,
    sft_overrides,
    suggest_key,
    to_container,
    to_yaml,
    validate,
)
from verl.config.schema import SFTConfig, TrainerConfig

__all__ = [
    "ConfigError",
    "DerivedSizes",
    "SFTConfig",
    "TrainerConfig",
    "as_file_list",
    "derive_sizes",
    "list_recipes",
    "load_config",
    "sft_overrides",
    "suggest_key",
    "to_container",
    "to_yaml",
    "validate",
]
