"""reasoning-gym tasks (``gsm_symbolic``, ``basic_arithmetic``, ``chain_sum``, ``countdown``, any of its
datasets) generated into verl's train/test parquet files, scored by reasoning-gym's own verifiers.

Rows are generated, not read: ``create_dataset(task, size=, seed=)`` gives entries with a question, an
answer and metadata. Each row's prompt is the question plus :data:`INSTRUCTION` (answer inside
``<answer></answer>``), its ``reward_model.ground_truth`` is the plain answer (``"288"``: what verl's reward
functions compare a response with), and its ``extra_info["reasoning_gym"]`` is JSON text holding the task,
its config, the whole entry and the answer format, which :mod:`verl.workers.reward.scorers.reasoning_gym`
hands back to the task's ``score_answer``.

The test split never shares a problem with the train split. Most tasks seed entry ``i`` with
``seed + i``, so the test entries come from the seeds right after the train ones (``test_seed`` defaults
to ``seed + size``); on top of that any test entry whose question text is also in train, or repeats an
earlier test entry, is dropped (counted), and more are generated to fill ``test_size``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from verl.data.io import DatasetError
from verl.data.preprocess.pipeline import WrittenSplit, check_outputs, write_split
from verl.data.preprocess.spec import Row
from verl.errors import InputError
from verl.workers.reward.scorers.reasoning_gym import (
    ANSWER_FORMATS,
    DATA_SOURCE_PREFIX,
    TAG_INSTRUCTION,
    TASK_KEY,
    answer_text,
    import_reasoning_gym,
    make_task_record,
)

NAME = "reasoning_gym"
"""The dataset name on the command line: ``python -m verl.data.preprocess reasoning_gym --task T``."""

INSTRUCTION = TAG_INSTRUCTION
"""Appended to each question of the default ``tag`` format after a blank line (see ``ANSWER_FORMATS``)."""

DEFAULT_SAVE_DIR = "~/data/reasoning_gym/{task}"
DEFAULT_SIZE = 1000
DEFAULT_SEED = 42

_CANDIDATES_PER_TEST_ROW = 2
"""Held-out entries generated per requested test row, so dropped overlaps can be replaced."""


@dataclass(frozen=True)
class GeneratedSplits:
    """Rows per split, and how many generated test entries were dropped as repeats of a train (or earlier
    test) question."""

    rows: dict[str, list[Row]]
    dropped: int = 0


def data_source(task: str) -> str:
    """``reasoning_gym/<task>``: the scorer dispatch and the validation metrics are keyed by it."""
    return f"{DATA_SOURCE_PREFIX}{task}"


def default_test_size(size: int) -> int:
    """A tenth of the train size, at least one row."""
    return max(1, size // 10)


@dataclass(frozen=True)
class TaskSet:
    """One generated reasoning-gym dataset and what made it: ``create_dataset(task, size=, seed=, **config)``."""

    task: str
    size: int
    seed: int
    config: dict[str, Any]
    dataset: Any
    answer_format: str = "tag"

    def row(self, source_index: int, split: str, index: int) -> Row:
        """Row ``index`` of ``split`` from entry ``source_index``: the plain answer as its ground truth, and in
        ``extra_info`` how to generate the entry again and the task record the built-in scorer reads."""
        entry = self.dataset[source_index]
        where = f"reasoning-gym task {self.task!r} (seed {self.seed}, size {self.size}) entry {source_index}"
        question = entry.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{where}: its question must be non-empty text, got {question!r:.80}")
        try:
            record = make_task_record(self.task, entry, self.config, self.answer_format)
        except ValueError as error:
            raise DatasetError(f"{where}: {error}") from None
        answer = entry.get("answer")
        return {
            "data_source": data_source(self.task),
            "prompt": [
                {"role": "user", "content": ANSWER_FORMATS[self.answer_format][0].format(question=question)}
            ],
            "ability": getattr(self.dataset, "category", "reasoning"),
            "reward_model": {"style": "rule", "ground_truth": answer_text(entry)},
            "extra_info": {
                "split": split,
                "index": index,
                "task": self.task,
                "seed": self.seed,
                "size": self.size,
                "source_index": source_index,
                "question": question,
                "answer": None if answer is None else str(answer),
                TASK_KEY: record,  # what the built-in scorer needs: task, config, entry, answer format
            },
        }


def build_task(
    task: str, size: int, seed: int, config: dict[str, Any], answer_format: str = "tag"
) -> TaskSet:
    """reasoning-gym's dataset for ``task``; an unknown task or answer format, or a rejected config, is an
    InputError."""
    if answer_format not in ANSWER_FORMATS:
        close = get_close_matches(answer_format, list(ANSWER_FORMATS), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise InputError(f"--answer_format {answer_format!r} is not one of {', '.join(ANSWER_FORMATS)}{hint}")
    try:
        rg = import_reasoning_gym(f"python -m verl.data.preprocess {NAME}")
    except ImportError as error:
        raise InputError(str(error)) from None
    known = sorted(rg.factory.DATASETS)
    if task not in known:
        close = get_close_matches(task, known, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise InputError(f"--task {task!r} is not a reasoning-gym dataset{hint} (known: {', '.join(known)})")
    if task == "composite":
        raise InputError(
            "--task composite (reasoning-gym's mix of tasks) is not supported: generate each task on its own "
            "and list the files in data.train_files / data.val_files (each keeps its data_source and metrics)"
        )
    for key in ("size", "seed"):
        if key in config:
            raise InputError(f"--task_config sets {key!r}; give it with --{key} (and --test_{key})")
    try:
        dataset = rg.create_dataset(task, size=size, seed=seed, **config)
    except Exception as error:  # the config's fault (a bad field, a failed check), or the task's
        raise InputError(
            f"--task_config {config}: reasoning-gym cannot build task {task!r} with it: "
            f"{type(error).__name__}: {error}"
        ) from None
    return TaskSet(task, size, seed, config, dataset, answer_format)


def generate_splits(
    task: str,
    size: int,
    seed: int,
    *,
    test_size: int | None = None,
    test_seed: int | None = None,
    task_config: dict[str, Any] | None = None,
    answer_format: str = "tag",
) -> GeneratedSplits:
    """``size`` train rows from seed ``seed`` and up to ``test_size`` test rows (default: a tenth) from
    ``test_seed`` (default ``seed + size``), no test question equal to a train one; ``test_size=0`` makes
    no test split."""
    config = dict(task_config or {})
    test_size = default_test_size(size) if test_size is None else test_size
    test_seed = seed + size if test_seed is None else test_seed
    if size < 1 or test_size < 0:
        raise InputError(f"--size must be at least 1 and --test_size at least 0, got {size} and {test_size}")
    train_set = build_task(task, size, seed, config, answer_format)
    rows = {"train": [train_set.row(i, "train", i) for i in range(size)]}
    if test_size == 0:
        return GeneratedSplits(rows)
    test_set = build_task(task, test_size * _CANDIDATES_PER_TEST_ROW, test_seed, config, answer_format)
    seen = {row["extra_info"]["question"].strip() for row in rows["train"]}
    test: list[Row] = []
    dropped = 0
    for i in range(test_set.size):
        if len(test) == test_size:
            break
        row = test_set.row(i, "test", len(test))
        question = row["extra_info"]["question"].strip()
        if question in seen:
            dropped += 1
            continue
        seen.add(question)
        test.append(row)
    if not test:
        raise DatasetError(
            f"reasoning-gym task {task!r}: all {dropped} generated test entries repeat a train question; the "
            "task has too few distinct problems for a held-out split (try another --task_config or --test_size 0)"
        )
    rows["test"] = test
    return GeneratedSplits(rows, dropped)


def save_dir_for(task: str, local_save_dir: str | os.PathLike | None) -> Path:
    """``local_save_dir``, or ``~/data/reasoning_gym/<task>``."""
    return Path(local_save_dir or DEFAULT_SAVE_DIR.format(task=task)).expanduser()


def write_splits(save_dir: Path, generated: GeneratedSplits) -> list[WrittenSplit]:
    """Write each split as ``<split>.parquet`` under ``save_dir``."""
    return [
        WrittenSplit(split, write_split(save_dir / f"{split}.parquet", rows), len(rows))
        for split, rows in generated.rows.items()
    ]


def preprocess_reasoning_gym(
    task: str,
    size: int,
    seed: int,
    local_save_dir: str | os.PathLike | None = None,
    *,
    test_size: int | None = None,
    test_seed: int | None = None,
    task_config: dict[str, Any] | None = None,
    answer_format: str = "tag",
    overwrite: bool = False,
) -> tuple[list[WrittenSplit], GeneratedSplits]:
    """Generate ``task``'s splits (see :func:`generate_splits`) and write them; returns what was written and
    the generated rows. Existing train/test files are kept unless ``overwrite``."""
    save_dir = save_dir_for(task, local_save_dir)
    check_outputs(save_dir, {}, overwrite)
    generated = generate_splits(
        task,
        size,
        seed,
        test_size=test_size,
        test_seed=test_seed,
        task_config=task_config,
        answer_format=answer_format,
    )
    return write_splits(save_dir, generated), generated
