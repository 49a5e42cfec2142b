"""Tool calls in a sampled turn, in the Hermes format (``multi_turn.format=hermes``, verl's default):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "1234+5678"}}
    </tool_call>

Any number of calls per turn. A call that is not valid JSON, lacks a name or has non-object arguments is a
parse error: the agent loop tells the model what was wrong in a tool message instead of failing the sample.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from verl.utils.registry import Registry

TOOL_PARSERS = Registry("tool-call format (actor_rollout_ref.rollout.multi_turn.format)")

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedTurn:
    """The calls a turn makes, and one message per call that could not be read."""

    calls: list[ToolCall]
    errors: list[str]

    @property
    def has_calls(self) -> bool:
        return bool(self.calls or self.errors)


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> ParsedTurn:
    """Every ``<tool_call>{json}</tool_call>`` in ``text``; an opening tag never closed is a parse error."""
    calls, errors = [], []
    for body in _HERMES.findall(text):
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError as error:
            errors.append(
                f"the tool call is not valid JSON ({error.msg} at position {error.pos}): {body.strip()!r}"
            )
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            errors.append(f'a tool call needs {{"name": ..., "arguments": {{...}}}}, got {body.strip()!r}')
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            errors.append(
                f"the arguments of tool call {call['name']!r} must be a JSON object, got {arguments!r}"
            )
            continue
        calls.append(ToolCall(call["name"], arguments))
    if text.count("<tool_call>") > text.count("</tool_call>"):
        errors.append("a <tool_call> tag was opened and never closed with </tool_call>")
    return ParsedTurn(calls, errors)
