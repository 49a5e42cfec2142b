"""The schema's dotted keys, for the loader (:mod:`verl.config.loader`): every valid key of a dataclass schema
(:func:`schema_fields`), the nearest valid key to a mistyped one (:func:`suggest_key`), and the checks a source
goes through before it is merged: unknown keys (with a suggestion), a section given a value, a value given a
mapping, and OmegaConf's type errors turned into one-line ConfigErrors.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import GrammarParseError, OmegaConfBaseException

from verl.config.errors import ConfigError, short_repr
from verl.config.schema import TrainerConfig
from verl.config.sft_schema import SFTConfig
from verl.config.verl_compat import suggest_verl_key
from verl.config.verl_rules_common import Rule
from verl.config.verl_rules_ppo import PPO_RULES
from verl.config.verl_rules_sft import SFT_RULES


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


def _compat_of(schema: type) -> tuple[str, tuple[Rule, ...]] | None:
    """verl's config this schema reads (its key list and rules), or None."""
    if issubclass(schema, SFTConfig):
        return "sft_trainer", SFT_RULES
    if issubclass(schema, TrainerConfig):
        return "ppo_trainer", PPO_RULES
    return None
