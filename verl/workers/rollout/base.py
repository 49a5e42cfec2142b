"""What every rollout engine shares: the registry and the layout of a generated batch.

An engine takes a DataProto of left-padded prompts (``input_ids``, ``attention_mask``,
``position_ids``) and returns one with ``prompts``, ``responses`` (right-padded to
``response_length`` with the pad token), ``response_mask`` (1 up to and including the first EOS),
and the full-sequence ``input_ids``, ``attention_mask``, ``position_ids`` the actor scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verl.config.errors import ConfigError
from verl.models.plumbing import position_ids
from verl.protocol import DataProto
from verl.utils.registry import Registry

ROLLOUT_REGISTRY = Registry("rollout engine (actor_rollout_ref.rollout.name)")


def register_rollout(name: str) -> Callable:
    return ROLLOUT_REGISTRY.register(name)


def get_rollout_class(name: str) -> Callable[..., Any]:
    return ROLLOUT_REGISTRY.lookup(name)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: read from ``rollout`` (training) or ``rollout.val_kwargs`` (validation)."""

    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 32

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(
                f"SamplingParams(do_sample=True, temperature={self.temperature}): sampling needs a "
                "temperature > 0; greedy decoding is do_sample=False"
            )

    @classmethod
    def from_config(cls, section: Any, max_new_tokens: int) -> SamplingParams:
        """``do_sample`` alone decides between sampling and greedy decoding: a temperature <= 0 with
        ``do_sample=true`` is refused (as config validation does) instead of silently decoding greedily."""
        if section.do_sample and not section.temperature > 0:
            raise ConfigError(
                f"temperature must be > 0 when do_sample=true; got {section.temperature} (temperature 0 is "
                "greedy decoding: set do_sample=false for it)"
            )
        return cls(
            bool(section.do_sample),
            float(section.temperature),
            float(section.top_p),
            int(section.top_k),
            max_new_tokens,
        )


def response_mask_from_ids(responses: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first EOS of each row, 0 after it."""
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device))
    # The number of EOS tokens strictly before position t; a token is valid while that is 0.
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()


def assemble_rollout_output(
    prompts: DataProto,
    responses: torch.Tensor,
    eos_token_ids: list[int],
    pad_token_id: int,
    response_length: int,
) -> DataProto:
    """Pad responses to ``response_length`` and build the full-sequence tensors the actor needs."""
    batch_size = responses.shape[0]
    if responses.shape[1] < response_length:
        pad = responses.new_full((batch_size, response_length - responses.shape[1]), pad_token_id)
        responses = torch.cat([responses, pad], dim=1)
    responses = responses[:, :response_length]
    response_mask = response_mask_from_ids(responses, eos_token_ids)
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_token_id))

    prompt_ids = prompts.batch["input_ids"]
    prompt_mask = prompts.batch["attention_mask"]
    attention_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    positions = position_ids(attention_mask)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": positions,
        }
    )
