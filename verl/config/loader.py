"""Loading, checking and describing configs.

``load_config`` layers three sources, later ones winning: the schema defaults (``schema.py``), a recipe YAML
(``verl/config/recipes/<name>.yaml`` or any file path) and ``key=value`` command-line overrides. Every key is
checked against the schema before merging, so a typo fails fast with the nearest valid key; the result is
resolved, validated (``validation.py``) and read-only. Sizes derived from the config (samples per step,
gradient accumulation, ...) come from :func:`verl.config.sizes.derive_sizes` and are never written back.

The parts: :mod:`verl.config.recipe_files` finds and reads recipes, :mod:`verl.config.schema_keys` knows the
schema's keys and checks a source against them; this module translates verl's keys, merges the sources and
applies the overrides.
"""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.config.errors import ConfigError, as_written, short_repr
from verl.config.overrides import Override, nest, parse_override
from verl.config.recipe_files import (
    BASE_KEY,
    RECIPES_DIR,
    USER_INPUT_KEYS,
    _default_recipe,
    _recipe_chain,
    default_recipe,
    list_recipes,
    resolve_recipe,
)
from verl.config.schema import TrainerConfig
from verl.config.schema_keys import (
    KEY_ALIASES,
    _check_keys,
    _compat_of,
    _Field,
    _merge,
    _unknown_key_error,
    schema_fields,
    suggest_key,
)
from verl.config.sft_schema import SFTConfig
from verl.config.validation import validate
from verl.config.verl_compat import (
    Translation,
    is_verl_key,
    record_compat,
    renamed,
    rule_for,
    stops_walk,
    translate_leaf,
    walk_leaves,
)
from verl.config.verl_rules import HYDRA_GROUPS, READ_BY_LEAF
from verl.config.verl_rules_common import Rule

__all__ = [
    "BASE_KEY",
    "KEY_ALIASES",
    "RECIPES_DIR",
    "USER_INPUT_KEYS",
    "default_recipe",
    "list_recipes",
    "load_config",
    "resolve_recipe",
    "schema_fields",
    "sft_overrides",
    "suggest_key",
    "to_container",
    "to_yaml",
    "with_updates",
]


def _listed_scalar(value: Any, field: _Field | None) -> Any:
    """``trainer.logger=console`` -> ``[console]``: verl's scripts give a one-item list key its item alone
    (verl wraps a string itself), so a bare word for a list-of-strings key is that list."""
    is_str_list = (
        field is not None
        and typing.get_origin(field.type_) is list
        and typing.get_args(field.type_) == (str,)
    )
    if is_str_list and isinstance(value, str) and value and "," not in value and not value.startswith("$"):
        return [value]
    return value


def _nest_all(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _allows_null(field: _Field) -> bool:
    return field.type_ is Any or type(None) in typing.get_args(field.type_)


Spellings = dict[str, dict[str, Any]]
"""our key -> {the key a source spelled it with: the value given}, over one source (a file, the command line)"""


def _check_spellings(spellings: Spellings, target: str, where: str) -> None:
    """Two spellings of one setting (verl's new key and its legacy alias, e.g. ``reward.reward_model.enable``
    and ``reward_model.enable``) given different values in one source: an error naming both. A null yields to
    a value (verl's legacy aliases are null for "unset")."""
    given = [(k, v) for k, v in spellings.get(target, {}).items() if v is not None]
    for other, value in given[1:]:
        if value != given[0][1]:
            first, first_value = given[0]
            raise ConfigError(
                f"{where}{first}={as_written(first_value)} and {other}={as_written(value)} are two spellings of "
                f"one setting ({target} here) with different values; keep one"
            )


def _note_spelling(found: Translation, spellings: Spellings, target: str, key: str, value: Any) -> None:
    """Record that ``key`` set ``target``; a null is dropped when another spelling gave a value."""
    spellings.setdefault(target, {})[key] = value
    if value is None and any(v is not None for k, v in spellings[target].items() if k != key):
        del found.ours[target]
    elif value is not None and found.ours.get(target, value) is None:  # an earlier null in this source
        found.ours[target] = value


def _translate(
    plain: Mapping[str, Any],
    schema: type,
    where: str,
    compat: dict[str, dict[str, Any]],
    *,
    explicit: bool,
    spellings: Spellings | None = None,
) -> dict:
    """Our part of a source (nested, for ``_check_keys``); verl's keys that are not ours go to ``compat``.
    ``explicit``: a command-line override (else a config file, where verl writes null for "unset").
    ``spellings``: what this source set so far, by our key (shared by the overrides of one command line)."""
    which = _compat_of(schema)
    if which is None:
        return dict(plain)
    config, rules = which
    fields = schema_fields(schema)
    found = Translation(ours={}, compat={})
    spellings = {} if spellings is None else spellings

    def stop(key: str) -> bool:  # a value judged whole: a leaf of ours, or a verl mapping judged as one value
        if key in READ_BY_LEAF.get(config, ()):
            return False
        return (key in fields and not fields[key].section) or stops_walk(key, rules, config)

    for key, value in walk_leaves(plain, stop):
        if key in fields and not (key in HYDRA_GROUPS.get(config, ()) and isinstance(value, str)):
            if value is None and not explicit and not fields[key].section and not _allows_null(fields[key]):
                continue  # verl's files write null for "unset": the default here
            found.ours[key] = value
            if not fields[key].section:
                _note_spelling(found, spellings, key, key, value)
                _check_spellings(spellings, key, where)
        elif not translate_leaf(key, value, rules, config, found, explicit=explicit):
            raise _unknown_key_error(key, schema, where)
        else:
            target = _renames_to(key, rules)
            if target is not None and found.renamed.get(target) == key and target in found.ours:
                _note_spelling(found, spellings, target, key, value)
                _check_spellings(spellings, target, where)
    for section, entries in found.compat.items():
        for key in entries:  # the latest source decides a key, whichever section it was in before
            for other in compat.values():
                other.pop(key, None)
        compat.setdefault(section, {}).update(entries)
    for key in found.ours:  # a key set here outdates a deprecated spelling an earlier source gave for it
        for old in list(compat.get("deprecated", {})):
            if found.renamed.get(key) != old and _renames_to(old, rules) == key:
                del compat["deprecated"][old]
    # our keys and the verl keys renamed onto them alike: a bare word for a list of strings is that list
    return _nest_all({key: _listed_scalar(value, fields.get(key)) for key, value in found.ours.items()})


def _renames_to(key: str, rules: tuple[Rule, ...]) -> str | None:
    rule = rule_for(key, rules)
    return renamed(key, rule) if rule is not None and rule.kind == "rename" else None


def _delete(
    cfg: DictConfig, ov: Override, schema: type, compat: dict[str, dict[str, Any]], defaults: DictConfig
) -> None:
    """``~key``: a key of ours goes back to ``defaults`` (the schema and the recipe, before any override: under
    ``main_ppo``, verl's defaults), a verl key is forgotten."""
    fields = schema_fields(schema)
    which = _compat_of(schema)
    rule = rule_for(ov.key, which[1]) if which else None
    key = renamed(ov.key, rule) if rule is not None and rule.kind == "rename" else ov.key
    if key in fields:
        current = OmegaConf.select(cfg, key)
        if ov.has_value and OmegaConf.to_container(OmegaConf.create({"v": current}))["v"] != ov.value:
            raise ConfigError(
                f"override {ov.text!r}: {key} is {short_repr(current)}, not {short_repr(ov.value)}"
            )
        OmegaConf.update(cfg, key, copy.deepcopy(OmegaConf.select(defaults, key)), merge=False)
        return
    if which is not None and is_verl_key(ov.key, which[0]):
        for entries in compat.values():
            entries.pop(ov.key, None)
        _delete_read_by_leaf(cfg, key, which[0])
        return
    raise _unknown_key_error(ov.key, schema, f"override {ov.text!r}: ")


def _delete_read_by_leaf(cfg: DictConfig, key: str, config: str) -> None:
    """``~distillation.teacher_models.<name>[.<key>]``: the entry (or its key) leaves our free-form mapping."""
    for mapping in READ_BY_LEAF.get(config, ()):
        if key.startswith(mapping + "."):
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent)
            if OmegaConf.is_dict(node) and leaf in node:
                del node[leaf]


def load_config(
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    schema: type = TrainerConfig,
    *,
    check: bool = True,
) -> DictConfig:
    """Build a read-only config: schema defaults <- recipe YAML <- command-line overrides.

    ``config`` is a recipe name (``grpo``, see :func:`list_recipes`), a path to a YAML file (ours, or verl's
    style: a Hydra ``defaults: [ppo_trainer, _self_]`` list), or None for the schema's default recipe (``grpo``
    for TrainerConfig, ``sft`` for SFTConfig; the command line chooses with :func:`default_recipe` instead). Overrides use verl's Hydra forms (``key=value``, ``+key=value``,
    ``~key``) and its value grammar (see :mod:`verl.config.overrides`: ``trainer.logger=[console]``).

    verl's keys that are not ours are read through :mod:`verl.config.verl_compat`: renamed onto ours, recorded
    in the ``compat`` section as having no effect here (reported at start-up), or refused when ignoring them
    would change what is learned. Settings this machine cannot run as asked (8 GPUs, vLLM) are mapped onto
    what it can and recorded in ``compat.mapped``. Interpolations are resolved. With ``check`` (the default)
    values are validated (:func:`validate`). Raises :class:`ConfigError` on any problem.
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    cfg = OmegaConf.structured(schema)
    compat: dict[str, dict[str, Any]] = {}

    if config is None:
        config = _default_recipe(schema)
    if config is not None:
        for path, plain in _recipe_chain(resolve_recipe(config)):
            where = f"{path}: "
            ours = _translate(plain, schema, where, compat, explicit=False)
            _check_keys(ours, schema, where)
            cfg = _merge(cfg, ours, schema, where)

    defaults = copy.deepcopy(cfg)
    command_line: Spellings = {}  # one source: an alias and its new key set to different values is an error
    for text in overrides:
        ov = parse_override(text)
        where = f"override {text!r}: "
        if ov.op == "delete":
            _delete(cfg, ov, schema, compat, defaults)
            continue
        ours = _translate(
            nest(ov.key, ov.value), schema, where, compat, explicit=True, spellings=command_line
        )
        _check_keys(ours, schema, where)
        cfg = _merge(cfg, ours, schema, where)

    try:
        which = _compat_of(schema)
        if which is not None:
            record_compat(cfg, compat, which[0])
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


def with_updates(config: DictConfig, updates: dict[str, Any]) -> DictConfig:
    """A validated, read-only copy of ``config`` with the dotted ``updates`` applied."""
    if not updates:
        return config
    new = copy.deepcopy(config)
    OmegaConf.set_readonly(new, False)
    for key, value in updates.items():
        OmegaConf.update(new, key, value, merge=False)
    validate(new)
    OmegaConf.set_readonly(new, True)
    return new
