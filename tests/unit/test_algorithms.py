"""Algorithms on small inputs whose expected values are worked out by hand in each test."""

import math

import numpy as np
import pytest
import torch

from verl.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    anneal,
    compute_value_loss,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    kl_penalty,
    masked_mean,
    masked_whiten,
    register_adv_est,
)
from verl.algorithms.policy_loss_base import LossContext
from verl.workers.engine.optim import lr_multiplier


def test_masked_mean_ignores_padding():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)  # (1+2+3)/3
    assert masked_mean(values, mask, dim=-1).tolist() == pytest.approx([1.5, 3.0])


def test_masked_whiten_zero_mean_unit_var():
    values = torch.tensor([[1.0, 3.0, 50.0]])
    mask = torch.tensor([[1, 1, 0]])
    # mean 2, unbiased var ((1)^2 + (1)^2) / 1 = 2 -> (x - 2) / sqrt(2)
    out = masked_whiten(values, mask)
    assert out[0, :2].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-4)


def test_grpo_advantage_normalised_by_group_std():
    # Two groups of two: scores (1, 0) and (1, 1); rewards sit on the last valid token.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    index = np.array(["a", "a", "b", "b"], dtype=object)
    adv, ret = get_adv_estimator_fn("grpo")(rewards, mask, index=index)
    # group a: mean 0.5, unbiased std sqrt(0.5) = 0.7071 -> ±0.5/0.7071 = ±0.7071
    assert adv[0].tolist() == pytest.approx([0.70710, 0.70710], rel=1e-4)
    assert adv[1].tolist() == pytest.approx([-0.70710, -0.70710], rel=1e-4)
    # group b: identical scores -> 0 advantage; padding stays 0
    assert adv[2].tolist() == [0.0, 0.0] and adv[3].tolist() == [0.0, 0.0]
    assert torch.equal(adv, ret)


def test_grpo_without_std_is_drgrpo_and_singleton_group():
    rewards = torch.tensor([[3.0], [1.0], [5.0]])
    mask = torch.ones(3, 1)
    index = ["a", "a", "solo"]
    adv, _ = get_adv_estimator_fn("grpo")(rewards, mask, index=index, norm_adv_by_std_in_grpo=False)
    # group a: mean 2 -> +1, -1; a group of one has mean 0, so its advantage is its score
    assert adv[:, 0].tolist() == pytest.approx([1.0, -1.0, 5.0])


def test_register_custom_estimator():
    @register_adv_est("unit_test_constant")
    def constant(token_level_rewards, response_mask, **kwargs):
        return response_mask * 2.0, response_mask

    adv, _ = get_adv_estimator_fn("unit_test_constant")(torch.zeros(1, 2), torch.ones(1, 2), index=["x"])
    assert adv.tolist() == [[2.0, 2.0]]
    with pytest.raises(ValueError, match="unknown advantage estimator .* 'nope'"):
        get_adv_estimator_fn("nope")


def test_vanilla_policy_loss_clips_and_dual_clips():
    cfg = LossContext(clip_ratio=0.2, clip_ratio_c=3.0)
    old = torch.zeros(1, 4)
    # ratios e^0.5=1.6487, e^-0.5=0.6065, 1.0, e^2=7.389
    new = torch.tensor([[0.5, -0.5, 0.0, 2.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, metrics = get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", cfg)
    # token 0: A>0, max(-1.6487, -1.2) = -1.2 (clipped)
    # token 1: A>0, max(-0.6065, -0.8) = -0.6065
    # token 2: A<0, ratio 1 -> 1.0
    # token 3: A<0, max(7.389, 1.2) = 7.389 then dual clip min(7.389, 3.0) = 3.0
    expected = (-1.2 - 0.6065307 + 1.0 + 3.0) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)  # only token 0: clipped loss > unclipped
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25)  # token 3
    assert metrics["actor/ppo_kl"] == pytest.approx(-(0.5 - 0.5 + 0 + 2.0) / 4)


def test_vanilla_clip_higher_is_asymmetric():
    cfg = LossContext(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28)
    new = torch.tensor([[0.5]])  # ratio 1.6487 -> clipped to 1.28
    loss, _ = get_policy_loss_fn("vanilla")(
        torch.zeros(1, 1), new, torch.ones(1, 1), torch.ones(1, 1), "token-mean", cfg
    )
    assert loss.item() == pytest.approx(-1.28)


def test_agg_loss_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 + 4) / (2 * 3))
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        agg_loss(loss, mask, "mean")


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_agg_loss_micro_batch_invariance(mode):
    torch.manual_seed(0)
    loss = torch.rand(6, 5)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    whole = agg_loss(loss, mask, mode)
    counts = {"global_num_tokens": mask.sum().item(), "global_num_seqs": 6}
    parts = sum(agg_loss(loss[i : i + 2], mask[i : i + 2], mode, **counts) for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-1.0, 0.0])  # delta = +1, -1
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx([1.0, -1.0])
    assert kl_penalty(logp, ref, "abs").tolist() == pytest.approx([1.0, 1.0])
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx([0.5, 0.5])
    # k3 = e^{-d} + d - 1: d=1 -> e^-1 = 0.36788; d=-1 -> e^1 - 2 = 0.71828
    assert kl_penalty(logp, ref, "low_var_kl").tolist() == pytest.approx([0.367879, 0.718282], rel=1e-5)


@pytest.mark.parametrize("base", ["k1", "abs", "k3"])
def test_plus_variant_has_k3_value_and_k2_gradient(base):
    logp = torch.tensor([0.3, -0.7], requires_grad=True)
    ref = torch.tensor([-0.2, 0.1])
    value = kl_penalty(logp, ref, base + "+")
    assert value.tolist() == pytest.approx(kl_penalty(logp, ref, base).tolist())
    value.sum().backward()
    # d/dlogp of 0.5 * (logp - ref)^2 = logp - ref
    assert logp.grad.tolist() == pytest.approx([0.5, -0.8])


def test_kl_controllers():
    fixed = FixedKLController(0.1)
    fixed.update(5.0, 10)
    assert fixed.value == 0.1
    adaptive = AdaptiveKLController(0.1, target_kl=1.0, horizon=100)
    adaptive.update(current_kl=2.0, n_steps=10)  # error clipped to +0.2 -> 0.1 * (1 + 0.2 * 0.1)
    assert adaptive.value == pytest.approx(0.102)


def test_lr_schedule_warmup_then_cosine():
    assert lr_multiplier(0, warmup_steps=4, total_steps=10, schedule="constant", min_lr_ratio=0) == 0.25
    assert lr_multiplier(5, warmup_steps=4, total_steps=10, schedule="constant", min_lr_ratio=0) == 1.0
    assert lr_multiplier(
        4, warmup_steps=4, total_steps=10, schedule="cosine", min_lr_ratio=0
    ) == pytest.approx(1.0)
    assert lr_multiplier(
        7, warmup_steps=4, total_steps=10, schedule="cosine", min_lr_ratio=0
    ) == pytest.approx(0.5)
    assert lr_multiplier(
        10, warmup_steps=4, total_steps=10, schedule="cosine", min_lr_ratio=0.1
    ) == pytest.approx(0.1)


def test_value_loss_clipped_by_hand():
    # old values 0, returns 1; predictions 0.2 (inside the clip range) and 2.0 (clipped to 0.5)
    vpreds = torch.tensor([[0.2, 2.0]])
    returns = torch.tensor([[1.0, 1.0]])
    values = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    # token 0: unclipped (0.2-1)^2 = 0.64, clipped (0.2-1)^2 = 0.64 -> 0.64
    # token 1: unclipped (2-1)^2 = 1.0, clipped (0.5-1)^2 = 0.25 -> max = 1.0
    # 0.5 * mean(0.64, 1.0) = 0.41; the clipped term is larger on no token
    assert loss.item() == pytest.approx(0.41)
    assert clipfrac.item() == 0.0
    # token 0: unclipped 4.0, clipped (-0.5-1)^2 = 2.25 -> 4.0; token 1: 1.0
    vpreds = torch.tensor([[-1.0, 0.0]])
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    assert loss.item() == pytest.approx(0.5 * (4.0 + 1.0) / 2)
    assert clipfrac.item() == 0.0
    # token 0: 0.9 -> clipped to 0.5: unclipped 0.01 < clipped 0.25, so the clipped term counts
    # token 1: 0.3 is inside the range: both terms (0.3-1)^2 = 0.49
    vpreds = torch.tensor([[0.9, 0.3]])
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.49) / 2)
    assert clipfrac.item() == pytest.approx(0.5)


def test_anneal_schedules():
    assert anneal(0.2, 0.05, 0.0) == pytest.approx(0.2)
    assert anneal(0.2, 0.05, 0.5) == pytest.approx(0.125)  # linear midpoint
    assert anneal(0.2, 0.05, 1.0) == pytest.approx(0.05)
    assert anneal(0.2, 0.05, 0.5, "cosine") == pytest.approx(0.125)  # cos(pi/2) = 0: also the midpoint
    assert anneal(0.2, 0.05, 0.25, "cosine") == pytest.approx(0.05 + 0.15 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert anneal(0.2, 0.05, 7.0) == pytest.approx(0.05)  # progress is clamped to [0, 1]
    with pytest.raises(ValueError, match="unknown schedule"):
        anneal(0.2, 0.05, 0.5, "step")
