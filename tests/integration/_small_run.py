"""The overrides every small integration run starts from: the tiny model, the arithmetic files, 4 prompts a
step, 8 validation prompts and 6-token responses."""

from __future__ import annotations

from typing import Any


def small_run(model_dir: Any, files: tuple[Any, Any]) -> list[str]:
    train, test = files
    return [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=4",
        "data.val_max_samples=8",
        "data.max_response_length=6",
        f"actor_rollout_ref.model.path={model_dir}",
    ]
