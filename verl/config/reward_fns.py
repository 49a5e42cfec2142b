"""``reward_model.reward_fns``: the list of weighted reward terms, read and checked (no scoring here).

Each item is a term name, or a mapping ``{name: ..., weight: 1.0, kwargs: {}}``. A name is a built-in term
(:data:`BUILTIN_TERMS`) or a user function ``path/to/file.py:fn`` (``path/to/file.py`` alone: its
``compute_score``). The scoring lives in :mod:`verl.workers.reward.combine`; this module is pure so that
config validation can call it without importing the workers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.config.errors import ConfigError, short_repr

KEY = "reward_model.reward_fns"

BUILTIN_TERMS = ("correctness", "format", "length", "reward_model")
"""correctness: the rule score of today (custom_reward_function, else the data_source's scorer); format: 1.0
when the response has its data source's final-answer format; length: a length penalty in [-1, 0];
reward_model: the reward model's score (reward_model.enable=true)"""

BATCH_TERMS = ("length", "reward_model")
"""terms computed from the whole batch (token counts, the reward model's forward pass) rather than per
decoded sample inside the reward manager's scoring call"""

TERM_KWARGS: dict[str, tuple[str, ...]] = {
    "correctness": (),
    "format": (),
    "length": ("threshold",),
    "reward_model": (),
}
"""the kwargs each built-in term takes (a user function takes any: they are passed to it)"""

ITEM_KEYS = ("name", "weight", "kwargs")

RM_FIELD = "rm_score"
"""the reward field of the reward_model term (and of the reward model alone): ``reward_model`` is taken, it is
the column of every row that holds the ground truth (verl's data schema)"""

ROW_FIELDS = ("data_source", "reward_model", "extra_info", "prompt", "raw_prompt", "ability", "index", "uid")
"""columns of a batch (verl's row schema, and what the trainer adds): a term's reward field must not take one"""


@dataclass(frozen=True)
class RewardTerm:
    """One weighted term of a sample's reward."""

    name: str
    """the extra field the term's value is logged as: the built-in name, or the user function's name"""
    weight: float = 1.0
    """its weight in the sum (>= 0)"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """built-in: its settings (length: threshold); user function: keyword arguments bound to it"""
    path: str | None = None
    """a user function's file (None for a built-in term)"""
    function: str | None = None
    """a user function's name in that file"""

    @property
    def field(self) -> str:
        """The reward field (non-tensor column, ``reward_extra/<field>/mean``) its value is returned as."""
        return RM_FIELD if self.path is None and self.name == "reward_model" else self.name

    @property
    def per_batch(self) -> bool:
        """Computed from the batch by the reward role (length, reward_model), not per decoded sample."""
        return self.path is None and self.name in BATCH_TERMS


def _plain(value: Any) -> Any:
    return (
        OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _user_function(name: str) -> tuple[str, str] | None:
    """``(path, fn)`` of ``path/to/file.py:fn`` or ``path/to/file.py``; None when ``name`` is neither."""
    path, sep, fn = name.rpartition(":")
    if sep and path.endswith(".py") and fn.isidentifier():
        return path, fn
    if name.endswith(".py"):
        return name, "compute_score"
    return None


def _unknown_name(where: str, name: str) -> str:
    close = get_close_matches(name, BUILTIN_TERMS, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (
        f"{where}={name!r}: unknown reward term{hint} (known: {', '.join(BUILTIN_TERMS)}, or "
        "path/to/file.py:fn)"
    )


def _parse_item(item: Any, where: str, errors: list[str]) -> RewardTerm | None:
    """One item as a term; each problem is appended to ``errors`` (then None)."""
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, Mapping):
        errors.append(
            f"{where}={short_repr(item)}: expected a term name or {{name: ..., weight: ..., kwargs: ...}}"
        )
        return None
    unknown = [k for k in item if k not in ITEM_KEYS]
    for key in unknown:
        close = get_close_matches(str(key), ITEM_KEYS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        errors.append(f"{where}: unknown key {key!r}{hint} (a term takes {', '.join(ITEM_KEYS)})")
    name, weight, kwargs = item.get("name"), item.get("weight", 1.0), item.get("kwargs") or {}
    ok = not unknown
    if not isinstance(name, str) or not name.strip():
        errors.append(f"{where}.name must be a term name; got {short_repr(name)}")
        return None
    if not _is_number(weight) or not math.isfinite(weight) or weight < 0:
        errors.append(f"{where}.weight must be a number >= 0; got {short_repr(weight)} (term {name!r})")
        ok = False
    if not isinstance(kwargs, Mapping):
        errors.append(f"{where}.kwargs must be a mapping; got {short_repr(kwargs)} (term {name!r})")
        return None
    user = _user_function(name)
    if user is None and name not in BUILTIN_TERMS:
        errors.append(_unknown_name(where, name))
        return None
    if user is None:
        for key in kwargs:
            if key not in TERM_KWARGS[name]:
                takes = ", ".join(TERM_KWARGS[name]) or "none"
                errors.append(f"{where}.kwargs: the {name} term takes no {key!r} (it takes: {takes})")
                ok = False
    if not ok:
        return None
    path, function = user if user is not None else (None, None)
    return RewardTerm(function or name, float(weight), dict(kwargs), path, function)


def parse_reward_fns(spec: Any) -> list[RewardTerm]:
    """The terms of ``reward_model.reward_fns``; every problem in one ConfigError naming the key."""
    errors: list[str] = []
    terms = reward_fns_problems(spec, errors)
    if errors:
        raise ConfigError("; ".join(errors))
    return terms


def reward_fns_problems(spec: Any, errors: list[str]) -> list[RewardTerm]:
    """The terms that parse; a message appended to ``errors`` for each problem (config validation collects
    them with the other keys')."""
    spec = _plain(spec)
    if spec is None:
        return []
    if isinstance(spec, str):
        spec = [spec]
    if not isinstance(spec, (list, tuple)):
        errors.append(f"{KEY} must be a list of terms; got {short_repr(spec)}")
        return []
    terms: list[RewardTerm] = []
    for i, item in enumerate(spec):
        term = _parse_item(item, f"{KEY}[{i}]", errors)
        if term is None:
            continue
        if any(t.name == term.name for t in terms):
            errors.append(f"{KEY}[{i}]: a second term named {term.name!r} (each term is logged by its name)")
            continue
        if term.field in ("score", *ROW_FIELDS):
            errors.append(
                f"{KEY}[{i}]: a term cannot be named {term.field!r} (the summed reward's own field and the batch "
                f"columns {', '.join(ROW_FIELDS)} are taken)"
            )
            continue
        terms.append(term)
    return terms


def term_config_problems(cfg: Any, errors: list[str]) -> None:
    """``reward_model.reward_fns`` against the rest of the config: parse problems, the reward_model term
    without a reward model, a length threshold past ``data.max_response_length``."""
    terms = reward_fns_problems(cfg.reward_model.reward_fns, errors)
    names = {t.name: t for t in terms if t.path is None}
    if "reward_model" in names and not cfg.reward_model.enable:
        errors.append(
            f"{KEY} names the reward_model term, which needs reward_model.enable=true (and "
            "reward_model.model.path)"
        )
    if terms and "correctness" not in names:
        # The rule score comes from the correctness term only: without it these settings would do nothing.
        unused = [
            key
            for key, used in (
                (
                    f"custom_reward_function.path={cfg.custom_reward_function.path}",
                    cfg.custom_reward_function.path,
                ),
                ("reward_model.overlong_buffer.enable=true", cfg.reward_model.overlong_buffer.enable),
            )
            if used
        ]
        if unused:
            errors.append(
                f"{KEY} has no correctness term, so {' and '.join(unused)} would change nothing: add correctness "
                "to the list (with the weight you want), or drop the setting"
            )
    if "length" in names and "threshold" in names["length"].kwargs:
        threshold, longest = names["length"].kwargs["threshold"], cfg.data.max_response_length
        if not _is_number(threshold) or not 0 <= threshold < longest:
            errors.append(
                f"{KEY}: the length term's kwargs.threshold must be a number of tokens in [0, "
                f"data.max_response_length) = [0, {longest}); got {short_repr(threshold)}"
            )
