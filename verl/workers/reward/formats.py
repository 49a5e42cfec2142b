"""The final-answer format each data source asks for: what the ``format`` reward term checks.

A format check is ``fn(solution_str, ground_truth) -> bool`` (most ignore the ground truth); one registered with
``extra_info=True`` is also given the row's ``extra_info``, where a row may name its own format. Built in: GSM8K's ``#### <number>``, MATH's ``\\boxed{...}``, the arithmetic task's number
right after the ``=``, and for every data source starting with ``reasoning_gym/`` the row's answer format
(``<answer>...</answer>``, or a number). A task registers its own with :func:`register_answer_format`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from verl.workers.reward.scorers import MATH_DATA_SOURCES, reasoning_gym
from verl.workers.reward.scorers.gsm8k import extract_solution
from verl.workers.reward.scorers.math_reward import last_boxed_answer

FormatCheck = Callable[[str, Any], bool]

ANSWER_FORMATS: dict[str, FormatCheck] = {}
"""data_source -> its format check"""
PREFIX_FORMATS: dict[str, FormatCheck] = {}
"""data_source prefix (``reasoning_gym/``) -> the format check of every source starting with it"""
_READS_EXTRA_INFO: set[Callable[..., bool]] = set()
"""the checks registered with ``extra_info=True``: called ``fn(solution_str, ground_truth, extra_info)``"""


def register_answer_format(
    data_source: str, *, prefix: bool = False, overwrite: bool = False, extra_info: bool = False
) -> Callable[[FormatCheck], FormatCheck]:
    """Decorator registering ``fn(solution_str, ground_truth) -> bool`` as the answer format of ``data_source`` (with
    ``prefix``: of every data source starting with it; with ``extra_info``: ``fn(solution_str, ground_truth,
    extra_info)``, for a format the row names there). Registering a name twice raises unless ``overwrite``."""
    table = PREFIX_FORMATS if prefix else ANSWER_FORMATS

    def decorator(fn: FormatCheck) -> FormatCheck:
        if data_source in table and table[data_source] is not fn and not overwrite:
            raise ValueError(f"an answer format is already registered for {data_source!r}")
        table[data_source] = fn
        if extra_info:
            _READS_EXTRA_INFO.add(fn)
        return fn

    return decorator


def known_formats() -> list[str]:
    """The registered data sources, prefixes written ``prefix*``."""
    return sorted(ANSWER_FORMATS) + sorted(f"{p}*" for p in PREFIX_FORMATS)


def format_check(data_source: Any) -> FormatCheck:
    """The format check of ``data_source``; an unknown one is a ValueError naming it and the known ones."""
    source = str(data_source)
    if source in ANSWER_FORMATS:
        return ANSWER_FORMATS[source]
    for prefix, fn in PREFIX_FORMATS.items():
        if source.startswith(prefix):
            return fn
    raise ValueError(
        f"the format reward term knows no answer format for data_source {data_source!r}; known: "
        f"{', '.join(known_formats())} (register one with "
        "verl.workers.reward.formats.register_answer_format, or drop format from reward_model.reward_fns)"
    )


def format_score(
    data_source: Any, solution_str: str, ground_truth: Any = None, extra_info: Any = None
) -> float:
    """1.0 when ``solution_str`` has the final-answer format ``data_source`` asks for, else 0.0 (the scorer
    signature, so it is one more term of the sum)."""
    check = format_check(data_source)
    if check in _READS_EXTRA_INFO:
        return 1.0 if check(solution_str or "", ground_truth, extra_info) else 0.0
    return 1.0 if check(solution_str or "", ground_truth) else 0.0


def _gsm8k(solution_str: str, ground_truth: Any = None) -> bool:
    """``#### <number>`` in the last 300 characters, where GSM8K's strict scorer looks for it."""
    return extract_solution(solution_str, method="strict") is not None


def _math(solution_str: str, ground_truth: Any = None) -> bool:
    """A closed ``\\boxed{...}`` (or ``\\fbox``), the box MATH's scorer reads the answer from."""
    return last_boxed_answer(solution_str) is not None


_LEADING_INT = re.compile(r"\s*-?\d")


def _arithmetic(solution_str: str, ground_truth: Any = None) -> bool:
    """The prompt is ``a+b=``: the answer is asked for right away, so the response must start with an integer
    (the arithmetic scorer reads the first integer, wherever it is)."""
    return _LEADING_INT.match(solution_str) is not None


def _reasoning_gym(solution_str: str, ground_truth: Any = None, extra_info: Any = None) -> bool:
    """The answer in the row's own format (``<answer>...</answer>`` by default, or a number, named in its
    ``extra_info``): what its scorer reads (:data:`verl.workers.reward.scorers.reasoning_gym.ANSWER_FORMATS`)."""
    return reasoning_gym.read_answer(solution_str, ground_truth, extra_info) is not None


register_answer_format("openai/gsm8k")(_gsm8k)
register_answer_format("gsm8k")(_gsm8k)
for _name in MATH_DATA_SOURCES:
    register_answer_format(_name)(_math)
register_answer_format("arithmetic")(_arithmetic)
register_answer_format("reasoning_gym/", prefix=True, extra_info=True)(_reasoning_gym)
register_answer_format("reasoning_gym", extra_info=True)(_reasoning_gym)  # a file mixing tasks
