"""reasoning-gym tasks as a built-in task of ``verl run`` (``prepare.task=reasoning_gym``): the same rows
``python -m verl.data.preprocess reasoning_gym`` writes, built into the run's cache instead of a directory
the user names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl.data.preprocess.reasoning_gym import DEFAULT_SEED, DEFAULT_SIZE, preprocess_reasoning_gym


def write_reasoning_gym_dataset(
    out_dir: str | Path,
    *,
    task: str,
    size: int = DEFAULT_SIZE,
    seed: int = DEFAULT_SEED,
    test_size: int | None = None,
    test_seed: int | None = None,
    config: dict[str, Any] | None = None,
    answer_format: str = "tag",
) -> tuple[Path, Path]:
    """Write ``train.parquet`` / ``test.parquet`` of reasoning-gym task ``task`` into ``out_dir`` (the keys are
    ``prepare.task_kwargs``: ``config`` is the task's own config, ``answer_format`` tag or number)."""
    _, generated = preprocess_reasoning_gym(
        task,
        size,
        seed,
        out_dir,
        test_size=test_size,
        test_seed=test_seed,
        task_config=dict(config or {}),
        answer_format=answer_format,
    )
    if "test" not in generated.rows:
        raise ValueError("prepare.task_kwargs.test_size=0: a run needs held-out rows for data.val_files")
    return Path(out_dir) / "train.parquet", Path(out_dir) / "test.parquet"
