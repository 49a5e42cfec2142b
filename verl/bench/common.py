"""What every section shares: the default recipe, the prompts, and a description of the machine."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RECIPE = "grpo"
"""The default recipe of ``verl run``: its sizes, sampling settings and task are the bench's."""

PROMPT_WIDTH_LIMIT = 1024
"""``data.max_prompt_length`` for the bench: only a filter (batches pad to their longest prompt), raised so
that chat templates with a system prompt (SmolLM2's) fit."""


def prompt_width(model_path: str | Path, response_length: int) -> int:
    """``PROMPT_WIDTH_LIMIT``, lowered so that prompt + response fit the model's positions (verl refuses more)."""
    import json

    positions = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings")
    return min(PROMPT_WIDTH_LIMIT, positions - response_length) if positions else PROMPT_WIDTH_LIMIT


def recipe_config(overrides: Sequence[str] = ()) -> Any:
    """The default recipe with ``overrides`` (raises ``ConfigError`` for values it refuses)."""
    from verl.config import load_config

    return load_config(RECIPE, list(overrides))


def write_task_data(out_dir: Path) -> tuple[Path, Path]:
    """The recipe's task (arithmetic, its ``prepare.task_kwargs``) as train / test parquet files."""
    from omegaconf import OmegaConf

    from verl.data import write_arithmetic_dataset

    return write_arithmetic_dataset(out_dir, **OmegaConf.to_container(recipe_config().prepare.task_kwargs))


def load_prompts(data_dir: str, tokenizer: Any, count: int) -> Any:
    """The first ``count`` training prompts (cycled if the file has fewer), chat-templated and left-padded
    to the longest, exactly as the trainer collates them."""
    from verl.data import RLDataset, collate_rl

    dataset = RLDataset(
        str(Path(data_dir) / "train.parquet"),
        tokenizer=tokenizer,
        prompt_key=recipe_config().data.prompt_key,
        max_prompt_length=PROMPT_WIDTH_LIMIT,
        truncation="error",
        max_samples=count,  # tokenizing the whole file would cost seconds per case
    )
    items = [dataset[i % len(dataset)] for i in range(count)]
    return collate_rl(items, tokenizer.pad_token_id)


def attn_implementation() -> str:
    return recipe_config().actor_rollout_ref.model.attn_implementation


def machine_info(threads: int) -> dict[str, Any]:
    """Versions and hardware: a number means little without them."""
    import torch
    import transformers

    import verl
    from verl.utils.cpu import read_cpuinfo

    return {
        "verl": verl.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16": read_cpuinfo().bf16_fast,  # avx512_bf16 or AMX: bf16 runs on hardware, not emulated
        "torch_threads": threads,
        "device": "cpu",
        "attn_implementation": attn_implementation(),
        "load_average_start": load_average(),
    }


def load_average() -> float | None:
    """1-minute load average: above the CPU count, other processes competed with the bench for the CPUs."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
