"""The error type of config problems, shared by the loader, validation and derived sizes."""

from __future__ import annotations

from typing import Any

from verl.errors import UserError


class ConfigError(UserError, ValueError):
    """A config problem: unknown key, wrong type, bad value, missing recipe or malformed override."""

    exit_code = 2
    label = "config error"


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` of a value, cut to ``limit`` characters for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_written(value: Any) -> str:
    """A value as it is written on a command line: ``null``, ``true`` / ``false``, a short repr of a list or
    mapping, else its text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return short_repr(value) if isinstance(value, (list, dict)) else str(value)
