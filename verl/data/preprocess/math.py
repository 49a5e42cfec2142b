"""MATH (``DigitalLearningGmbH/MATH-lighteval``, the hub copy of the retired ``lighteval/MATH``) in verl's row
format, as verl's ``examples/data_preprocess/math_dataset.py`` writes it.

The ground truth is the content of the solution's last ``\\boxed{}``, and the prompt asks for the answer
in a box: the MATH scorer (:mod:`verl.workers.reward.scorers.math_reward`) compares exactly those two, so
both sides use its one box extraction.
"""

from __future__ import annotations

from verl.data.io import DatasetError
from verl.data.preprocess.spec import DatasetSpec, Row, passthrough, text_column
from verl.workers.reward.scorers.math_reward import last_boxed_answer

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""verl's instruction text (one backslash before ``boxed``), appended to the problem after one space."""

COLUMNS = ("problem", "solution")


def make_row(raw: Row, split: str, index: int, where: str) -> Row:
    """One verl row from a MATH row. Other columns (``level``, ``type``) are kept as columns, as verl does;
    ``extra_info`` holds only the split and index (verl keeps neither the problem nor the solution there)."""
    problem = text_column(raw, "problem", where, COLUMNS)
    solution = text_column(raw, "solution", where, COLUMNS)
    ground_truth = last_boxed_answer(solution)
    if ground_truth is None:
        raise DatasetError(
            f"{where}: column 'solution' has no \\boxed{{...}} answer (or its braces do not close): "
            f"{solution[-80:]!r}"
        )
    return {
        **passthrough(raw, COLUMNS),
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index},
    }


SPEC = DatasetSpec(
    name="math",
    data_source=DATA_SOURCE,
    columns=COLUMNS,
    make_row=make_row,
    default_save_dir="~/data/math",
    hub_subdirs=("data", "default"),
)
