"""Building the tools of a multi-turn rollout from the tool config YAML that
``actor_rollout_ref.rollout.multi_turn.tool_config_path`` names (its format: :mod:`verl.tools.config`).

Each entry's class is imported (``package.module.Class``, ``package.module:Class`` or ``file.py:Class``,
a relative file looked up from the working directory, then next to the YAML file) and built with its
``config`` and ``tool_schema``; anything wrong is a ConfigError naming the setting, the file and the entry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from verl.config.errors import ConfigError, short_repr
from verl.errors import UserError, describe_error
from verl.tools.base import BaseTool, OpenAIFunctionToolSchema
from verl.tools.config import TOOL_CONFIG_KEY, tool_config_file
from verl.utils.imports import load_object

_ENTRY_KEYS = ("class_name", "config", "tool_schema")


def load_tools(path: str | os.PathLike[str]) -> list[BaseTool]:
    """The tools listed in the tool config YAML at ``path``, each built from its entry; a ConfigError names
    the setting, the file and the entry for anything wrong."""
    if not path:
        raise ConfigError(f"{TOOL_CONFIG_KEY} is empty: set it to a tool config YAML file")
    where = f"{TOOL_CONFIG_KEY}={path}"
    file = tool_config_file(path)
    if not file.is_file():
        raise ConfigError(f"{where}: no such file")
    entries = _read_entries(file, where)
    tools: list[BaseTool] = []
    names: dict[str, int] = {}
    for index, entry in enumerate(entries):
        tool = _build(entry, index, file, where)
        if tool.name in names:
            raise ConfigError(
                f"{where}: tools[{index}] and tools[{names[tool.name]}] are both named {tool.name!r}; "
                "tool names must be unique"
            )
        names[tool.name] = index
        tools.append(tool)
    return tools


def tool_schemas(tools: list[BaseTool]) -> list[dict[str, Any]]:
    """The OpenAI function schemas of ``tools``, as the chat template takes them (``tools=...``)."""
    return [tool.get_openai_tool_schema().to_dict() for tool in tools]


def _read_entries(file: Path, where: str) -> list[Any]:
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(file), resolve=True)
    except Exception as error:  # a YAML syntax error or a bad interpolation, from yaml or omegaconf
        raise ConfigError(f"{where}: cannot read it as YAML: {describe_error(error)}") from None
    if not isinstance(data, dict) or "tools" not in data:
        raise ConfigError(f"{where}: expected a mapping with a 'tools' list, got {short_repr(data)}")
    entries = data["tools"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{where}: 'tools' must be a non-empty list of tool entries, got {short_repr(entries)}"
        )
    return entries


def _build(entry: Any, index: int, file: Path, where: str) -> BaseTool:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str) or not entry["class_name"]:
        raise ConfigError(f"{where}: tools[{index}] needs a class_name, got {short_repr(entry)}")
    class_name = entry["class_name"]
    what = f"{where}: tools[{index}] ({class_name})"
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{what}: unknown keys {unknown}; an entry has {', '.join(_ENTRY_KEYS)}")
    cls = _load_class(class_name, index, file, where)
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ConfigError(f"{what}: {short_repr(cls)} is not a subclass of verl.tools.BaseTool")

    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{what}: config must be a mapping, got {short_repr(config)}")
    raw_schema = entry.get("tool_schema") or getattr(cls, "default_tool_schema", None)
    if raw_schema is None:
        raise ConfigError(
            f"{what}: tool_schema is missing (only tools with a default_tool_schema may omit it)"
        )
    schema = _parse_schema(raw_schema, f"{what}: tool_schema")
    try:
        return cls(config, schema)
    except (UserError, ValueError, TypeError) as error:  # the tool's own check of its config
        raise ConfigError(f"{what}: {error}") from error
    except Exception as error:  # a bug in the tool
        raise ConfigError(f"{what}: building the tool failed: {describe_error(error)}") from error


def _load_class(class_name: str, index: int, file: Path, where: str) -> Any:
    key = f"{where}: tools[{index}].class_name"
    if ":" in class_name:
        module, _, attr = class_name.rpartition(":")
    else:
        module, _, attr = class_name.rpartition(".")
        if not module:
            raise ConfigError(
                f"{key}={class_name!r}: write it as package.module.Class, package.module:Class or "
                "path/to/file.py:Class"
            )
    if module.endswith(".py") and not os.path.isabs(module) and not os.path.exists(module):
        beside = file.resolve().parent / module
        if beside.is_file():
            module = str(beside)
    try:
        return load_object(f"{module}:{attr}", key, kind="tool class")
    except ConfigError:
        raise
    except UserError as error:  # a user file that fails to run: its message names the file and line
        raise ConfigError(f"{key}={class_name!r}: {error}") from error
    except Exception as error:  # the module itself failed to import (a syntax error, an error at import)
        raise ConfigError(f"{key}={class_name!r}: importing it failed: {describe_error(error)}") from error


def _parse_schema(raw: Any, where: str) -> OpenAIFunctionToolSchema:
    try:
        schema = OpenAIFunctionToolSchema.from_dict(raw, where=where)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error) if where in str(error) else f"{where}: {error}") from None
    parameters = schema.parameters
    if parameters.get("type", "object") != "object":
        raise ConfigError(
            f"{where}: function.parameters.type must be 'object', got {parameters.get('type')!r}"
        )
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise ConfigError(
            f"{where}: function.parameters.properties must be a mapping, got {short_repr(properties)}"
        )
    required = parameters.get("required", [])
    if not isinstance(required, list) or any(
        not isinstance(name, str) or name not in properties for name in required
    ):
        raise ConfigError(
            f"{where}: function.parameters.required must list names from properties "
            f"({', '.join(properties) or 'none'}), got {short_repr(required)}"
        )
    return schema
