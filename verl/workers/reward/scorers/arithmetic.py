"""Reward for the synthetic ``a+b=`` arithmetic task used to smoke-test RL on tiny models."""

from __future__ import annotations

import re
from typing import Any

_FIRST_INT = re.compile(r"-?\d+")


def compute_score(solution_str: str, ground_truth: str | int, extra_info: Any = None) -> float:
    """Return 1.0 if the first integer in ``solution_str`` equals ``ground_truth``, else 0.0.

    Why the *first* integer: prompts look like ``"12+30="`` and a tiny model answers with the
    number straight away, then keeps babbling (often more digits) until the length limit. Taking
    the first integer rewards the answer it actually committed to; the last one would reward noise.
    A leading minus sign belongs to the number (``"-3"`` is -3). No integer at all scores 0.0.

    ``extra_info`` is accepted (and ignored) so the function fits the common scorer signature.
    A ground truth that is not an integer is a data bug and raises ``ValueError``.
    """
    expected = int(str(ground_truth).strip())
    match = _FIRST_INT.search(solution_str or "")
    if match is None:
        return 0.0
    return 1.0 if int(match.group(0)) == expected else 0.0


_TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


def final_answer_score(solution_str: str, ground_truth: str | int, extra_info: Any = None) -> float:
    """1.0 if the first integer of the response's last non-empty line, once ``<tool_call>`` blocks are removed,
    equals ``ground_truth``. A multi-turn response holds the tool calls and the tool results before the final
    answer (its last line); a number inside a call or a result earlier on does not count."""
    expected = int(str(ground_truth).strip())
    lines = [line for line in _TOOL_CALL.sub("", solution_str or "").splitlines() if line.strip()]
    match = _FIRST_INT.search(lines[-1]) if lines else None
    return 1.0 if match is not None and int(match.group(0)) == expected else 0.0
