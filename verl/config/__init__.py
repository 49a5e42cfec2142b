"""Configuration: typed schema (``schema.py``), recipes (``recipes/*.yaml``), the loader (``loader.py``),
value validation (``validation.py``) and derived batch sizes (``sizes.py``)."""

from verl.config.errors import ConfigError
from verl.config.loader import (
    list_recipes,
    load_config,
    sft_overrides,
    suggest_key,
    to_container,
    to_yaml,
    with_updates,
)
from verl.config.schema import TrainerConfig
from verl.config.sft_schema import SFTConfig
from verl.config.sizes import DerivedSizes, derive_sizes
from verl.config.validation import validate
from verl.config.value_rules import as_file_list

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
    "with_updates",
]
