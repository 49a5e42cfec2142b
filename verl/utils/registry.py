"""Name -> implementation tables: every estimator, loss, engine, scorer and manager is chosen by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Registry(dict):
    """A dict of named implementations with a decorator to fill it and a lookup that explains misses.

    ``what`` names the thing in errors, e.g. ``"advantage estimator (algorithm.adv_estimator)"``.
    """

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[T], T]:
        """Decorator: register the function or class under ``name`` (a clash raises unless ``overwrite``)."""

        def decorator(obj: T) -> T:
            if name in self and self[name] is not obj and not overwrite:
                raise ValueError(f"a {self.what} is already registered as {name!r}")
            self[name] = obj
            return obj

        return decorator

    def lookup(self, name: Any, error: type[Exception] | None = None) -> Any:
        """The implementation registered as ``name``; an unknown name is a ConfigError (names come from
        configs) naming the closest registered one."""
        try:
            return self[name]
        except (KeyError, TypeError):
            from difflib import get_close_matches

            from verl.config.errors import ConfigError

            close = get_close_matches(str(name), list(self), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise (error or ConfigError)(
                f"unknown {self.what} {name!r} (registered: {', '.join(sorted(self))}){hint}"
            ) from None
