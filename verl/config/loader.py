"""Loading, checking and describing configs.

``load_config`` layers three sources, later ones winning: the schema defaults (``schema.py``), a recipe YAML
(``verl/config/recipes/<name>.yaml`` or any file path) and ``key=value`` command-line overrides. Every key is
checked against the schema before merging, so a typo fails fast with the nearest valid key; the result is
resolved, validated (``validation.py``) and read-only. Sizes derived from the config (samples per step,
gradient accumulation, ...) come from :func:`verl.config.sizes.derive_sizes` and are never written back.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, OmegaConfBaseException

from verl.config.errors import ConfigError, short_repr
from verl.config.overrides import Override, nest, parse_override
from verl.config.schema import TrainerConfig
from verl.config.sft_schema import SFTConfig
from verl.config.validation import validate
from verl.config.verl_compat import (
    Translation,
    is_verl_key,
    record_compat,
    renamed,
    rule_for,
    stops_walk,
    suggest_verl_key,
    translate_leaf,
    walk_leaves,
)
from verl.config.verl_rules import HYDRA_GROUPS, PPO_RULES, SFT_RULES, Rule

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
"""directory holding the built-in recipes (``<name>.yaml``)"""


# --------------------------------------------------------------------------------------------------------------
# recipes
# --------------------------------------------------------------------------------------------------------------
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


# Other frameworks' (and the seeds') names for a verl key, which spelling similarity alone gets wrong
# (``trainer.max_steps`` reads like ``trainer.step``, ``data.seq_len`` like ``data.seed``).
KEY_ALIASES = {
    "trainer.max_steps": "trainer.total_training_steps",
    "data.seq_len": "data.max_prompt_length",
    "data.max_seq_len": "data.max_prompt_length",
    "data.batch_size": "data.train_batch_size",
}


def suggest_key(key: str, schema: type = TrainerConfig) -> str | None:
    """Nearest valid dotted key to an unknown one, or None when nothing is close.

    Each candidate gets the larger of two difflib-based scores:

    * path: similarity of the two paths after their common leading sections are dropped (shared prefixes
      would otherwise make every sibling look alike), e.g. ``data.train.batch_size`` -> ``data.train_batch_size``;
    * leaf: 0.8 x leaf-name similarity (characters, whole ``_`` words, or abbreviation) + 0.2 x similarity of
      the parent sections, which finds the right leaf in the wrong place:
      ``actor_rollout_ref.actor.lrr`` -> ``actor_rollout_ref.actor.optim.lr``, ``data.total_epochs`` ->
      ``trainer.total_epochs``.

    A candidate that ends with the whole key (leading sections left out) scores at least 0.95, ties going
    to the first declared. Ancestors of the key are never suggested. Below a score of 0.6 there is no suggestion.
    """
    if schema is TrainerConfig and key in KEY_ALIASES:
        return KEY_ALIASES[key]
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
        if cand.endswith("." + key):
            # Leading sections left out (``model.path``): most likely that key; the first declared wins a tie.
            score = max(score, 0.95)
        if score > best_score + 1e-9:
            best, best_score = cand, score
    return best if best_score >= 0.6 else None


# --------------------------------------------------------------------------------------------------------------
# key and type checking
# --------------------------------------------------------------------------------------------------------------
def _unknown_key_error(path: str, schema: type, where: str) -> ConfigError:
    fields = schema_fields(schema)
    suggestion = suggest_key(path, schema)
    which = _compat_of(schema)
    if suggestion is None and which is not None:
        suggestion = suggest_verl_key(path, which[0])
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
        elif info.freeform and value is not None and not isinstance(value, Mapping):
            raise ConfigError(
                f"{where}'{path}' expects a mapping of names to values, got {short_repr(value)}"
            )
        elif isinstance(value, Mapping) and not info.freeform and info.type_ is not Any:
            raise ConfigError(
                f"{where}'{path}' expects {_type_name(info.type_)}, not a mapping (got {short_repr(value)}); "
                f"'{path}' has no sub-keys"
            )


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(node, Mapping):
        for k, v in node.items():
            path = f"{prefix}{k}"
            out[path] = v
            out.update(_flatten(v, f"{path}."))
    return out


def _merge(base: DictConfig, plain: Mapping[str, Any], schema: type, where: str) -> DictConfig:
    """Merge ``plain`` into ``base``, turning OmegaConf errors into one-line ConfigErrors: a type clash, or a
    string OmegaConf cannot parse as the interpolation it starts like (``${a b}``)."""
    try:
        return typing.cast(DictConfig, OmegaConf.merge(base, OmegaConf.create(plain)))
    except GrammarParseError as e:
        key = getattr(e, "full_key", None) or "a value"
        raise ConfigError(
            f"{where}{key}: not a valid ${{...}} interpolation ({str(e).splitlines()[0]})"
        ) from None
    except OmegaConfBaseException as e:
        raise _type_error(e, plain, schema, where) from None
    except (TypeError, ValueError) as e:  # OmegaConf's own type clashes that carry no key
        raise ConfigError(f"{where}{e}") from None


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
    return ConfigError(f"{where}'{path}' expects {_type_name(info.type_)}, got {short_repr(flat[path])}")


# --------------------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------------------
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


def _compat_of(schema: type) -> tuple[str, tuple[Rule, ...]] | None:
    """verl's config this schema reads (its key list and rules), or None."""
    if issubclass(schema, SFTConfig):
        return "sft_trainer", SFT_RULES
    if issubclass(schema, TrainerConfig):
        return "ppo_trainer", PPO_RULES
    return None


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


def _translate(
    plain: Mapping[str, Any], schema: type, where: str, compat: dict[str, dict[str, Any]], *, explicit: bool
) -> dict:
    """Our part of a source (nested, for ``_check_keys``); verl's keys that are not ours go to ``compat``.
    ``explicit``: a command-line override (else a config file, where verl writes null for "unset")."""
    which = _compat_of(schema)
    if which is None:
        return dict(plain)
    config, rules = which
    fields = schema_fields(schema)
    found = Translation(ours={}, compat={})

    def stop(key: str) -> bool:  # a value judged whole: a leaf of ours, or a verl mapping judged as one value
        return (key in fields and not fields[key].section) or stops_walk(key, rules, config)

    for key, value in walk_leaves(plain, stop):
        if key in fields and not (key in HYDRA_GROUPS.get(config, ()) and isinstance(value, str)):
            if value is None and not explicit and not fields[key].section and not _allows_null(fields[key]):
                continue  # verl's files write null for "unset": the default here
            found.ours[key] = value
        elif not translate_leaf(key, value, rules, config, found, explicit=explicit):
            raise _unknown_key_error(key, schema, where)
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
        return
    raise _unknown_key_error(ov.key, schema, f"override {ov.text!r}: ")


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
    for text in overrides:
        ov = parse_override(text)
        where = f"override {text!r}: "
        if ov.op == "delete":
            _delete(cfg, ov, schema, compat, defaults)
            continue
        ours = _translate(nest(ov.key, ov.value), schema, where, compat, explicit=True)
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
