"""Tools for multi-turn rollouts: the interface (:mod:`verl.tools.base`), the built-in tools
(:mod:`verl.tools.calculator`, :mod:`verl.tools.python_sandbox`) and the config loader
(:mod:`verl.tools.config`)."""

from verl.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolError, ToolResponse
from verl.tools.config import load_tools, tool_schemas

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolError", "ToolResponse", "load_tools", "tool_schemas"]
