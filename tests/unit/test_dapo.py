"""DAPO's pieces: the overlong penalty and the dynamic-sampling group filter, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.step import varied_groups
from verl.workers.reward.dapo import DAPORewardManager, overlong_penalty


def test_overlong_penalty_ramp():
    # max 8, buffer 4 -> no penalty up to 4 tokens, then -(L-4)/4: 5 -> -0.25, 8 -> -1.0
    lengths = torch.tensor([3, 4, 5, 8])
    assert overlong_penalty(lengths, 8, 4, 1.0).tolist() == pytest.approx([0.0, 0.0, -0.25, -1.0])
    assert overlong_penalty(lengths, 8, 4, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.125, -0.5])


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i) for i in ids)


def test_dapo_manager_adds_penalty_at_last_token():
    buffer = OmegaConf.create({"enable": True, "len": 2, "penalty_factor": 1.0})
    manager = DAPORewardManager(
        CharTokenizer(), compute_score=lambda **kw: 1.0, max_resp_len=4, overlong_buffer=buffer
    )
    data = DataProto.from_dict(
        tensors={
            "responses": torch.tensor([[1, 2, 0, 0], [1, 2, 3, 4]]),
            "response_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]),
        },
        non_tensors={
            "data_source": ["x", "x"],
            "reward_model": [{"ground_truth": "1"}, {"ground_truth": "1"}],
        },
    )
    out = manager(data, return_dict=True)
    # sample 0: length 2 <= 4 - 2 -> score 1 at position 1; sample 1: length 4 -> 1 - (4-2)/2 = 0 at position 3
    assert out["reward_tensor"].tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert out["reward_extra_info"]["overlong"] == [False, True]
    with pytest.raises(ValueError, match="overlong_buffer.len"):
        DAPORewardManager(
            CharTokenizer(), max_resp_len=4, overlong_buffer=OmegaConf.create({"enable": True, "len": 4})
        )


def test_varied_groups_drops_uniform_groups():
    # groups a: (1, 0) varied -> kept; b: (1, 1) uniform -> dropped; c: (0, 0.5) varied -> kept
    scores = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0], [0.5]])
    data = DataProto.from_dict(
        tensors={"token_level_scores": scores},
        non_tensors={"uid": np.array(list("aabbcc"), dtype=object), "acc": [1, 0, 1, 1, 0, 0]},
    )
    kept = varied_groups(data, "seq_reward")
    assert list(kept.non_tensor_batch["uid"]) == ["a", "a", "c", "c"]
    # by the reward's own acc field, group c is uniform (0, 0)
    assert list(varied_groups(data, "acc").non_tensor_batch["uid"]) == ["a", "a"]
    with pytest.raises(ValueError, match="filter_groups.metric"):
        varied_groups(data, "nope")
