"""Tools for multi-turn rollouts: the interface (:mod:`verl.tools.base`), the built-in tools
(:mod:`verl.tools.calculator`, :mod:`verl.tools.python_sandbox`), the tool config file
(:mod:`verl.tools.config`) and the tools built from it (:mod:`verl.tools.loader`).

Importing this package imports the interface only, so ``from verl.tools.base import BaseTool`` (a custom
tool's first line) loads nothing else of verl."""

from verl.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolError, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolError", "ToolResponse"]
