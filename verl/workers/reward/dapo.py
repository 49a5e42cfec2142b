"""DAPO's reward manager: rule scores plus a soft penalty for responses that run into the length limit."""

from __future__ import annotations

from typing import Any

import torch

from verl.config.errors import ConfigError
from verl.workers.reward.manager import NaiveRewardManager, error_handling_kwargs, register_reward_manager
from verl.workers.reward.masks import last_positions, trajectory_mask


def overlong_penalty(
    response_length: torch.Tensor, max_resp_len: int, buffer_len: int, factor: float
) -> torch.Tensor:
    """Yu et al. 2025 (DAPO, arXiv 2503.14476), soft overlong punishment.

    With L_exp = max_resp_len − buffer_len: penalty = min(−(L − L_exp) / buffer_len · factor, 0), so 0 up
    to L_exp, then falling linearly to −factor at max_resp_len.
    """
    expected = max_resp_len - buffer_len
    return torch.clamp(-(response_length.float() - expected) / buffer_len * factor, max=0.0)


@register_reward_manager("dapo")
class DAPORewardManager(NaiveRewardManager):
    """``reward_model.reward_manager=dapo``: the naive manager's scores + the overlong penalty when enabled."""

    def __init__(
        self, *args: Any, max_resp_len: int | None = None, overlong_buffer: Any = None, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        self.overlong_buffer = overlong_buffer
        if overlong_buffer is not None and overlong_buffer.enable:
            if max_resp_len is None or not 0 < overlong_buffer.len < max_resp_len:
                raise ConfigError(
                    f"reward_model.overlong_buffer.len must be in [1, data.max_response_length) = [1, "
                    f"{max_resp_len}); got {overlong_buffer.len}"
                )
        self.max_resp_len = max_resp_len

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any, **kwargs: Any):
        return cls(
            tokenizer=tokenizer,
            num_examine=num_examine,
            compute_score=compute_score,
            max_resp_len=config.data.max_response_length,
            overlong_buffer=config.reward_model.overlong_buffer,
            **{**error_handling_kwargs(config), **kwargs},
        )

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        result = super().__call__(data, return_dict=True)
        buffer = self.overlong_buffer
        if buffer is not None and buffer.enable and "rm_scores" not in data.batch:
            # The length is the whole trajectory's (tool outputs included, as verl counts it); the penalty
            # goes where the score went, the last trained token.
            mask = self._response_mask(data)
            lengths = trajectory_mask(data, mask).sum(-1)
            penalty = overlong_penalty(lengths, self.max_resp_len, buffer.len, buffer.penalty_factor)
            last = last_positions(mask)
            rows = torch.arange(len(lengths))
            result["reward_tensor"][rows, last] += penalty
            result["reward_extra_info"]["overlong_reward"] = penalty.tolist()
            result["reward_extra_info"]["overlong"] = (lengths > self.max_resp_len - buffer.len).tolist()
        return result if return_dict else result["reward_tensor"]
