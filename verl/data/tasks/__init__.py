"""Built-in tasks: functions that write a (train, test) pair of verl-schema dataset files.

A task writer has the signature ``writer(out_dir, **kwargs) -> (train_path, test_path)``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl.data.io import read_rows, write_rows
from verl.data.tasks.arithmetic import make_arithmetic_rows, write_arithmetic_dataset

TaskWriter = Callable[..., tuple[Path, Path]]

TASKS: dict[str, TaskWriter] = {"arithmetic": write_arithmetic_dataset}


def _place(src: Path, dst: Path) -> None:
    """Move a freshly written file to ``dst``, converting format if ``dst`` is not parquet."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == dst.suffix:
        try:
            os.replace(src, dst)  # atomic when src and dst share a filesystem
            return
        except OSError:
            pass
    write_rows(dst, read_rows(src))  # also atomic: temp file next to dst, then rename


def prepare_task(name: str, train_path: str | Path, val_path: str | Path, **kwargs: Any) -> tuple[Path, Path]:
    """Make sure the task's train/val files exist at the given paths, generating whichever are missing.

    Existing files are left untouched (a user may have edited them); generation is deterministic for
    given kwargs so a file written now matches one written by an earlier run.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    train, val = Path(train_path).expanduser(), Path(val_path).expanduser()
    missing = [p for p in (train, val) if not p.exists()]
    if not missing:
        return train, val
    train.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".verl-task-{name}-", dir=train.parent))
    try:
        gen_train, gen_val = TASKS[name](tmp_dir, **kwargs)
        if not train.exists():
            _place(Path(gen_train), train)
        if not val.exists():
            _place(Path(gen_val), val)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return train, val


__all__ = ["TASKS", "make_arithmetic_rows", "prepare_task", "write_arithmetic_dataset"]
