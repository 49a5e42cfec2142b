"""The checks every section of :mod:`verl.config.validation` is written with: a value among choices, in a
range, a seed, a thread count, a file list. Each appends to ``errors`` a message naming the full key, the
value and what is allowed (with the nearest choice for a typo) and passes None (the schema says whether a key
may be null).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from difflib import get_close_matches
from numbers import Real
from pathlib import Path
from typing import Any

from omegaconf import ListConfig

from verl.config.errors import ConfigError, short_repr
from verl.utils.threads import AUTO

MAX_SEED = 2**32 - 1
"""numpy's seeds are 32-bit unsigned"""


def as_file_list(value: Any) -> list[str]:
    """Normalise ``data.train_files``/``val_files`` (None, a path, or a list of paths) to a list of str."""
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [str(value)]
    if isinstance(value, (list, tuple, ListConfig)) and all(isinstance(v, (str, Path)) for v in value):
        return [str(v) for v in value]
    raise ConfigError(f"expected a file path or a list of file paths, got {short_repr(value)}")


def check_choice(errors: list[str], key: str, value: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        close = get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        errors.append(f"{key} must be one of {', '.join(allowed)}; got {value!r}{hint}")


def check_at_least(errors: list[str], key: str, value: Any, low: int, *, null: str = "") -> None:
    """``value >= low``; None passes (the schema decides whether a key may be null). ``null`` names what
    null means for the key, e.g. ``"the whole batch"``, and is added to the message."""
    check_in_range(errors, key, value, low, null=null)


def check_in_range(
    errors: list[str],
    key: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    null: str = "",
    note: str = "",
) -> None:
    """``value`` within [low, high] (``low_open`` / ``high_open`` exclude an end; None = unbounded) and
    finite; None passes. ``null`` (what null means) and ``note`` (why the range) extend the message."""
    if value is None or isinstance(value, bool) or not isinstance(value, Real):
        return
    ok = math.isfinite(value)
    if low is not None:
        ok = ok and (value > low if low_open else value >= low)
    if high is not None:
        ok = ok and (value < high if high_open else value <= high)
    if ok:
        return
    if low is not None and high is not None:
        allowed = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        allowed = f"{'>' if low_open else '>='} {low}"
    elif high is not None:
        allowed = f"{'<' if high_open else '<='} {high}"
    else:
        allowed = "a finite number"
    if null:
        allowed += f" or null ({null})"
    errors.append(f"{key} must be {allowed}; got {value}" + (f" ({note})" if note else ""))


def check_off_or_at_least(
    errors: list[str], key: str, value: Any, off: int, meaning: str, low: int = 1
) -> None:
    """An integer that is either the sentinel ``off`` (``meaning``, e.g. "never") or ``>= low``."""
    if value is not None and value != off and value < low:
        errors.append(f"{key} must be {off} ({meaning}) or >= {low}; got {value}")


def check_seed(errors: list[str], key: str, value: Any, null: str = "") -> None:
    check_in_range(errors, key, value, 0, MAX_SEED, null=null)


def check_torch_threads(errors: list[str], key: str, value: Any) -> None:
    """A thread count >= 1, auto, or null (torch's default)."""
    if value is None or value == AUTO:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        errors.append(f"{key} must be {AUTO}, an integer >= 1 or null (torch's default); got {value!r}")


def check_files(errors: list[str], key: str, value: Any) -> None:
    try:
        as_file_list(value)
    except ConfigError:
        errors.append(f"{key} must be a file path or a list of file paths; got {short_repr(value)}")
