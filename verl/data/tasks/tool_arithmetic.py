"""``prepare.task=tool_arithmetic``: sums of two 4-digit numbers, which a tiny model cannot add in its head but
can with a calculator tool (the ``arithmetic_tools`` recipe).

Each row is an RL prompt (``1234+5678=``, ground truth ``6912``) with a ``messages`` column holding an SFT
demonstration (verl's multi-turn SFT layout). The first ``tool_demos`` training rows demonstrate the tool:

    user: 1234+5678=
    assistant: <tool_call>
    {"name": "calculator", "arguments": {"expression": "1234+5678"}}
    </tool_call>
    tool: 6912
    assistant: 6912

and every other row answers at once (``assistant: 6912``): the habit of a model that answers from memory. A
warm start on the first ``tool_demos + direct_demos`` rows therefore calls the tool now and then and guesses
otherwise; RL rewards the right answer, which only the tool gives. Train and test pairs are disjoint
(unordered pairs, so ``a+b`` and ``b+a`` fall on the same side).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from verl.data.io import write_rows

DATA_SOURCE = "tool_arithmetic"


def tool_call(expression: str) -> str:
    """The Hermes-format call of the calculator tool (verl.tools.calculator) on ``expression``."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _row(a: int, b: int, split: str, index: int, demo: str) -> dict[str, Any]:
    question, answer = f"{a}+{b}=", str(a + b)
    messages = [{"role": "user", "content": question}]
    if demo == "tool":
        messages += [
            {"role": "assistant", "content": tool_call(f"{a}+{b}")},
            {"role": "tool", "content": answer},
        ]
    messages.append({"role": "assistant", "content": answer})
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "messages": messages,
        "extra_info": {"split": split, "index": index, "a": a, "b": b, "demo": demo},
    }


def make_tool_arithmetic_rows(
    train_size: int = 2000,
    test_size: int = 200,
    tool_demos: int = 32,
    low: int = 1000,
    high: int = 9999,
    seed: int = 0,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``train_size`` / ``test_size`` sums of operands in ``[low, high]``, no unordered pair in both; the first
    ``tool_demos`` training rows demonstrate the tool, the rest answer directly."""
    if not 0 <= low <= high:
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    if (high - low + 1) ** 2 < 2 * (train_size + test_size):
        raise ValueError(f"[{low}, {high}] has too few pairs for {train_size} + {test_size} distinct sums")
    rng = random.Random(f"tool-arithmetic:{seed}")
    seen: set[tuple[int, int]] = set()
    pairs = []
    while len(pairs) < train_size + test_size:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (min(a, b), max(a, b)) not in seen:
            seen.add((min(a, b), max(a, b)))
            pairs.append((a, b))
    train = [
        _row(a, b, "train", i, "tool" if i < tool_demos else "direct")
        for i, (a, b) in enumerate(pairs[:train_size])
    ]
    test = [_row(a, b, "test", i, "tool") for i, (a, b) in enumerate(pairs[train_size:])]
    return train, test


def write_tool_arithmetic_dataset(out_dir: str | Path, **kwargs: Any) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out_dir``; kwargs go to `make_tool_arithmetic_rows`."""
    out = Path(out_dir).expanduser()
    train_rows, test_rows = make_tool_arithmetic_rows(**kwargs)
    return write_rows(out / "train.parquet", train_rows), write_rows(out / "test.parquet", test_rows)
