"""User code written for verl imports unchanged: its extension points at verl's own import paths
(issue 14, first part) are thin re-exports of ours, so what they register is what the trainer uses."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_core_algos_computes_and_registers_like_verl():
    from verl.trainer.ppo import core_algos

    # GRPO on one group of two responses with outcome rewards 1 and 0 (on their last tokens):
    # mean 0.5, unbiased std 0.7071, so advantages +-0.7071 on every response token.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    adv, returns = core_algos.compute_grpo_outcome_advantage(rewards, mask, np.array(["g", "g"]))
    assert torch.allclose(adv[:, 0], torch.tensor([0.7071, -0.7071]), atol=1e-4)
    assert torch.equal(adv, returns)
    assert core_algos.agg_loss(torch.tensor([[1.0, 3.0]]), torch.ones(1, 2), "token-mean").item() == 2.0

    @core_algos.register_adv_est("verl_user_estimator_for_test")
    def user_estimator(token_level_rewards, response_mask, config=None, **kwargs):
        return token_level_rewards, token_level_rewards

    from verl.algorithms import get_adv_estimator_fn

    assert get_adv_estimator_fn("verl_user_estimator_for_test") is user_estimator  # the trainer sees it
    del core_algos.ADV_ESTIMATOR_REGISTRY["verl_user_estimator_for_test"]


def test_a_worker_written_for_verl_runs_on_our_controller():
    from verl import Controller, Role
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register

    class Doubler(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def double(self, x):
            return 2 * x

    with Controller() as controller:
        controller.register_role(Role("doubler", worker_class=Doubler))
        assert controller.step(role="doubler", method="double", inputs={"x": 21}, outputs=["y"])["y"].get(
            timeout=30
        ) == [42]


@pytest.mark.parametrize(("answer", "score"), [("12", 1.0), ("13", 0.0)])
def test_default_compute_score_at_verls_path(answer, score):
    from verl.utils.reward_score import default_compute_score

    result = default_compute_score("arithmetic", answer, "12")
    assert (result["score"] if isinstance(result, dict) else result) == score
