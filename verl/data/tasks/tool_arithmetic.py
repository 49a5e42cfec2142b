"""``prepare.task=tool_arithmetic``: sums of two 4-digit numbers, which a tiny model cannot add in its head but
can with a calculator tool (the ``arithmetic_tools`` recipe).

Three files: ``sft.parquet``, the warm start's demonstrations (a ``messages`` column, verl's multi-turn SFT
layout), ``train.parquet``, the RL prompts (``1234+5678=``, ground truth ``6912``), and ``test.parquet``; no
unordered pair is in two of them (``a+b`` and ``b+a`` fall in the same one). The first ``tool_demos``
demonstrations call the tool:

    user: 1234+5678=
    assistant: <tool_call>
    {"name": "calculator", "arguments": {"expression": "1234+5678"}}
    </tool_call>
    tool: 6912
    assistant: 6912

and the others answer at once (``assistant: 6912``): the habit of a model that answers from memory. A warm
start on them calls the tool now and then and guesses otherwise; RL rewards the right answer, which only the
tool gives.
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
    sft_size: int = 512,
    tool_demos: int = 256,
    low: int = 1000,
    high: int = 9999,
    seed: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """``{"sft", "train", "test"}`` rows: sums of operands in ``[low, high]``, no unordered pair in two splits;
    the first ``tool_demos`` of the ``sft_size`` demonstrations call the tool, the rest answer directly."""
    if not 0 <= low <= high:
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    if not 0 <= tool_demos <= sft_size:
        raise ValueError(
            f"need 0 <= tool_demos <= sft_size, got tool_demos={tool_demos}, sft_size={sft_size}"
        )
    total = sft_size + train_size + test_size
    if (high - low + 1) ** 2 < 2 * total:
        raise ValueError(f"[{low}, {high}] has too few pairs for {total} distinct sums")
    rng = random.Random(f"tool-arithmetic:{seed}")
    seen: set[tuple[int, int]] = set()
    pairs = []
    while len(pairs) < total:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (min(a, b), max(a, b)) not in seen:
            seen.add((min(a, b), max(a, b)))
            pairs.append((a, b))
    sft, train, test = (
        pairs[:sft_size],
        pairs[sft_size : sft_size + train_size],
        pairs[sft_size + train_size :],
    )
    return {
        "sft": [_row(a, b, "sft", i, "tool" if i < tool_demos else "direct") for i, (a, b) in enumerate(sft)],
        "train": [_row(a, b, "train", i, "tool") for i, (a, b) in enumerate(train)],
        "test": [_row(a, b, "test", i, "tool") for i, (a, b) in enumerate(test)],
    }


def write_tool_arithmetic_dataset(out_dir: str | Path, **kwargs: Any) -> tuple[Path, Path]:
    """Write ``sft.parquet``, ``train.parquet`` and ``test.parquet`` under ``out_dir`` (kwargs go to
    `make_tool_arithmetic_rows`); returns the train and test paths (the warm start finds sft.parquet beside
    them)."""
    out = Path(out_dir).expanduser()
    rows = make_tool_arithmetic_rows(**kwargs)
    write_rows(out / "sft.parquet", rows["sft"])
    return write_rows(out / "train.parquet", rows["train"]), write_rows(out / "test.parquet", rows["test"])
