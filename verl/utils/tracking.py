"""Where metrics go: the console (a progress bar), a JSONL file, and optionally TensorBoard / W&B."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

# The handful of numbers shown on the progress bar; everything goes to the other sinks.
CONSOLE_KEYS = {
    "critic/score/mean": "score",
    "actor/pg_loss": "pg_loss",
    "response_length/mean": "resp_len",
    "timing_s/step": "step_s",
}


def validation_postfix(metrics: dict[str, float]) -> dict[str, float]:
    """The validation number for the progress bar: ``val_acc`` (the first data source's
    ``val-core/<source>/acc/mean@n``) when the scorer reports an accuracy, else ``val_reward`` (its
    ``val-core/<source>/reward/mean@n``); nothing when the metrics hold no validation."""
    for name in ("acc", "reward"):
        for key, value in metrics.items():
            parts = key.rsplit("/", 2)  # a data source may hold "/" itself (openai/gsm8k)
            if len(parts) != 3:
                continue
            source, metric, stat = parts
            if source.startswith("val-core/") and metric == name and stat.startswith("mean@"):
                return {f"val_{name}": value}
    return {}


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class Tracking:
    """Fan metrics out to the configured loggers: ``console``, ``jsonl``, ``tensorboard``, ``wandb``."""

    def __init__(
        self,
        loggers: list[str],
        output_dir: str | Path,
        total_steps: int,
        project_name: str = "verl",
        experiment_name: str = "default",
        config: dict | None = None,
        initial_step: int = 0,
        desc: str = "train",
    ) -> None:
        unknown = set(loggers) - {"console", "jsonl", "tensorboard", "wandb"}
        if unknown:
            raise ValueError(
                f"unknown trainer.logger {sorted(unknown)}; choose console, jsonl, tensorboard, wandb"
            )
        self.output_dir = Path(output_dir).expanduser()
        self.progress = None
        self.jsonl = None
        self.tensorboard = None
        self.wandb = None
        if "console" in loggers:
            self.progress = tqdm(
                total=total_steps, initial=initial_step, desc=desc, file=sys.stderr, dynamic_ncols=True
            )
        if "jsonl" in loggers:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.jsonl = open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(self.output_dir / "tensorboard"))
        if "wandb" in loggers:
            import wandb

            self.wandb = wandb.init(project=project_name, name=experiment_name, config=config)

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / "metrics.jsonl"

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.jsonl is not None:
            record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.progress is not None:
            numbers = {label: metrics[key] for key, label in CONSOLE_KEYS.items() if key in metrics}
            numbers.update(validation_postfix(metrics))
            shown = {label: f"{value:.3g}" for label, value in numbers.items()}
            self.progress.set_postfix(shown, refresh=False)
            self.progress.update(max(0, step - self.progress.n))

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        if self.progress is not None:
            self.progress.write(message)
        else:
            print(message, file=sys.stderr)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
