"""Finding the Controller class that ``verl run`` uses: a built-in name or a user's ``module:Class``."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from verl.config.errors import ConfigError
from verl.single_controller.flow import Controller

BUILTIN_CONTROLLERS = {
    "RLTrainer": "verl.trainer.rl_trainer:RLTrainer",
    "PPOController": "verl.trainer.rl_trainer:RLTrainer",
    "GRPOController": "verl.trainer.rl_trainer:GRPOController",
}


def load_controller_class(name: str) -> type[Controller]:
    """``RLTrainer`` / ``GRPOController`` / ..., ``package.module:Class``, or ``path/to/file.py:Class``."""
    target = BUILTIN_CONTROLLERS.get(name, name)
    if ":" not in target:
        close = difflib.get_close_matches(name, BUILTIN_CONTROLLERS, n=1)
        raise ConfigError(
            f"trainer.controller={name!r} is not a built-in controller ({', '.join(BUILTIN_CONTROLLERS)})"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + "; a user controller is written module:Class or path/to/file.py:Class"
        )
    module_name, _, class_name = target.rpartition(":")
    module = _import(module_name)
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Controller)):
        raise ConfigError(
            f"trainer.controller={name!r}: {module_name} has no Controller subclass {class_name!r}"
        )
    return cls


def _import(module_name: str):
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ConfigError(f"trainer.controller: no such file {path}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # Ray pickles classes by module name
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: a module in the working directory is found
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"trainer.controller: cannot import {module_name!r}: {error}") from error
