"""Built-in tasks: functions that write a (train, test) pair of verl-schema dataset files.

A task writer has the signature ``writer(out_dir, **kwargs) -> (train_path, test_path)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from verl.data.tasks.arithmetic import make_arithmetic_rows, write_arithmetic_dataset
from verl.data.tasks.reasoning_gym import write_reasoning_gym_dataset
from verl.data.tasks.tool_arithmetic import write_tool_arithmetic_dataset

TaskWriter = Callable[..., tuple[Path, Path]]

TASKS: dict[str, TaskWriter] = {
    "arithmetic": write_arithmetic_dataset,
    "reasoning_gym": write_reasoning_gym_dataset,  # prepare.task_kwargs: task, size, seed, config, ...
    "tool_arithmetic": write_tool_arithmetic_dataset,  # 4-digit sums with calculator demonstrations
}


ROW_FORMATS: dict[str, int] = {
    "reasoning_gym": 2,  # 2: ground_truth is the plain answer, the task's record in extra_info.reasoning_gym
}
"""a task's row layout version, when it changed: part of its cached files' key, so a change rebuilds them"""


__all__ = ["ROW_FORMATS", "TASKS", "make_arithmetic_rows", "write_arithmetic_dataset"]
