"""GSM8K (``openai/gsm8k``, config ``main``) in verl's row format, as verl's ``examples/data_preprocess/gsm8k.py``
writes it.

The prompt is the question plus an instruction to end with ``#### <answer>``: the strict GSM8K scorer
(:mod:`verl.workers.reward.scorers.gsm8k`) only finds an answer written that way, so the instruction is
what makes the reward learnable.
"""

from __future__ import annotations

import re

from verl.data.io import DatasetError
from verl.data.preprocess.spec import DatasetSpec, Row, passthrough, text_column

DATA_SOURCE = "openai/gsm8k"

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
"""verl's instruction text, appended to the question after one space."""

COLUMNS = ("question", "answer")

# GSM8K references end with "#### <number>"; the number may carry thousands separators ("#### 1,234").
_FINAL_ANSWER = re.compile(r"#### \$?(-?[0-9.,]+)")


def extract_answer(answer_text: str) -> str | None:
    """The final answer of a GSM8K reference solution: the number after ``#### ``, commas removed.

    ``"...so she has 72 left.\\n#### 72"`` -> ``"72"``; None when the text has no ``#### <number>``.
    """
    match = _FINAL_ANSWER.search(answer_text)
    return None if match is None else match.group(1).replace(",", "")


def make_row(raw: Row, split: str, index: int, where: str) -> Row:
    """One verl row from a GSM8K row; the raw question and full solution are kept in ``extra_info``."""
    question = text_column(raw, "question", where, COLUMNS)
    answer = text_column(raw, "answer", where, COLUMNS)
    ground_truth = extract_answer(answer)
    if ground_truth is None:
        raise DatasetError(f"{where}: column 'answer' has no final '#### <number>' line: {answer[-80:]!r}")
    return {
        **passthrough(raw, COLUMNS),
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


SPEC = DatasetSpec(
    name="gsm8k",
    data_source=DATA_SOURCE,
    columns=COLUMNS,
    make_row=make_row,
    default_save_dir="~/data/gsm8k",
    hub_subdirs=("main",),
)
