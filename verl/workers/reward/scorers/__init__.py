"""Rule-based scorers and the data_source -> scorer dispatch used by the reward managers.

Every registered scorer has the signature ``fn(solution_str, ground_truth, extra_info=None)`` and
returns a float or a dict with a ``"score"`` key (extra keys with numbers become the metrics
``reward_extra/<key>/mean`` and ``val-aux/<source>/<key>/mean@n``). A data_source is
looked up by its exact name, then by a registered prefix (``reasoning_gym/<task>`` for every
reasoning-gym task).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.utils.registry import Registry
from verl.workers.reward.scorers import arithmetic, gsm8k, math_reward, math_verify, reasoning_gym

ScoreFn = Callable[..., "float | dict[str, Any]"]

SCORERS = Registry("reward scorer for data_source")

SCORER_PREFIXES: dict[str, ScoreFn] = {}
"""data_source prefix -> scorer, for families of sources that share one scorer (``reasoning_gym/``)."""


def register_scorer(name: str, *, overwrite: bool = False) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator registering ``fn(solution_str, ground_truth, extra_info=None)`` under a data_source.

    Re-registering a name raises unless ``overwrite=True`` so two tasks cannot silently share a
    data_source by accident.
    """
    return SCORERS.register(name, overwrite=overwrite)


@register_scorer("arithmetic")
def _arithmetic(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """The score (1.0 correct, 0.0 not) is exactly correctness, so it is reported as ``acc`` too: validation
    then shows ``val-core/arithmetic/acc/mean@n`` (a score alone is reported as ``.../reward/mean@n``)."""
    score = arithmetic.compute_score(solution_str, ground_truth, extra_info=extra_info)
    return {"score": score, "acc": score}


@register_scorer("tool_arithmetic")
def _tool_arithmetic(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """The final answer after any tool calls (verl.data.tasks.tool_arithmetic); ``acc`` and ``tool_used`` (the
    response called the tool at least once)."""
    score = arithmetic.final_answer_score(solution_str, ground_truth, extra_info=extra_info)
    return {"score": score, "acc": score, "tool_used": float("<tool_call>" in (solution_str or ""))}


def _gsm8k(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return gsm8k.compute_score(solution_str, ground_truth, method="strict")


register_scorer("openai/gsm8k")(_gsm8k)
register_scorer("gsm8k")(_gsm8k)

MATH_DATA_SOURCES = ("DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH", "HuggingFaceH4/MATH-500")
"""verl's data_source names for MATH: the dataset ``python -m verl.data.preprocess math`` writes, the hub id it
replaced (lighteval/MATH is gone from the hub) and the MATH-500 test subset, all scored alike."""


def _math(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """Last ``\\boxed{}`` vs the reference after Hendrycks normalisation; a correctness score, so also ``acc``."""
    score = math_reward.compute_score(solution_str, ground_truth, extra_info=extra_info)
    return {"score": score, "acc": score}


for _name in MATH_DATA_SOURCES:
    register_scorer(_name)(_math)


def _math_verify(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """Symbolic equality by math-verify (optional package), ``\\boxed{}`` or free-form; see its module."""
    return math_verify.compute_score(solution_str, ground_truth, extra_info=extra_info)


register_scorer("math_verify")(_math_verify)


def _reasoning_gym(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """reasoning-gym's own ``score_answer`` for the task named in the row's extra_info, on the response's last
    ``<answer>...</answer>``; see its module."""
    return reasoning_gym.compute_score(solution_str, ground_truth, extra_info=extra_info)


# "reasoning_gym" itself serves a file that mixes tasks under one data_source (each row names its task).
register_scorer("reasoning_gym")(_reasoning_gym)
SCORER_PREFIXES[reasoning_gym.DATA_SOURCE_PREFIX] = _reasoning_gym


def find_scorer(data_source: Any) -> ScoreFn | None:
    """The scorer registered as ``data_source``, else the one of its longest registered prefix, else None."""
    try:
        return SCORERS[data_source]
    except (KeyError, TypeError):
        pass
    if not isinstance(data_source, str):
        return None
    prefixes = [prefix for prefix in SCORER_PREFIXES if data_source.startswith(prefix)]
    return SCORER_PREFIXES[max(prefixes, key=len)] if prefixes else None


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float | dict[str, Any]:
    """Score one response with the scorer registered for ``data_source``.

    Unknown sources raise ``NotImplementedError`` (listing the known names) rather than scoring 0,
    because a silent zero reward looks exactly like a model that is failing to learn.
    """
    fn = find_scorer(data_source)
    if fn is None:
        known = ", ".join([*sorted(SCORERS), *(f"{prefix}<name>" for prefix in sorted(SCORER_PREFIXES))])
        raise NotImplementedError(
            f"no reward scorer for data_source {data_source!r}; known: {known}. "
            "Register one with verl.workers.reward.register_scorer(name) or set "
            "custom_reward_function.path."
        )
    result = fn(solution_str, ground_truth, extra_info=extra_info)
    if isinstance(result, dict):
        return result
    return float(result)


__all__ = [
    "MATH_DATA_SOURCES",
    "SCORERS",
    "SCORER_PREFIXES",
    "ScoreFn",
    "arithmetic",
    "default_compute_score",
    "find_scorer",
    "gsm8k",
    "math_reward",
    "math_verify",
    "reasoning_gym",
    "register_scorer",
]
