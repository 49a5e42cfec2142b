"""Which response tokens a reward reads and where it goes: the trained tokens (``response_mask``), the whole
trajectory a scorer judges (in a multi-turn rollout the inserted tool outputs too), and each row's last trained
token, where the outcome reward is written. Used by the reward managers, the reward model and the trainer.
"""

from __future__ import annotations

from typing import Any

import torch


def response_mask(data: Any) -> torch.Tensor:
    """Which response tokens are valid (bool, shaped like ``responses``): ``response_mask``, else the response
    part of ``attention_mask``, else all of them."""
    batch = data.batch
    responses = batch["responses"]
    if "response_mask" in batch:
        mask = batch["response_mask"]
    elif "attention_mask" in batch:
        mask = batch["attention_mask"][:, -responses.shape[-1] :]
    else:
        mask = torch.ones_like(responses)
    if mask.shape != responses.shape:
        raise ValueError(f"response mask shape {tuple(mask.shape)} != responses {tuple(responses.shape)}")
    return mask.bool()


def trajectory_mask(data: Any, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Which response tokens make up the response as a whole (bool, shaped like ``responses``): every token the
    model saw, i.e. the response part of ``attention_mask``, plus the trained tokens ``mask`` (by default
    :func:`response_mask`). In a multi-turn rollout that includes the inserted tool / user tokens, whose
    ``response_mask`` is 0 but which are part of the trajectory a scorer judges (verl decodes the response up
    to the attention mask's length); in a single-turn batch the two masks are the same."""
    mask = response_mask(data) if mask is None else mask.bool()
    attention = data.batch["attention_mask"] if "attention_mask" in data.batch else None
    if attention is not None and attention.shape[-1] >= mask.shape[-1]:
        mask = mask | attention[:, -mask.shape[-1] :].bool()
    return mask


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last position where ``mask`` is set, 0 for a row without one: where the outcome reward goes.
    With ``response_mask`` that is the last sampled token, also when inserted (masked) tokens follow it:
    the advantage estimators skip masked tokens, so a reward on one would be lost."""
    index = torch.arange(mask.shape[-1], device=mask.device)
    return torch.where(mask.bool(), index, -1).max(-1).values.clamp_min(0)
