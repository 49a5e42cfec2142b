"""The tool interface of verl's agent loop: ``create`` → ``execute`` (any number of times) → ``calc_reward`` →
``release``, one instance per trajectory, described to the model by an OpenAI function schema.

A tool is a class built from one entry of ``multi_turn.tool_config_path`` (see verl.tools.config):
``class_name`` (``package.module.Class``, ``package.module:Class`` or ``path/to/file.py:Class``), its
``config`` dict and its ``tool_schema``. The methods are coroutines: many trajectories run at once, and a
tool that waits (a subprocess, a web request) lets the others go on.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OpenAIFunctionToolSchema:
    """``{"type": "function", "function": {"name", "description", "parameters"}}``: what the chat template
    shows the model (``apply_chat_template(..., tools=[schema.to_dict()])``)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def from_dict(cls, schema: dict[str, Any], where: str = "tool_schema") -> OpenAIFunctionToolSchema:
        if not isinstance(schema, dict) or schema.get("type", "function") != "function":
            raise ValueError(f"{where}: expected {{type: function, function: {{name: ...}}}}, got {schema!r}")
        function = schema.get("function")
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise ValueError(f"{where}: function.name is missing (got {function!r})")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        return cls(function["name"], str(function.get("description", "")), dict(parameters))

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolResponse:
    """What a tool call returns to the model: text, shown as the tool message's content."""

    text: str = ""


class ToolError(Exception):
    """A tool call that failed in a way the model should be told about (bad arguments, a crash, a limit):
    the agent loop turns it into the tool message ``Error: ...`` and counts it in ``agent/tool_errors``."""


def string_argument(parameters: Any, name: str, hint: str) -> str:
    """The string argument ``name`` of a call, or a ToolError the model can act on (``hint`` describes it)."""
    value = parameters.get(name) if isinstance(parameters, dict) else None
    if value is None:
        raise ToolError(f'missing argument "{name}" ({hint})')
    if not isinstance(value, str):
        raise ToolError(f'"{name}" must be a string, got {type(value).__name__}')
    return value


class BaseTool:
    """One tool. Subclasses implement ``execute``; the default ``create`` keeps a per-instance dict
    (``self.instances[instance_id]``, seeded with the row's ``create_kwargs``), ``calc_reward`` returns 0 and
    ``release`` forgets the instance."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema
        self.name = tool_schema.name
        self.instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance for one trajectory; ``kwargs`` are the row's ``tools_kwargs[name].create_kwargs``."""
        instance_id = instance_id or uuid.uuid4().hex
        self.instances[instance_id] = dict(kwargs)
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run one call: its response, a step reward and metrics. Raise ToolError for a failure the model
        should see."""
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.instances.pop(instance_id, None)
