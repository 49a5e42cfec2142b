"""``verl.TrainerConfig(**sections)``: a validated config from Python dicts, as ``verl run`` builds one.

``verl.config.TrainerConfig`` is the schema (a dataclass OmegaConf reads); this factory, exported as
``verl.TrainerConfig``, is what a Python user calls::

    config = verl.TrainerConfig(actor_rollout_ref=dict(model=dict(path="/models/tiny")), data=dict(...))

Each leaf of the sections becomes one ``key=value`` override on top of a recipe (``grpo``, the default
of ``verl run``), so ``TrainerConfig(data=dict(train_batch_size=8))`` is exactly
``verl run data.train_batch_size=8``: the same checks, the same read-only result (an OmegaConf
``DictConfig``), the same errors naming an unknown key and the nearest valid one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verl.config import load_config
from verl.config.schema import TrainerConfig as TrainerSchema
from verl.config.schema_keys import schema_fields


def TrainerConfig(recipe: str | Path | None = None, /, **sections: Any) -> DictConfig:  # noqa: N802
    """A validated, read-only trainer config: ``recipe`` (a built-in name or a YAML path; None = ``grpo``)
    with each leaf of ``sections`` (``data=dict(...)``, ``actor_rollout_ref=dict(...)``, ...) as an override.

    Raises :class:`verl.config.ConfigError` for an unknown key (naming the nearest valid one), a value of
    the wrong type or a value the validation refuses.
    """
    overrides = [f"{key}={json.dumps(value, default=str)}" for key, value in _leaves(sections)]
    return load_config(recipe, overrides)


def _leaves(node: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted ``(key, value)`` pairs of a nested mapping. A mapping is walked into unless the schema says
    the key holds one as its value (``model.override_config``); unknown keys are walked into too, so an
    error names the whole dotted key (``actor_rollout_ref.actor.fsdp_config.fsdp_size``)."""
    fields = schema_fields(TrainerSchema)
    for key, value in node.items():
        path = f"{prefix}{key}"
        info = fields.get(path)
        if isinstance(value, Mapping) and value and (info is None or info.section):
            yield from _leaves(value, f"{path}.")
        elif not (isinstance(value, Mapping) and not value and info is not None and info.section):
            yield path, value
