"""Optimizer and learning-rate schedule, shared by the actor, the critic and SFT."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from verl.config.schema import OptimConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW from an ``optim`` config section (lr, weight_decay, betas), over the parameters that train.

    Frozen ones (``requires_grad=False``: a LoRA model's base weights) are left out, so the optimizer
    keeps no state for them and its checkpoint holds the adapters' only.
    """
    betas = tuple(optim.betas)
    trained = [p for p in params if p.requires_grad]
    return torch.optim.AdamW(
        trained, lr=optim.lr, weight_decay=optim.weight_decay, betas=betas, foreach=False
    )


def clip_and_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float
) -> tuple[float, bool]:
    """Clip the gradient norm and take the optimizer step, unless the norm is not finite.

    A NaN or infinite gradient would poison the weights, so that step is skipped (gradients cleared).
    Returns the norm before clipping and whether the step was taken.
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip).item()
    if math.isfinite(grad_norm):
        optimizer.step()
        return grad_norm, True
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, False


def record_optimizer_step(
    metrics: dict[str, list[float]], prefix: str, grad_norm: float, stepped: bool
) -> None:
    """Log one optimizer step: ``<prefix>/skipped_steps`` counts skipped ones (summed by
    :func:`summarize_metrics`), ``<prefix>/grad_norm`` averages the finite norms only (a skipped step's
    NaN would poison the mean)."""
    metrics[f"{prefix}/skipped_steps"].append(0.0 if stepped else 1.0)
    if math.isfinite(grad_norm):
        metrics[f"{prefix}/grad_norm"].append(grad_norm)


def summarize_metrics(metrics: dict[str, list[float]]) -> dict[str, float]:
    """One value per metric over the mini-batches of an update: the mean, except counts, which add up."""
    return {
        k: float(sum(v) if k.endswith("skipped_steps") else sum(v) / len(v)) for k, v in metrics.items() if v
    }


def num_warmup_steps(optim: OptimConfig, total_steps: int) -> int:
    """``lr_warmup_steps`` when set (>= 0), otherwise ``lr_warmup_steps_ratio`` of the total, as in verl."""
    steps = optim.lr_warmup_steps
    if steps is not None and steps >= 0:
        return int(steps)
    return int(optim.lr_warmup_steps_ratio * total_steps)


def lr_multiplier(
    step: int, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Linear warm-up to 1, then constant or cosine decay to ``min_lr_ratio``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_scheduler_type {schedule!r}; choose constant or cosine")


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = num_warmup_steps(optim, total_steps)
    schedule = optim.lr_scheduler_type
    min_lr_ratio = optim.min_lr_ratio
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, warmup, total_steps, schedule, min_lr_ratio)
    )
