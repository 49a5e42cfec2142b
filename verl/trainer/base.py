"""``BaseTrainer``: one training step over a batch of tensors, with the loss left to a subclass.

A batch is a dict of tensors sharing dim 0 (rows), in the layout of seed 001's snippet:

* ``input_ids`` ``(rows, seq_len)``: prompt and response, one sequence per row (padding anywhere the
  ``attention_mask`` says: left, right or none);
* ``attention_mask`` ``(rows, seq_len)``: 1 on real tokens;
* ``prompt_mask`` ``(rows, seq_len)``: 1 on prompt tokens, so the response is ``attention_mask`` and not
  ``prompt_mask``;
* anything else a loss needs, e.g. ``reward`` ``(rows,)``.

:meth:`BaseTrainer.step` runs :meth:`~BaseTrainer.prepare` once (no gradients: old log-probs, values,
advantages ...), then, ``epochs`` times, one optimizer step per mini-batch of ``mini_batch_size`` rows:
:meth:`~BaseTrainer.compute_loss` → backward → each model's gradient norm clipped → step. A subclass
overrides ``compute_loss`` (and ``prepare`` when it needs per-step quantities); :class:`verl.trainer.ppo.
PPOTrainer` is one. Per-token tensors here are ``(rows, seq_len - 1)``: entry ``t`` is about token
``t + 1``, which the model predicts from position ``t``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from verl.models.plumbing import position_ids

Batch = dict[str, torch.Tensor]

REQUIRED_KEYS = ("input_ids", "attention_mask", "prompt_mask")


def check_batch(batch: Mapping[str, Any]) -> Batch:
    """The batch as a dict, after checking the keys every loss needs and that all tensors share their rows."""
    missing = [key for key in REQUIRED_KEYS if key not in batch]
    if missing:
        raise KeyError(
            f"the batch lacks {', '.join(missing)}: a batch holds input_ids, attention_mask and prompt_mask "
            f"(rows x seq_len; prompt_mask is 1 on prompt tokens), plus what the loss reads; got {sorted(batch)}"
        )
    rows = batch["input_ids"].shape[0]
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != rows:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"batch[{key!r}] must be a tensor with {rows} rows (one per sequence); got {shape}"
            )
    for key in ("attention_mask", "prompt_mask"):
        if batch[key].shape != batch["input_ids"].shape:
            raise ValueError(
                f"batch[{key!r}] has shape {tuple(batch[key].shape)}, input_ids {tuple(batch['input_ids'].shape)}"
            )
    if not response_mask(batch).any(dim=-1).all():
        raise ValueError("every row needs at least one response token (attention_mask 1, prompt_mask 0)")
    return dict(batch)


def response_mask(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``(rows, seq_len - 1)``: 1 where the predicted token (``t + 1``) is a real response token."""
    mask = batch["attention_mask"].bool() & ~batch["prompt_mask"].bool()
    return mask[:, 1:].float()


def model_outputs(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The model's first output (logits, or a value head's scores) at the positions that predict tokens
    1..seq_len-1: ``(rows, seq_len - 1, ...)``."""
    mask = batch["attention_mask"]
    out = model(
        input_ids=batch["input_ids"], attention_mask=mask, position_ids=position_ids(mask), use_cache=False
    )
    return out[0][:, :-1]


def token_log_probs(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``(rows, seq_len - 1)``: log p(token t+1 | tokens ≤ t) under ``model`` (a causal LM)."""
    logits = model_outputs(model, batch).float()
    targets = batch["input_ids"][:, 1:]
    return F.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


class BaseTrainer:
    """One optimizer over ``models`` (name -> module); :meth:`step` as described in the module doc.

    ``optimizer`` defaults to AdamW over every model at ``lr``. ``mini_batch_size`` (rows per optimizer
    step) None = the whole batch. ``grad_clip`` bounds each model's gradient norm separately; the norms
    before clipping are reported as ``<name>/grad_norm``.
    """

    def __init__(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizer: torch.optim.Optimizer | None = None,
        *,
        lr: float = 1e-6,
        epochs: int = 1,
        mini_batch_size: int | None = None,
        grad_clip: float = 1.0,
    ) -> None:
        if epochs < 1 or (mini_batch_size is not None and mini_batch_size < 1):
            raise ValueError(f"epochs and mini_batch_size must be >= 1; got {epochs} and {mini_batch_size}")
        self.models = dict(models)
        self.optimizer = optimizer or torch.optim.AdamW(
            [p for model in self.models.values() for p in model.parameters() if p.requires_grad], lr=lr
        )
        self.epochs, self.mini_batch_size, self.grad_clip = epochs, mini_batch_size, grad_clip

    def prepare(self, batch: Batch) -> Batch:
        """Per-step quantities, computed once before the updates (no gradients); default: none."""
        return batch

    def compute_loss(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The loss of one mini-batch: ``{"loss": scalar to minimise, ...more to report}``."""
        raise NotImplementedError(f"{type(self).__name__} must override compute_loss(batch)")

    def step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One training step; returns the mean over its mini-batches of what ``compute_loss`` returned."""
        batch = check_batch(batch)
        for model in self.models.values():
            model.eval()
        with torch.no_grad():
            batch = self.prepare(batch)
        for model in self.models.values():
            model.train()
        rows = batch["input_ids"].shape[0]
        size = self.mini_batch_size or rows
        logged: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.epochs):
            for start in range(0, rows, size):
                mini = {key: value[start : start + size] for key, value in batch.items()}
                losses = self.compute_loss(mini)
                self.optimizer.zero_grad(set_to_none=True)
                losses["loss"].backward()
                for name, model in self.models.items():
                    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
                    logged[f"{name}/grad_norm"].append(norm.item())
                self.optimizer.step()
                for key, value in losses.items():
                    logged[key].append(float(value.detach() if isinstance(value, torch.Tensor) else value))
        return {key: sum(values) / len(values) for key, values in logged.items()}
