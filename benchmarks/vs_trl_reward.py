"""The reward both sides of ``benchmarks/vs_trl.py`` train with: one function, two calling conventions.

The prompts are the default recipe's ``a+b=`` problems. A plain correctness score (1 or 0) gives no signal to a
random-weight model (every sample scores 0, every advantage is 0, and verl then skips the backward pass of the
whole batch, ``actor.skip_zero_advantage``, which TRL does not), and little to SmolLM2-135M, which often restates
the problem before answering. So the score is dense partial credit on the *last* integer of the response:

* 1.0 when it equals the answer;
* otherwise 0.1 (it gave a number) + 0.4 x closeness, closeness = max(0, 1 - |x - answer| / max(|answer|, 1));
* 0.0 when the response holds no integer.

Samples of one group then almost never all score the same, so both trainers do a full update on both models.
Kept free of heavy imports: verl loads this file by path (``custom_reward_function.path``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_INT = re.compile(r"-?\d+")


def partial_credit(text: str, answer: str | int) -> float:
    """The score of one response ``text`` to a problem whose answer is ``answer`` (see the module docstring)."""
    expected = int(str(answer).strip())
    numbers = _INT.findall(text or "")
    if not numbers:
        return 0.0
    last = int(numbers[-1])
    if last == expected:
        return 1.0
    closeness = max(0.0, 1.0 - abs(last - expected) / max(abs(expected), 1))
    return 0.1 + 0.4 * closeness


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """verl's convention (``custom_reward_function.name=compute_score``): one decoded response at a time."""
    return partial_credit(solution_str, ground_truth)


def completion_text(completion: Any) -> str:
    """TRL hands a conversational completion as ``[{"role": "assistant", "content": text}]``, a plain one as text."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


def trl_reward(completions: Sequence[Any], ground_truth: Sequence[Any], **_: Any) -> list[float]:
    """TRL's convention (``reward_funcs=[...]``): the whole generation batch, dataset columns as keyword lists."""
    return [partial_credit(completion_text(c), a) for c, a in zip(completions, ground_truth, strict=True)]
