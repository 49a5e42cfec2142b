"""The built-in ``a+b=`` task: small enough for a tiny model to learn on a CPU, with an honest held-out split.

The split is made on the *unordered* operand pair so that ``3+5`` and ``5+3`` are always on the same
side: otherwise a model could score on the test set by memorising the commuted training example,
and held-out accuracy would not measure generalisation.
"""

from __future__ import annotations

import hashlib
import operator
import random
from pathlib import Path
from typing import Any

from verl.data.io import write_rows

DATA_SOURCE = "arithmetic"

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _held_out(a: int, b: int, seed: int, holdout_frac: float) -> bool:
    """Stable (process- and platform-independent) coin flip for the unordered pair {a, b}."""
    lo, hi = min(a, b), max(a, b)
    digest = hashlib.sha256(f"verl-arithmetic:{seed}:{lo}:{hi}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < holdout_frac


def make_arithmetic_rows(
    max_operand: int = 30, holdout_frac: float = 0.2, seed: int = 0, op: str = "+"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every ordered pair ``0 <= a, b <= max_operand`` as verl-schema rows, split into (train, test).

    About ``holdout_frac`` of the unordered pairs go to test; which ones depends only on the pair and
    ``seed``, so growing ``max_operand`` never moves an existing pair across the split.
    """
    if op not in OPS:
        raise ValueError(f"unknown arithmetic op {op!r}; choose one of {sorted(OPS)}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if not 0.0 <= holdout_frac <= 1.0:
        raise ValueError(f"holdout_frac must be in [0, 1], got {holdout_frac}")
    fn = OPS[op]
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            split = "test" if _held_out(a, b, seed, holdout_frac) else "train"
            rows = splits[split]
            question = f"{a}{op}{b}="
            answer = str(fn(a, b))
            rows.append(
                {
                    "data_source": DATA_SOURCE,
                    "prompt": [{"role": "user", "content": question}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": answer},
                    "extra_info": {
                        "split": split,
                        "index": len(rows),
                        "a": a,
                        "b": b,
                        "answer": answer,
                        "question": question,
                    },
                }
            )
    # Rows are stored in a seeded random order, so the first N of a file (``train_max_samples``) are a
    # uniform sample of the pairs rather than the ones with the smallest first operand.
    for split, rows in splits.items():
        random.Random(f"{seed}:{split}").shuffle(rows)
        for i, row in enumerate(rows):
            row["extra_info"]["index"] = i
    return splits["train"], splits["test"]


def write_arithmetic_dataset(out_dir: str | Path, **kwargs: Any) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out_dir``; kwargs go to `make_arithmetic_rows`."""
    out = Path(out_dir).expanduser()
    train_rows, test_rows = make_arithmetic_rows(**kwargs)
    return write_rows(out / "train.parquet", train_rows), write_rows(out / "test.parquet", test_rows)
