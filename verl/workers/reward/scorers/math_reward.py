"""MATH rule-based reward: the last ``\\boxed{...}`` of a response, compared with the reference answer after
the string normalisation of Hendrycks et al. (2021), as verl's ``math_reward`` scorer does.

Exact-string comparison of LaTeX would mark ``\\dfrac{1}{2}`` wrong against ``\\frac{1}{2}``; a symbolic
checker (math-verify) is more forgiving still but slow and an optional dependency. This normaliser is the
middle ground the MATH benchmark itself was published with, so scores stay comparable with verl's.
"""

from __future__ import annotations

import re
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _matching_brace(text: str, open_at: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_at``, or None when it is never closed.

    Escaped braces (``\\{``, ``\\}``) are skipped: a set answer such as ``\\left\\{1,2\\right.`` would
    otherwise unbalance the count.
    """
    depth = 0
    i = open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _last_box_command(text: str) -> tuple[int, str] | None:
    """Where the last ``\\boxed`` starts (or, when there is none, the last ``\\fbox``), with the command."""
    for command in _BOX_COMMANDS:
        start = text.rfind(command)
        while start >= 0:
            after = start + len(command)
            # "\boxedx" is another command, not a box; only a brace or whitespace may follow.
            if after < len(text) and (text[after] == "{" or text[after].isspace()):
                return start, command
            start = text.rfind(command, 0, start)
    return None


def last_boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (``\\fbox{...}`` when there is no ``\\boxed``).

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``). The brace-less form
    ``\\boxed 5$`` (a few MATH solutions use it) yields the text up to the closing ``$`` or the end of the
    line. Returns None when there is no box or its brace is never closed: no answer, not a wrong one.
    """
    found = _last_box_command(text)
    if found is None:
        return None
    start, command = found
    rest_at = start + len(command)
    while rest_at < len(text) and text[rest_at].isspace() and text[rest_at] != "\n":
        rest_at += 1
    if rest_at < len(text) and text[rest_at] == "{":
        close = _matching_brace(text, rest_at)
        return None if close is None else text[rest_at + 1 : close]
    bare = re.match(r"[^$\n]*", text[rest_at:])
    answer = bare.group(0).strip() if bare else ""
    return answer or None


# ---------------------------------------------------------------------------------------------
# normalisation

_TEXT_UNITS = "\\text{ "
_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")
_DECIMAL = re.compile(r"-?\d+\.\d+")
_INT_SLASH_INT = re.compile(r"(-?\d+)/(\d+)")


def _drop_right_units(answer: str) -> str:
    """``"5\\text{ cm}"`` -> ``"5"``: in MATH a ``\\text{`` followed by a space only ever spells a unit.

    A text that is the whole answer (``"\\text{ (A)}"``) is kept: cutting it would make every such answer
    normalise to the empty string and match every other one.
    """
    head, sep, _ = answer.partition(_TEXT_UNITS)
    return head if sep and head.strip() else answer


def _drop_short_lhs(answer: str) -> str:
    """``"k = 5"`` -> ``"5"``: a one- or two-character variable name before a single ``=`` is not the answer."""
    parts = answer.split("=")
    if len(parts) == 2 and len(parts[0]) <= 2:
        return parts[1]
    return answer


def _brace_bare_sqrt(answer: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``: the argument of a brace-less ``\\sqrt`` is its next character.

    Runs after spaces are removed, so ``\\sqrt 3`` is braced too; ``\\sqrt[3]{x}`` and ``\\sqrt\\pi``
    are left alone.
    """
    return re.sub(r"\\sqrt([^{\\\[])", r"\\sqrt{\1}", answer)


def _brace_bare_fracs(answer: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``, ``\\frac{3}4`` -> ``\\frac{3}{4}``.

    LaTeX takes a brace-less argument to be one character; bracing both arguments makes every spelling of
    the same fraction one string. Runs after spaces are removed, so the arguments are adjacent.
    """
    pieces = answer.split("\\frac")
    out = [pieces[0]]
    for piece in pieces[1:]:
        out.append("\\frac" + _brace_frac_arguments(piece))
    return "".join(out)


def _brace_frac_arguments(rest: str) -> str:
    """Brace the two arguments at the start of ``rest`` (what follows one ``\\frac``)."""
    braced = []
    i = 0
    for _ in range(2):
        if i >= len(rest):
            return rest  # "\frac1" is malformed: leave it as written
        if rest[i] == "{":
            close = _matching_brace(rest, i)
            if close is None:
                return rest
            braced.append(rest[i : close + 1])
            i = close + 1
        else:
            braced.append("{" + rest[i] + "}")
            i += 1
    return "".join(braced) + rest[i:]


def _plain_number_forms(answer: str) -> str:
    """Spellings of one number made equal: ``"1,000"`` -> ``"1000"``, ``"5.0"`` -> ``"5"``, ``"2.50"`` ->
    ``"2.5"``; ``"0.5"`` and ``"1/2"`` -> ``"\\frac{1}{2}"`` (these two as Hendrycks et al. do).

    Only a string that is nothing but the number is touched: ``"(1,000)"`` or ``"1,2"`` (a pair) stay.
    """
    if _THOUSANDS.fullmatch(answer):
        answer = answer.replace(",", "")
    if _DECIMAL.fullmatch(answer):
        answer = answer.rstrip("0").rstrip(".")
    if answer == "0.5":
        return "\\frac{1}{2}"
    slash = _INT_SLASH_INT.fullmatch(answer)
    if slash:
        return f"\\frac{{{int(slash.group(1))}}}{{{int(slash.group(2))}}}"
    return answer


def normalize_answer(answer: str) -> str:
    """Normalise a MATH answer string so that equal answers written differently compare equal.

    Follows the answer normalisation released with the MATH benchmark (Hendrycks et al., 2021, "Measuring
    Mathematical Problem Solving With the MATH Dataset", NeurIPS Datasets and Benchmarks; the
    ``is_equiv`` / ``strip_string`` rules that verl's ``math_reward`` also uses): drop line breaks, ``\\!``,
    ``\\left`` / ``\\right``, degree signs, ``\\$``, ``\\%`` and units written as ``\\text{ ...}``; turn
    ``\\dfrac`` / ``\\tfrac`` into ``\\frac``; write ``.5`` as ``0.5``; drop a short ``x =`` prefix; brace
    ``\\sqrt3`` and ``\\frac12``; remove all spaces; write ``0.5`` and ``a/b`` as ``\\frac``.

    Beyond Hendrycks: a plain number loses trailing decimal zeros and thousands separators (``"5.0"``,
    ``"1,000"``), and a whole-answer ``\\text{ ...}`` is not cut to nothing (see :func:`_drop_right_units`).
    Symbolic equivalence (``\\frac{2}{4}`` vs ``\\frac{1}{2}``) is out of scope, as it is for the benchmark.
    """
    s = answer.replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _drop_right_units(s)
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    s = _drop_short_lhs(s)
    s = s.replace(" ", "")
    s = _brace_bare_sqrt(s)
    s = _brace_bare_fracs(s)
    return _plain_number_forms(s)


def is_equiv(answer: str | None, reference: str | None) -> bool:
    """Whether two answers are equal after :func:`normalize_answer`; a missing answer never is."""
    if answer is None or reference is None:
        return False
    return normalize_answer(answer) == normalize_answer(reference)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the last ``\\boxed{}`` of ``solution_str`` equals ``ground_truth`` after normalisation, else 0.0.

    The ground truth is the reference answer itself (what ``python -m verl.data.preprocess math`` writes:
    the content of the solution's last box), not a boxed solution. No box in the response scores 0.0,
    so the model is taught the format the instruction asks for. ``extra_info`` is accepted and ignored.
    """
    answer = last_boxed_answer(solution_str or "")
    return 1.0 if is_equiv(answer, str(ground_truth)) else 0.0
