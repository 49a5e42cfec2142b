"""Configuration: typed schema (``schema.py``), recipes (``recipes/*.yaml``), the loader (``loader.py``),
value validation (``validation.py``) and derived batch sizes (``sizes.py``).

The names are re-exported lazily, as ``verl/__init__.py`` does: ``from verl.config import load_config``
loads the loader on first use, while importing ``verl.config.errors``, ``.schema`` or ``.sizes`` runs no
loader and no validation (which import tools, models, algorithms and agent loops).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConfigError": "verl.config.errors",
    "DerivedSizes": "verl.config.sizes",
    "SFTConfig": "verl.config.sft_schema",
    "TrainerConfig": "verl.config.schema",
    "as_file_list": "verl.config.value_rules",
    "derive_sizes": "verl.config.sizes",
    "list_recipes": "verl.config.recipe_files",
    "load_config": "verl.config.loader",
    "sft_overrides": "verl.config.loader",
    "suggest_key": "verl.config.schema_keys",
    "to_container": "verl.config.loader",
    "to_yaml": "verl.config.loader",
    "validate": "verl.config.validation",
    "with_updates": "verl.config.loader",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'verl.config' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
