"""Finding and reading recipes for the loader (:mod:`verl.config.loader`): the built-in recipes
(``verl/config/recipes/<name>.yaml``), the one ``verl run`` runs without ``--config`` and why, a recipe name or
path resolved to its file, and a recipe's YAML read with the chain of recipes it builds on (``base:``, or verl's
Hydra ``defaults:`` list).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.config.errors import ConfigError, short_repr
from verl.config.overrides import parse_override
from verl.config.schema import TrainerConfig
from verl.config.sft_schema import SFTConfig

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
"""directory holding the built-in recipes (``<name>.yaml``)"""


def list_recipes() -> list[str]:
    """Names of the built-in recipes (``verl/config/recipes/*.yaml`` without the suffix), sorted."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


USER_INPUT_KEYS = ("actor_rollout_ref.model.path", "data.train_files", "data.val_files", "prepare.model")
"""keys whose presence in the overrides means the model or the data are the user's (prepare.model: a built-in
real model, e.g. smollm2, rather than the demo's tiny one)"""


def _default_recipe(schema: type) -> str | None:
    """The recipe of ``load_config(None, ...)``: ``grpo`` (RL) or ``sft``, whatever the overrides say."""
    if issubclass(schema, SFTConfig):
        return "sft"
    if issubclass(schema, TrainerConfig):
        return "grpo"
    return None


def default_recipe(schema: type, overrides: Sequence[str] = ()) -> tuple[str | None, str]:
    """The recipe ``verl run`` without ``--config`` runs, and why, for the start-up log.

    RL training runs the ``grpo`` demo recipe, tuned for its tiny model on the built-in arithmetic task;
    when the overrides name the user's model or data (:data:`USER_INPUT_KEYS`) that tuning would be wrong
    for them, so ``grpo_verl`` runs instead: verl's own defaults, made GRPO.
    """
    if issubclass(schema, SFTConfig):
        return "sft", "the default SFT recipe"
    if not issubclass(schema, TrainerConfig):
        return None, ""
    given = []
    for text in overrides:
        try:
            ov = parse_override(text)
        except ConfigError:
            continue  # reported when the override is applied
        if ov.op != "delete" and ov.key in USER_INPUT_KEYS:
            given.append(ov.key)
    if given:
        return "grpo_verl", (
            f"{' and '.join(given)} given: verl's own defaults, made GRPO; the demo recipe's tuning for its "
            "tiny model does not apply, --config grpo applies it"
        )
    return "grpo", "the demo: GRPO on the built-in arithmetic task with a tiny model built on the spot"


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


BASE_KEY = "base"


def _recipe_chain(path: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The recipe and the recipes it builds on, base first, each with its keys (read once).

    A recipe builds on another with a top-level ``base: <recipe name or path>`` (or verl's Hydra form,
    ``defaults: [<config>, _self_]``): it then only lists what it changes, and the chain is merged base first.
    The ``base`` / ``defaults`` entries are taken out of the keys returned.
    """
    chain: list[tuple[Path, dict[str, Any]]] = []
    while True:
        _, plain = _load_yaml(path)
        base = plain.pop(BASE_KEY, None)
        hydra_base = _hydra_base(path, plain)
        chain.insert(0, (path, plain))
        if base is None and hydra_base is None:
            return chain
        if base is None:
            base_path = hydra_base.resolve()
        else:
            # A path relative to the recipe that names it, else a recipe name or path as on the command line.
            relative = path.parent / str(base)
            base_path = relative.resolve() if relative.is_file() else resolve_recipe(str(base))
        if any(base_path == seen for seen, _ in chain):
            raise ConfigError(f"{chain[0][0]}: recipe base chain loops back to {base_path}")
        path = base_path


def _hydra_base(path: Path, plain: dict[str, Any]) -> Path | None:
    """A verl-style config file (``--config-name``): its Hydra ``defaults`` list (taken out of ``plain``) names
    the config it extends (``- ppo_trainer`` and ``- _self_``). Its ``hydra:`` section, Hydra's own settings, is
    read like any other verl key (no effect here)."""
    defaults = plain.pop("defaults", None)
    if defaults is None:
        return None
    bases = [d for d in defaults if d != "_self_"] if isinstance(defaults, list) else [defaults]
    if len(bases) != 1 or not isinstance(bases[0], str):
        raise ConfigError(
            f"{path}: its Hydra defaults list {short_repr(defaults)} is not supported here: name one config to "
            "extend (e.g. [ppo_trainer, _self_]) and set everything else as keys"
        )
    relative = path.parent / f"{bases[0]}.yaml"
    return relative if relative.is_file() else resolve_recipe(bases[0])
