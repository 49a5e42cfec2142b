"""GSM8K rule-based reward: the same rules as upstream verl's GSM8K scorer (strict and flexible methods).

The strict method also checks the output *format* (``#### <answer>``, the way GSM8K writes its
references), which is what RL is meant to teach; the flexible method only looks for the last
number and is useful for evaluating models that were never taught the format.
"""

from __future__ import annotations

import re

# Regex search over very long generations is slow and the final answer sits at the end, so only
# the tail is searched (verl: "a safe approximation for 300 tokens").
_SOLUTION_CLIP_CHARS = 300

# verl's pattern is ``#### (\-?[0-9\.\,]+)``; the optional ``\$?`` is added here so that
# "#### $1,234" yields "1234" (verl strips "$" from the capture, but its pattern can never
# capture one, so with verl that input has no answer at all).
_STRICT = re.compile(r"#### \$?(-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"(-?[0-9.,]+)")
_INVALID_FLEXIBLE = {"", "."}


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Extract the final answer from the last 300 characters of ``solution_str``.

    strict: the LAST ``#### <number>`` match, with ``,`` and ``$`` removed.
    flexible: the last number-like token (digits, dots, commas, optional minus) that is not just
    ``"."``, returned as written (like verl: commas are kept, so "1,234" will not equal "1234").
    Returns None when nothing is found.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_SOLUTION_CLIP_CHARS:] if len(solution_str) > _SOLUTION_CLIP_CHARS else solution_str

    if method == "strict":
        matches = _STRICT.findall(tail)
        if not matches:
            return None
        return matches[-1].replace(",", "").replace("$", "")

    for token in reversed(_FLEXIBLE.findall(tail)):
        if token not in _INVALID_FLEXIBLE:
            return token
    # verl would return the last token it looked at (e.g. ".") here; "no answer" is what it means.
    return None


def compute_score(
    solution_str: str,
    ground_truth: str | int,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score a GSM8K response: no extractable answer -> 0.0, correct -> ``score``, else ``format_score``.

    ``format_score`` lets a run reward well-formed but wrong answers, as verl allows.
    Comparison is plain string equality after stripping whitespace (GSM8K references are
    integers without commas), so "18.0" does not match "18" -- same as verl.
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    if answer.strip() == str(ground_truth).strip():
        return float(score)
    return float(format_score)
