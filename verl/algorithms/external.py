"""User modules that register estimators and losses, named by ``VERL_USE_EXTERNAL_MODULES`` (verl's variable).

verl imports every module listed there (comma-separated) when ``verl`` is imported, so that a file of
``@register_policy_loss("my_loss")`` / ``@register_adv_est("my_est")`` functions is registered before the
trainer looks the names up. Here the registries import them the first time a name is missing, in whichever
process looks it up (the driver, and each Ray worker, which inherits the variable). An entry is a dotted
module name, as in verl, or a path to a ``.py`` file.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

ENV_VAR = "VERL_USE_EXTERNAL_MODULES"

_imported: set[str] = set()


def import_external_modules() -> list[str]:
    """Import the entries of ``VERL_USE_EXTERNAL_MODULES`` not imported yet by this function; returns them.

    A module that fails to import raises (a typo in the variable should not look like an unknown loss).
    """
    entries = [e.strip() for e in os.environ.get(ENV_VAR, "").split(",") if e.strip()]
    done = []
    for entry in entries:
        if entry in _imported:
            continue
        if entry.endswith(".py"):
            from verl.utils.imports import import_file

            import_file(entry)
        else:
            importlib.import_module(entry)
        _imported.add(entry)
        done.append(entry)
    return done


def same_function(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same function of the same source (a user file run twice, e.g.
    imported by path again, defines a new function object for the same code): re-registering it is
    harmless, registering a different function under a taken name is a clash."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_b is None:
        return False
    return (code_a.co_filename, code_a.co_firstlineno, a.__qualname__) == (
        code_b.co_filename,
        code_b.co_firstlineno,
        b.__qualname__,
    )


__all__ = ["ENV_VAR", "import_external_modules", "same_function"]
