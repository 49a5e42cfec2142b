"""Samples whose advantage is 0 everywhere get no backward pass (actor.skip_zero_advantage), and the update
is the same as with them: the loss is normalised by every sample's tokens, their gradient is exactly zero,
and their metric shares come from a forward pass without a graph."""

from __future__ import annotations

import pytest
import torch

from tests.unit._actor_update import RESPONSE, ROWS, batch, update


@pytest.mark.parametrize(
    ("zero_groups", "off_policy", "micro", "measure_entropy"),
    [
        ((1,), False, None, True),  # the default recipe: on-policy, entropy measured in the update
        ((1,), False, 3, False),  # several micro-batches, nothing measured: the skipped rows are not run
        ((0,), True, 2, False),  # off-policy: ppo_kl and clip fractions of the skipped rows are not 0
        ((0, 1), False, None, True),  # every group equal: no backward at all, the optimizer still steps
        ((0, 1), False, None, False),  # ... and nothing measured: one row's pass still names the metrics
    ],
)
def test_the_update_is_the_same_with_and_without_the_skip(
    monkeypatch, tiny_model_dir, zero_groups, off_policy, micro, measure_entropy
):
    data = batch(128, zero_groups, off_policy)
    full_grads, full_metrics, full_calls = update(
        monkeypatch, tiny_model_dir, data, False, micro, measure_entropy
    )
    grads, metrics, calls = update(monkeypatch, tiny_model_dir, data, True, micro, measure_entropy)
    trained_rows = ROWS - 4 * len(zero_groups)
    assert sum(n for n, grad in calls if grad) == trained_rows
    assert sum(n for n, grad in full_calls if grad) == ROWS
    forward_only = sum(n for n, grad in calls if not grad)
    assert forward_only == (
        ROWS - trained_rows if (measure_entropy or off_policy) else int(trained_rows == 0)
    )
    assert metrics.pop("actor/skipped_backward_frac") == pytest.approx(len(zero_groups) * 4 / ROWS)
    assert metrics.keys() == full_metrics.keys()
    for key, value in full_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # The same gradient to float rounding (the rows are summed in other micro-batches); every parameter has
    # one, a zero tensor when no row was trained, as a backward of zero-advantage rows would leave.
    assert grads.keys() == full_grads.keys() and grads
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-8, msg=name)
    largest = max(g.abs().max().item() for g in full_grads.values())
    assert largest == 0.0 if trained_rows == 0 else largest > 1e-4


@pytest.mark.parametrize(
    "keys", [{"use_kl_loss": True}, {"entropy_coeff": 0.01}, {"policy_loss": {"loss_mode": "clip_cov"}}]
)
def test_no_skip_when_zero_advantage_still_has_a_gradient(monkeypatch, tiny_model_dir, keys):
    data = batch(128, (1,), off_policy=False)
    if keys.get("use_kl_loss"):
        data.batch["ref_log_prob"] = torch.full((ROWS, RESPONSE), -2.0) * data.batch["response_mask"]
    _, _, calls = update(monkeypatch, tiny_model_dir, data, True, None, False, **keys)
    assert sum(n for n, grad in calls if grad) == ROWS
