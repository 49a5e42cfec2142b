"""Where ``actor/entropy`` comes from (`verl.trainer.advantage.entropy_source`): the old-log-prob pass, else the
rollout's entropies when they are the current policy's, else the update measures it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.advantage import compute_advantages, entropy_source
from verl.workers.rollout.base import ROLLOUT_ENTROPY_KEY

MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
ROLLOUT = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]])
"""three real tokens: token-mean (1 + 2 + 4) / 3; seq-mean-token-mean (1.5 + 4) / 2"""


def generated(with_entropies: bool = True) -> DataProto:
    tensors = {
        "response_mask": MASK,
        "token_level_scores": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
    }
    if with_entropies:
        tensors[ROLLOUT_ENTROPY_KEY] = ROLLOUT
    return DataProto.from_dict(tensors, non_tensors={"uid": np.array(["a", "a"], dtype=object)})


def plan(entropy_from_rollout: bool, mode: str = "token-mean") -> SimpleNamespace:
    algorithm = SimpleNamespace(
        adv_estimator="grpo", gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True,
        rollout_correction=SimpleNamespace(bypass_mode=False),
    )  # fmt: skip
    return SimpleNamespace(
        entropy_from_rollout=entropy_from_rollout, loss_agg_mode=mode, loss_scale_factor=None,
        old_log_probs="not_needed", kl_ctrl=None, algorithm=algorithm,
    )  # fmt: skip


@pytest.mark.parametrize(("mode", "expected"), [("token-mean", 7 / 3), ("seq-mean-token-mean", 2.75)])
def test_the_rollouts_entropies_give_actor_entropy_and_stay_in_the_batch(mode, expected):
    out = compute_advantages(generated(), plan=plan(True, mode))
    assert out["metrics"]["actor/entropy"] == pytest.approx(expected)
    # left in the batch: the update reads that actor/entropy is measured and needs no pass for it
    assert torch.equal(out["batch"].batch[ROLLOUT_ENTROPY_KEY], ROLLOUT)


def test_an_older_policys_entropies_are_dropped_and_the_update_measures_it():
    out = compute_advantages(generated(), plan=plan(False))
    assert "actor/entropy" not in out["metrics"] and ROLLOUT_ENTROPY_KEY not in out["batch"].batch
    out = compute_advantages(generated(with_entropies=False), plan=plan(True))
    assert "actor/entropy" not in out["metrics"]


def test_the_old_log_prob_pass_is_the_source_when_there_is_one():
    batch = generated()
    old = DataProto.from_dict({"old_log_probs": -ROLLOUT, "entropys": torch.full((2, 3), math.log(2.0))})
    assert torch.equal(entropy_source(batch, old, plan(True)), old.batch["entropys"])
    assert ROLLOUT_ENTROPY_KEY not in batch.batch
