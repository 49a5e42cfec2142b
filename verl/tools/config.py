"""The tool config file of a multi-turn rollout: what ``actor_rollout_ref.rollout.multi_turn.tool_config_path``
names, and its format (the tools are built from it by :mod:`verl.tools.loader`).

The file is verl's tool config YAML::

    tools:
      - class_name: verl.tools.calculator.CalculatorTool   # or package.module:Class or path/to/file.py:Class
        config: {type: native}                             # passed to the class as its config dict
        tool_schema:                                       # optional for classes with a default_tool_schema
          type: function
          function: {name: calculator, description: ..., parameters: {...}}

Examples ship in ``verl/config/tools/``; their bare names (``calculator``, ``python``) work as the path. A
relative ``file.py`` is looked up from the working directory, then next to the YAML file.

This module imports nothing of verl: :mod:`verl.config.validation` checks the path with it while
:mod:`verl.config` is being initialised.
"""

from __future__ import annotations

import os
from pathlib import Path

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
TOOLS_DIR = Path(__file__).resolve().parent.parent / "config" / "tools"
"""the example tool configs shipped with verl"""


def tool_config_file(value: str | os.PathLike[str]) -> Path:
    """The file ``tool_config_path`` names: a path, or the bare name of a config shipped in `TOOLS_DIR`
    (``calculator``, ``python``) when no such path exists."""
    path = Path(value).expanduser()
    packaged = TOOLS_DIR / f"{value}.yaml"
    if not path.exists() and os.sep not in str(value) and packaged.is_file():
        return packaged
    return path
