"""Symbolic answer checking with HuggingFace's math-verify: ``\\boxed{1/2}`` is right against ``0.5``, and so
is ``\\frac{2}{4}``, ``(x+1)^2`` against ``x^2+2x+1``; the string rules of the MATH scorer
(:mod:`verl.workers.reward.scorers.math_reward`) would mark those wrong.

Use it as the ``math_verify`` data_source, or as a custom reward function: ``compute_score`` takes verl's
keyword arguments (``data_source``, ``solution_str``, ``ground_truth``, ``extra_info``), so a file holding
``from verl.workers.reward.scorers.math_verify import compute_score`` (or this file's path) works as
``custom_reward_function.path``.

What is compared:

* the ground truth: a bare answer (``0.5``, ``\\frac{1}{2}``, ``(1, 2)``) is read as if it were boxed; a text
  that holds a ``\\boxed{}`` (a whole reference solution) is read like a response;
* the response, by math-verify's own extraction: its ``\\boxed{}`` when it has one; without a box, free-form,
  the answer after a phrase such as "the final answer is" or "answer:", else the last LaTeX or plain
  expression ("I got 3, then 4." gives 4). A response with nothing that reads as math scores 0.

math-verify is imported on first use (it pulls sympy and an ANTLR LaTeX parser): ``pip install -e '.[tasks]'``.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import Any

INSTALL = "pip install 'math-verify>=0.7' (or pip install -e '.[tasks]')"

if __name__ != "verl.workers.reward.scorers.math_verify":
    # Loaded by file path (custom_reward_function.path=.../scorers/math_verify.py): verl's file importer put
    # this directory on sys.path, where this file and reasoning_gym.py would shadow the math_verify and
    # reasoning_gym packages for every later import. Nothing here is imported by bare name: take it off.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if not entry or os.path.abspath(entry) != _here]


def math_verify_missing_message(what: str) -> str:
    """One line for ``what`` needing math-verify when it is not installed."""
    return f"{what} needs the math-verify package, which is not installed: {INSTALL}"


def import_math_verify() -> Any:
    """The ``math_verify`` module; ImportError with the pip command when it is missing."""
    try:
        import math_verify
    except ImportError as error:
        raise ImportError(math_verify_missing_message("the math_verify scorer")) from error
    return math_verify


# Timeouts are off in both calls (parsing_timeout=None, timeout_seconds=None): math-verify's default
# timeouts use signal.alarm, which raises "signal only works in main thread" on the helper thread that runs
# scorers under reward_model.timeout_s (see _MAIN_THREAD_ONLY in verl/workers/reward/manager.py), and would
# replace the process's SIGALRM handler on the main thread. reward_model.timeout_s is what bounds a
# pathological expression instead.


@lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str) -> tuple[Any, ...]:
    """The parsed ground truth (cached: the n responses to one prompt share it)."""
    mv = import_math_verify()
    text = ground_truth if "\\boxed" in ground_truth else f"\\boxed{{{ground_truth}}}"
    gold = mv.parse(text, extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None)
    if not gold:
        raise ValueError(f"math_verify scorer: math-verify cannot read the ground truth {ground_truth!r}")
    return tuple(gold)


def is_correct(solution_str: str, ground_truth: str | float) -> bool:
    """Whether math-verify finds the response's answer equal to ``ground_truth``."""
    if not isinstance(ground_truth, (str, int, float)) or isinstance(ground_truth, bool):
        raise ValueError(
            f"math_verify scorer: ground_truth must be an answer as text or a number, "
            f"got a {type(ground_truth).__name__}: {ground_truth!r:.120}"
        )
    gold = _parse_gold(str(ground_truth).strip())
    mv = import_math_verify()
    answer = mv.parse(solution_str, parsing_timeout=None)
    return bool(answer) and bool(mv.verify(list(gold), answer, timeout_seconds=None))


def compute_score(
    solution_str: str, ground_truth: str | float, extra_info: Any = None, data_source: str | None = None
) -> dict[str, float]:
    """``{"score": 1.0, "acc": 1.0}`` when the response's answer equals ``ground_truth`` symbolically, else 0s.

    ``extra_info`` and ``data_source`` are accepted and unused, so this is also a custom reward function.
    """
    score = 1.0 if is_correct(solution_str, ground_truth) else 0.0
    return {"score": score, "acc": score}
