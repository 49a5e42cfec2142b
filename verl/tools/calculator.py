"""A calculator tool: evaluates one arithmetic expression (``2 * (3 + 4.5) ** 2``) without ``eval``.

The expression is parsed with :mod:`ast` and only number literals, ``+ - * / // % **``, unary ``+ -`` and
parentheses are evaluated; names, calls, attributes, subscripts and everything else are refused. Sizes are
capped (expression length, integer size, exponent) so that ``9**9**9`` fails at once instead of eating the
machine's memory.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from verl.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolError, ToolResponse, string_argument

MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 4096
"""the largest integer, operand or result, in bits (about 1233 decimal digits)"""

CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression and return the result. Supports integers and decimals, "
            "+ - * / // % ** and parentheses."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "the expression, e.g. (12 + 3) * 4 / 5"}
            },
            "required": ["expression"],
        },
    },
}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; raises ToolError for anything else or anything too large."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long ({len(expression)} characters, at most {MAX_EXPRESSION_CHARS})")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ToolError(f"invalid expression: {error.msg}") from None
    except (RecursionError, MemoryError, ValueError):  # absurd nesting; ValueError: a NUL byte
        raise ToolError("invalid expression: too deeply nested or malformed") from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("result too large") from None
    except RecursionError:
        raise ToolError("expression too deeply nested") from None
    return _check(value)


def format_number(value: int | float) -> str:
    """``6912`` for an int or an integral float (below 1e16, where floats still hold every integer), else
    the float's shortest repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float):  # not bool, complex or str
            return _check(node.value)
        raise ToolError(f"unsupported literal {node.value!r}: only numbers are allowed")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _check(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp):
        raise ToolError(f"unsupported operator {type(node.op).__name__}: use + - * / // % **")
    if isinstance(node, (ast.Name, ast.Call, ast.Attribute)):
        raise ToolError(f"names, calls and attributes are not allowed ({ast.unparse(node)[:40]!r})")
    raise ToolError(f"unsupported syntax: {type(node).__name__}")


def _power(base: int | float, exponent: int | float) -> int | float:
    # Decide from the sizes before computing: an int power is exact, so 9**387420489 would run for minutes.
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * math.log2(abs(base)) > MAX_INT_BITS:
            raise ToolError(f"result too large (more than {MAX_INT_BITS} bits)")
    result = base**exponent
    if isinstance(result, complex):
        raise ToolError("result is a complex number (a negative number to a fractional power)")
    return _check(result)


def _check(value: int | float) -> int | float:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"result too large (more than {MAX_INT_BITS} bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not a finite number")
    return value


class CalculatorTool(BaseTool):
    """``calculator(expression)``: the value of an arithmetic expression, as text."""

    default_tool_schema = CALCULATOR_SCHEMA

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: OpenAIFunctionToolSchema | None = None
    ) -> None:
        unknown = set(config or {}) - {"type"}
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)} (the calculator takes none)")
        super().__init__(config or {}, tool_schema or OpenAIFunctionToolSchema.from_dict(CALCULATOR_SCHEMA))

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        expression = string_argument(parameters, "expression", 'a string such as "2 * (3 + 4)"')
        return ToolResponse(format_number(evaluate(expression))), 0.0, {}
