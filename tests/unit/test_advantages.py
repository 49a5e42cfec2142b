"""Every advantage estimator against small inputs whose expected outputs are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import verl.algorithms.advantages as adv_mod
from verl.algorithms.advantages import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn

T = torch.tensor

ESTIMATORS = {
    "gae": "compute_gae_advantage_return",
    "grpo": "compute_grpo_outcome_advantage",
    "grpo_passk": "compute_grpo_passk_outcome_advantage",
    "reinforce_plus_plus": "compute_reinforce_plus_plus_outcome_advantage",
    "reinforce_plus_plus_baseline": "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "remax": "compute_remax_outcome_advantage",
    "rloo": "compute_rloo_outcome_advantage",
    "opo": "compute_opo_outcome_advantage",
    "gpg": "compute_gpg_outcome_advantage",
}


def assert_close(actual: torch.Tensor, expected: list, tol: float = 1e-5) -> None:
    expected_t = T(expected)
    assert actual.shape == expected_t.shape
    assert actual.flatten().tolist() == pytest.approx(expected_t.flatten().tolist(), abs=tol)


def assert_whitened(adv: torch.Tensor, raw: list[float], mask: torch.Tensor) -> None:
    """adv on the masked positions == (raw - mean) / unbiased std, in row-major order; 0 elsewhere."""
    valid = adv[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert valid.std().item() == pytest.approx(1.0, abs=1e-4)
    raw_t = T(raw)
    assert valid.tolist() == pytest.approx(((raw_t - raw_t.mean()) / raw_t.std()).tolist(), abs=1e-4)
    assert adv[~mask.bool()].abs().sum().item() == 0.0


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_registered_under_verl_name(name):
    fn = getattr(adv_mod, ESTIMATORS[name])  # verl's function name, importable from the module
    assert ADV_ESTIMATOR_REGISTRY[name] is fn
    assert get_adv_estimator_fn(name) is fn


@pytest.mark.parametrize("name", sorted(set(ESTIMATORS) - {"grpo_passk"}))
def test_accepts_the_trainers_kwargs(name):
    # the trainer passes the same keyword set to every estimator; extras must be swallowed
    rewards, mask = T([[0.0, 1.0], [0.0, 0.0]]), T([[1.0, 1.0], [1.0, 0.0]])
    adv, ret = get_adv_estimator_fn(name)(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.array(["a", "b"], dtype=object),
        values=T([[0.5, 0.5], [0.5, 0.0]]),
        reward_baselines=T([0.0, 0.0]),
        gamma=1.0,
        lam=1.0,
        norm_adv_by_std_in_grpo=True,
        config=None,
    )
    assert adv.shape == ret.shape == (2, 2)
    assert adv[1, 1].item() == 0.0 and ret[1, 1].item() == 0.0


# ----------------------------------------------------------------------------- gae


def test_gae_gamma_lambda_one():
    gae = get_adv_estimator_fn("gae")
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = T([[0.5, 0.2, 0.4], [1.0, 0.5, 0.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(token_level_rewards=rewards, values=values, response_mask=mask, gamma=1.0, lam=1.0)
    # row 0: t2: δ = 1 + 0 - 0.4 = 0.6 -> A = 0.6
    #        t1: δ = 0 + 0.4 - 0.2 = 0.2 -> A = 0.2 + 0.6 = 0.8
    #        t0: δ = 0 + 0.2 - 0.5 = -0.3 -> A = -0.3 + 0.8 = 0.5
    #        returns = A + V = [1, 1, 1] (γ=λ=1: the reward-to-go)
    # row 1: t2 is padding: nextvalue and A stay 0
    #        t1: δ = 2 + 0 - 0.5 = 1.5 -> A = 1.5;  t0: δ = 0 + 0.5 - 1 = -0.5 -> A = -0.5 + 1.5 = 1.0
    #        returns = [2, 2, 0 (padding)]
    assert_close(ret, [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    assert_whitened(adv, [0.5, 0.8, 0.6, 1.0, 1.5], mask)


def test_gae_half_discount_skips_masked_tokens():
    gae = get_adv_estimator_fn("gae")
    rewards = T([[1.0, 0.0, 2.0], [0.0, 0.0, 1.0], [2.0, 0.0, 0.0]])
    values = T([[1.0, 1.0, 1.0], [0.5, 7.0, 0.5], [1.0, 3.0, 0.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    adv, ret = gae(token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.5, lam=0.5)
    # γ = 0.5, γλ = 0.25
    # row 0: t2: δ = 2 + 0 - 1 = 1 -> A = 1
    #        t1: δ = 0 + 0.5·1 - 1 = -0.5 -> A = -0.5 + 0.25·1 = -0.25
    #        t0: δ = 1 + 0.5·1 - 1 = 0.5 -> A = 0.5 + 0.25·(-0.25) = 0.4375
    #        returns = A + V = [1.4375, 0.75, 2]
    # row 1: t2: δ = 1 + 0 - 0.5 = 0.5 -> A = 0.5
    #        t1 masked (observation token, V = 7 ignored): nextvalue 0.5 and A 0.5 carry through
    #        t0: δ = 0 + 0.5·0.5 - 0.5 = -0.25 -> A = -0.25 + 0.25·0.5 = -0.125
    #        returns = [-0.125 + 0.5, 0 (masked), 0.5 + 0.5] = [0.375, 0, 1]
    # row 2: t2, t1 padding (V = 3 there is ignored): nextvalue 0, A 0
    #        t0: δ = 2 + 0 - 1 = 1 -> A = 1;  returns = [2, 0, 0]
    assert_close(ret, [[1.4375, 0.75, 2.0], [0.375, 0.0, 1.0], [2.0, 0.0, 0.0]])
    assert_whitened(adv, [0.4375, -0.25, 1.0, -0.125, 0.5, 1.0], mask)


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        get_adv_estimator_fn("gae")(
            token_level_rewards=torch.zeros(1, 2), values=None, response_mask=torch.ones(1, 2)
        )


# ----------------------------------------------------------------------------- grpo_passk


def test_grpo_passk_credits_only_the_best_response():
    passk = get_adv_estimator_fn("grpo_passk")
    # scores: group a = [1, 3, 2], group b = [0, 4] (row 4's last token is padding)
    rewards = T([[0.0, 1.0], [1.0, 2.0], [2.0, 0.0], [0.0, 0.0], [4.0, 0.0]])
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    index = ["a", "a", "a", "b", "b"]
    adv, ret = passk(
        token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=False
    )
    # a: best 3, second 2 -> row 1 gets 1, rows 0, 2 get 0;  b: best 4, second 0 -> row 4 gets 4
    assert_close(adv, [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [4.0, 0.0]])
    assert torch.equal(adv, ret)
    adv, _ = passk(token_level_rewards=rewards, response_mask=mask, index=index)
    # a: mean 2, unbiased var (1 + 1 + 0) / 2 = 1, std 1 -> 1 / 1 = 1
    # b: mean 2, unbiased var (4 + 4) / 1 = 8, std 2√2 -> 4 / 2√2 = √2
    assert_close(adv, [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [math.sqrt(2), 0.0]])


def test_grpo_passk_rejects_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2"):
        get_adv_estimator_fn("grpo_passk")(
            token_level_rewards=torch.ones(3, 2), response_mask=torch.ones(3, 2), index=["a", "a", "b"]
        )


# ----------------------------------------------------------------------------- reinforce++


def test_reinforce_plus_plus_discounted_return_resets_after_the_response():
    rpp = get_adv_estimator_fn("reinforce_plus_plus")
    # row 1 has a (spurious) reward 5 on its padding token: it must not leak into the response
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = rpp(token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    # row 0: G2 = 1, G1 = 0 + 0.5·1 = 0.5, G0 = 0 + 0.5·0.5 = 0.25
    # row 1: t2 padding -> G reset to 0 (returns 0 there); G1 = 2, G0 = 0 + 0.5·2 = 1
    assert_close(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])
    assert_whitened(adv, [0.25, 0.5, 1.0, 1.0, 2.0], mask)


def test_reinforce_plus_plus_gamma_from_config():
    class Cfg:
        gamma = 0.5

    _, ret = get_adv_estimator_fn("reinforce_plus_plus")(
        token_level_rewards=T([[0.0, 4.0]]), response_mask=T([[1.0, 1.0]]), config=Cfg()
    )
    assert_close(ret, [[2.0, 4.0]])  # G1 = 4, G0 = 0.5·4


def test_reinforce_plus_plus_baseline():
    rpp_b = get_adv_estimator_fn("reinforce_plus_plus_baseline")
    # scores: group a = [1, 3] (mean 2), group b = [2] alone (mean 0); row 2's last token is padding
    rewards = T([[0.0, 1.0], [1.0, 2.0], [2.0, 0.0]])
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    adv, ret = rpp_b(token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b"])
    # before whitening: [[-1, -1], [1, 1], [2, pad]]
    # masked tokens -1, -1, 1, 1, 2: mean 2/5 = 0.4; deviations -1.4, -1.4, 0.6, 0.6, 1.6
    # squares 1.96·2 + 0.36·2 + 2.56 = 7.2; unbiased var 7.2 / 4 = 1.8
    s = math.sqrt(1.8)
    assert_close(adv, [[-1.4 / s, -1.4 / s], [0.6 / s, 0.6 / s], [1.6 / s, 0.0]], tol=1e-4)
    assert torch.equal(adv, ret)


# ----------------------------------------------------------------------------- remax


def test_remax_greedy_baseline():
    remax = get_adv_estimator_fn("remax")
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = remax(token_level_rewards=rewards, response_mask=mask, reward_baselines=T([0.5, 3.0]))
    # row 0: reward-to-go [1, 1, 1]; minus baseline 0.5 -> [0.5, 0.5, 0.5]
    # row 1: reward-to-go [2, 2, 0 (pad)]; minus baseline 3 -> [-1, -1, 0 (pad)]
    assert_close(ret, [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    assert_close(adv, [[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]])


def test_remax_needs_baselines():
    with pytest.raises(ValueError, match="reward_baselines"):
        get_adv_estimator_fn("remax")(
            token_level_rewards=torch.ones(1, 2), response_mask=torch.ones(1, 2), reward_baselines=None
        )


# ----------------------------------------------------------------------------- rloo / opo / gpg


def test_rloo_leave_one_out_baseline():
    rloo = get_adv_estimator_fn("rloo")
    # scores: group a = [1, 2, 6], group b = [5] alone; row 3's last token is padding
    rewards = T([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [5.0, 0.0]])
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    adv, ret = rloo(token_level_rewards=rewards, response_mask=mask, index=np.array([0, 0, 0, 1]))
    # a: 1 - (2 + 6)/2 = -3;  2 - (1 + 6)/2 = -1.5;  6 - (1 + 2)/2 = 4.5
    # b: no other response -> A = r = 5
    assert_close(adv, [[-3.0, -3.0], [-1.5, -1.5], [4.5, 4.5], [5.0, 0.0]])
    assert torch.equal(adv, ret)


def test_opo_length_weighted_baseline():
    opo = get_adv_estimator_fn("opo")
    # group a: row 0 has 2 tokens, score 1; row 1 has 1 token, score 4; group b: row 2 alone, score 3
    rewards = T([[0.0, 1.0], [4.0, 0.0], [1.0, 2.0]])
    mask = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    adv, ret = opo(token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b"])
    # a: b = (2·1 + 1·4) / (2 + 1) = 2 -> A = [-1, 2];  b: baseline 0 -> A = 3
    assert_close(adv, [[-1.0, -1.0], [2.0, 0.0], [3.0, 3.0]])
    assert torch.equal(adv, ret)


def test_gpg_scales_by_share_of_nonzero_rewards():
    gpg = get_adv_estimator_fn("gpg")
    # scores: group a = [0, 1], group b = [0, 0], group c = [3] alone; row 4's last token is padding
    rewards = T([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [3.0, 0.0]])
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    adv, ret = gpg(token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b", "b", "c"])
    # B = 5, non-zero scores: 1 and 3 -> α = 5 / 2 = 2.5
    # a: mean 0.5 -> 2.5·(-0.5) = -1.25, 2.5·0.5 = 1.25;  b: 0, 0;  c: mean 0 -> 2.5·3 = 7.5
    assert_close(adv, [[-1.25, -1.25], [1.25, 1.25], [0.0, 0.0], [0.0, 0.0], [7.5, 0.0]])
    assert torch.equal(adv, ret)


def test_gpg_all_zero_rewards():
    adv, _ = get_adv_estimator_fn("gpg")(
        token_level_rewards=torch.zeros(3, 2), response_mask=torch.ones(3, 2), index=["a", "a", "b"]
    )
    assert adv.abs().sum().item() == 0.0  # α = 1 and every r - mean = 0


def test_index_length_must_match_batch():
    with pytest.raises(ValueError, match="group ids"):
        get_adv_estimator_fn("rloo")(
            token_level_rewards=torch.ones(3, 2), response_mask=torch.ones(3, 2), index=["a"]
        )
