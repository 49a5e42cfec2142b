"""Scoring decoded responses the way the trainer does, for the data tests."""

from __future__ import annotations

from typing import Any

import torch

from verl.data import RLDataset, collate_rl
from verl.protocol import DataProto
from verl.workers.reward import NaiveRewardManager


def score_with_manager(dataset: RLDataset, responses: list[str], tokenizer: Any) -> list[float]:
    """What the trainer does: collate prompts, append responses, and let NaiveRewardManager score them."""
    prompts = collate_rl([dataset[i] for i in range(len(responses))], pad_token_id=tokenizer.pad_token_id)
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in responses]
    width = max(map(len, ids))
    resp = torch.tensor([seq + [tokenizer.pad_token_id] * (width - len(seq)) for seq in ids])
    resp_mask = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq in ids])
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts.batch["input_ids"],
            "responses": resp,
            "input_ids": torch.cat([prompts.batch["input_ids"], resp], dim=1),
            "attention_mask": torch.cat([prompts.batch["attention_mask"], resp_mask], dim=1),
        },
        non_tensors=dict(prompts.non_tensor_batch),
    )
    reward = NaiveRewardManager(tokenizer)(batch)
    return reward.sum(dim=1).tolist()
