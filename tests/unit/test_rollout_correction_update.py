"""Rollout correction inside the actor's update: decoupled weights from the batch, bypass mode per micro-batch."""

from __future__ import annotations

import pytest
import torch

from tests.unit._actor_update import ROWS, batch, update
from verl.config.schema import RolloutCorrectionConfig


def _grads_close(a: dict, b: dict, scale: float = 1.0) -> None:
    assert a.keys() == b.keys() and a
    for name, grad in b.items():
        torch.testing.assert_close(a[name], scale * grad, rtol=1e-5, atol=1e-8, msg=name)


def test_decoupled_weights_in_the_batch_scale_the_policy_gradient(monkeypatch, tiny_model_dir):
    data = batch(128, (), off_policy=True)
    no_clip = {"grad_clip": 1e9}  # a clipped norm would hide the factor
    plain, _, _ = update(monkeypatch, tiny_model_dir, data, False, None, False, **no_clip)
    weighted = data.select()
    weighted.batch["rollout_is_weights"] = 2.0 * weighted.batch["response_mask"].float()
    doubled, _, _ = update(monkeypatch, tiny_model_dir, weighted, False, 2, False, **no_clip)
    _grads_close(doubled, plain, scale=2.0)


def test_bypass_reinforce_is_gpg_weighted_by_the_truncated_ratio(monkeypatch, tiny_model_dir):
    """bypass_pg_is: −A·w·log π_θ with w = min(Π r, 2) per sequence, r = π_θ / π_rollout, measured in the update.

    The same gradient comes from the gpg loss given those weights computed beforehand from the same model."""
    data = batch(
        128, (), off_policy=True
    )  # old_log_probs stand for the rollout's (bypass: π_old = π_rollout)
    correction = RolloutCorrectionConfig.bypass_pg_is(threshold=2.0)
    grads, metrics, _ = update(
        monkeypatch, tiny_model_dir, data, False, 3, False, bypass_correction=correction
    )

    from verl.algorithms.rollout_correction import compute_rollout_correction
    from verl.models import load_hf_model
    from verl.workers.actor import response_logprobs

    torch.manual_seed(0)
    model = load_hf_model(tiny_model_dir, attn_implementation="eager")
    with torch.no_grad():
        log_prob, _ = response_logprobs(model, data, 1.0, with_entropy=False)
    mask = data.batch["response_mask"]
    weights, _, expected = compute_rollout_correction(log_prob, data.batch["old_log_probs"], mask, correction)
    assert 0.0 < float(weights[mask.bool()].min()) and float(weights.max()) <= 2.0
    given = data.select()
    given.batch["rollout_is_weights"] = weights
    reference, _, _ = update(
        monkeypatch, tiny_model_dir, given, False, None, False, policy_loss={"loss_mode": "gpg"}
    )
    _grads_close(grads, reference)
    # per-micro-batch metrics, weighted by token share: the means match the whole batch's
    assert metrics["rollout_corr/kl"] == pytest.approx(expected["rollout_corr/kl"], rel=1e-4)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
        expected["rollout_corr/rollout_is_mean"], rel=0.2
    )


def test_bypass_ppo_clip_measures_the_weights_but_does_not_apply_them(monkeypatch, tiny_model_dir):
    data = batch(128, (), off_policy=True)
    plain, _, _ = update(monkeypatch, tiny_model_dir, data, False, None, False)
    correction = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True)  # loss_type ppo_clip
    grads, metrics, _ = update(
        monkeypatch, tiny_model_dir, data, False, None, False, bypass_correction=correction
    )
    _grads_close(grads, plain)
    assert "rollout_corr/rollout_is_mean" in metrics and "rollout_corr/chi2_token" in metrics


def test_bypass_rejection_drops_the_rejected_tokens_from_the_loss(monkeypatch, tiny_model_dir):
    """A band no token can be inside (k2 ≤ 1e-12 while π_θ ≠ π_rollout) rejects everything: zero gradient."""
    data = batch(128, (), off_policy=True)
    correction = RolloutCorrectionConfig(rollout_rs="token_k2", rollout_rs_threshold=1e-12, bypass_mode=True)
    grads, metrics, _ = update(
        monkeypatch, tiny_model_dir, data, False, None, False, bypass_correction=correction
    )
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1.0)
    assert max(g.abs().max().item() for g in grads.values()) == 0.0
    loose = RolloutCorrectionConfig(rollout_rs="token_k2", rollout_rs_threshold=1e6, bypass_mode=True)
    kept, metrics, _ = update(monkeypatch, tiny_model_dir, data, False, None, False, bypass_correction=loose)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    plain, _, _ = update(monkeypatch, tiny_model_dir, data, False, None, False)
    _grads_close(kept, plain)


def test_rows_of_the_batch_all_reach_the_update(monkeypatch, tiny_model_dir):
    data = batch(128, (1,), off_policy=True)
    normalised = RolloutCorrectionConfig(
        rollout_is="token", rollout_is_batch_normalize=True, bypass_mode=True, loss_type="reinforce"
    )
    # batch-normalised weights need every row in the micro-batch: no zero-advantage skip
    _, metrics, calls = update(
        monkeypatch, tiny_model_dir, data, True, None, False, bypass_correction=normalised
    )
    assert sum(n for n, grad in calls if grad) == ROWS
    assert "actor/skipped_backward_frac" not in metrics or metrics["actor/skipped_backward_frac"] == 0.0
