"""Tool calls in a sampled turn, in the Hermes format (``multi_turn.format=hermes``, verl's default):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "1234+5678"}}
    </tool_call>

Any number of calls per turn. A call that is not valid JSON, lacks a name or has non-object arguments is a
parse error: the agent loop tells the model what was wrong in a tool message instead of failing the sample.

The text is model output, so a parser must never raise: whatever it is given (JSON nested thousands deep, an
integer of thousands of digits, ``NaN``, lone surrogates, a body of megabytes, thousands of tags) ends as
calls and error messages, in time linear in its length. The work is bounded before ``json.loads`` runs (a
body over :data:`MAX_CALL_CHARS` characters or nested deeper than :data:`MAX_NESTING` is refused unread), and
whatever ``json.loads`` still raises is a parse error like a syntax error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from verl.utils.registry import Registry

TOOL_PARSERS = Registry("tool-call format (actor_rollout_ref.rollout.multi_turn.format)")

OPEN, CLOSE = "<tool_call>", "</tool_call>"

MAX_CALL_CHARS = 256 * 1024
"""the longest call body read (characters); a longer one is refused before it is parsed"""
MAX_NESTING = 64
"""the deepest nesting of JSON objects and arrays in a call (json.loads would recurse on each level)"""
MAX_CALLS_PER_TURN = 64
"""calls read per turn; the rest get one error message (each call becomes a tool message)"""
MAX_NAME_CHARS = 256
"""the longest tool name read"""
_PREVIEW_CHARS = 120
"""how much of a bad call an error message quotes"""


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


class BadCall(ValueError):
    """A call body that cannot be a tool call; its message is what the model is told."""


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> ParsedTurn:
    """Every ``<tool_call>{json}</tool_call>`` in ``text``; an opening tag never closed is a parse error.
    Never raises: see the module docstring."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    bodies = list(_bodies(text, MAX_CALLS_PER_TURN + 1))
    for body in bodies[:MAX_CALLS_PER_TURN]:
        try:
            calls.append(read_call(body))
        except BadCall as error:
            errors.append(str(error))
    if len(bodies) > MAX_CALLS_PER_TURN:
        errors.append(f"at most {MAX_CALLS_PER_TURN} tool calls are read per turn; the others were ignored")
    if text.count(OPEN) > text.count(CLOSE):
        errors.append(f"a {OPEN} tag was opened and never closed with {CLOSE}")
    return ParsedTurn(calls, errors)


def _bodies(text: str, limit: int):
    """The text between each ``<tool_call>`` and the first ``</tool_call>`` after it, at most ``limit`` of
    them, in one pass (a regex with a lazy ``.*?`` rescans the rest of the text for every unclosed tag)."""
    start = 0
    while limit > 0:
        opened = text.find(OPEN, start)
        if opened < 0:
            return
        closed = text.find(CLOSE, opened + len(OPEN))
        if closed < 0:
            return
        yield text[opened + len(OPEN) : closed]
        start, limit = closed + len(CLOSE), limit - 1


def read_call(body: str) -> ToolCall:
    """One call body as a :class:`ToolCall`, or a :class:`BadCall` saying what is wrong with it."""
    body = body.strip()
    call = _load_json(body, "the tool call")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"].strip():
        raise BadCall(f'a tool call needs {{"name": ..., "arguments": {{...}}}}, got {preview(body)}')
    name = call["name"]
    if len(name) > MAX_NAME_CHARS:
        raise BadCall(f"a tool name is at most {MAX_NAME_CHARS} characters, got {len(name)}: {preview(name)}")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string: decoded once
        try:
            arguments = _load_json(arguments, f"the arguments of tool call {preview(name)}")
        except BadCall:
            pass  # reported below as arguments that are not an object
    if not isinstance(arguments, dict):
        raise BadCall(
            f"the arguments of tool call {preview(name)} must be a JSON object, got {preview(arguments)}"
        )
    return ToolCall(name, arguments)


def _load_json(text: str, what: str) -> Any:
    """``json.loads(text)`` within the bounds of the module docstring; anything else is a BadCall."""
    if len(text) > MAX_CALL_CHARS:
        raise BadCall(f"{what} is {len(text)} characters long, more than the {MAX_CALL_CHARS} read")
    depth = _nesting(text)
    if depth > MAX_NESTING:
        raise BadCall(f"{what} is nested {depth} levels deep, more than the {MAX_NESTING} read")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise BadCall(
            f"{what} is not valid JSON ({error.msg} at position {error.pos}): {preview(text)}"
        ) from None
    except BadCall as error:
        raise BadCall(f"{what} is not valid JSON ({error}): {preview(text)}") from None
    except Exception as error:  # RecursionError, a number of too many digits (ValueError), MemoryError, ...
        reason = f"{type(error).__name__}: {str(error)[:100]}"
        raise BadCall(f"{what} could not be read ({reason}): {preview(text)}") from None
    problem = _unrepresentable(value)
    if problem:
        raise BadCall(f"{what} holds {problem}: {preview(text)}")
    return value


def _refuse_constant(name: str) -> Any:
    raise BadCall(f"{name} is not a JSON value")


def _nesting(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in ``text``, brackets inside strings not counted (a
    scan of the characters, so that no recursion runs before the depth is known)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def _unrepresentable(value: Any) -> str | None:
    """What in a parsed value no tool should be handed (an infinite float, from ``1e999``; a string with a lone
    surrogate, which cannot be encoded as UTF-8), or None. Iterative: the depth is bounded, not trusted."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"a number out of range ({item})"
        if isinstance(item, str) and _has_surrogate(item):
            return "a lone surrogate (text that is not valid Unicode)"
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def preview(value: Any) -> str:
    """``value`` quoted for an error message: its repr, at most _PREVIEW_CHARS characters of it, encodable."""
    try:
        text = repr(value)
    except Exception:  # a repr of a hostile value: JSON gives none, but the message must still be written
        text = f"<{type(value).__name__}>"
    if len(text) > _PREVIEW_CHARS:
        text = f"{text[: _PREVIEW_CHARS // 2]}...({len(text)} characters)...{text[-_PREVIEW_CHARS // 2 :]}"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
