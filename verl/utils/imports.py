"""One way to name user code in a config: ``package.module:attr`` or ``path/to/file.py:attr``.

Used for ``trainer.step`` (a step function), ``trainer.controller`` (a Controller class) and custom
reward functions; a plug-in named in a config goes through :func:`load_object` too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from verl.config.errors import ConfigError
from verl.errors import InputError


def import_file(path: str | os.PathLike[str]) -> ModuleType:
    """Execute the Python file at ``path`` as a module and return it.

    Its module name is unique to the path (two user files named alike do not clobber each other in
    ``sys.modules``), and its directory goes on ``sys.path`` so that it can import its siblings, as
    ``python file.py`` could. Raises FileNotFoundError for a missing file, and an InputError naming the
    error and the line for a file that fails to run (which leaves nothing behind in ``sys.modules``).
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    name = f"verl_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside the user's module look it up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as error:
        sys.modules.pop(name, None)
        if isinstance(error, Exception):  # the user's code failed: one line that says where and why
            raise InputError(f"importing {path} failed: {_where(error, path)}") from error
        raise
    return module


def _where(error: Exception, path: Path) -> str:
    """``SyntaxError: invalid syntax (line 3)``: the error and the line of the user's file it came from."""
    line = getattr(error, "lineno", None) if isinstance(error, SyntaxError) else None
    if line is None:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename) == path]
        line = frames[-1].lineno if frames else None
    message = error.msg if isinstance(error, SyntaxError) else str(error)
    return f"{type(error).__name__}: {message}" + (f" (line {line})" if line else "")


def import_module_or_file(module: str, key: str) -> ModuleType:
    """Import ``module``: a dotted name (found like ``python -m`` finds it: the working directory first)
    or, ending in ``.py``, a file (:func:`import_file`). ``key`` names the setting in errors."""
    if module.endswith(".py"):
        try:
            return import_file(module)
        except FileNotFoundError as error:
            raise ConfigError(f"{key}: {error}") from None
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ConfigError(f"{key}: cannot import {module!r}: {error}") from error


def load_object(spec: str, key: str, kind: str = "object") -> Any:
    """The object named by ``spec`` = ``module:attr`` or ``file.py:attr``; ``kind`` says what was
    expected (``"step function"``, ``"Controller class"``) in the error when it is missing."""
    module, sep, attr = str(spec).rpartition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{key}={spec!r}: write it as package.module:name or path/to/file.py:name")
    loaded = import_module_or_file(module, key)
    try:
        return getattr(loaded, attr)
    except AttributeError:
        public = sorted(name for name in vars(loaded) if not name.startswith("_"))
        raise ConfigError(
            f"{key}={spec!r}: {module} has no {kind} {attr!r} (it defines: {', '.join(public[:20])})"
        ) from None
