"""Rollout correction (verl's ``algorithm.rollout_correction``): weights, rejection, metrics, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algorithms.rollout_correction import (
    Bounds,
    compute_rollout_correction,
    correction_enabled,
    offpolicy_metrics,
    parse_is_threshold,
    parse_rs_options,
    parse_rs_thresholds,
    rollout_is_weights,
    rollout_rejection_mask,
)
from verl.config.schema import RolloutCorrectionConfig

LN2 = math.log(2.0)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------- parsing
def test_is_threshold_number_is_truncation_and_pair_is_icepop():
    assert parse_is_threshold(2.0) == Bounds(2.0)
    assert parse_is_threshold("3") == Bounds(3.0)
    assert parse_is_threshold("0.5_5.0") == Bounds(5.0, 0.5)


@pytest.mark.parametrize("bad", [0, -1.0, "5.0_0.5", "a_b", "x", True, [2.0]])
def test_bad_is_threshold_is_refused(bad):
    with pytest.raises((TypeError, ValueError), match="rollout_is_threshold"):
        parse_is_threshold(bad)


def test_rs_options_dedupe_and_name_the_unknown_one():
    assert parse_rs_options(" token_k1, seq_mean_k3,token_k1") == ["token_k1", "seq_mean_k3"]
    with pytest.raises(ValueError, match="seq_max_k1"):
        parse_rs_options("seq_max_k1")


def test_rs_thresholds_broadcast_k1_pairs_and_single_upper():
    assert parse_rs_thresholds(["token_k1", "seq_sum_k1"], "0.5_2.0") == [Bounds(2.0, 0.5), Bounds(2.0, 0.5)]
    assert parse_rs_thresholds(["token_k1"], 4.0) == [Bounds(4.0, 0.25)]  # bare U: L = 1/U
    assert parse_rs_thresholds(["token_k1", "seq_mean_k3"], "0.9_1.1,0.01") == [
        Bounds(1.1, 0.9),
        Bounds(0.01),
    ]
    with pytest.raises(ValueError, match="one upper bound"):
        parse_rs_thresholds(["token_k2"], "0.1_0.2")
    with pytest.raises(ValueError, match="2 entries for 3 options"):
        parse_rs_thresholds(["token_k1", "token_k2", "token_k3"], "2.0,0.1")
    with pytest.raises(ValueError, match="quote it"):  # YAML's reading of an unquoted 0.5_2
        parse_rs_thresholds(["seq_sum_k1"], 0.52)
    with pytest.raises(ValueError, match="rollout_rs_threshold must be given"):
        parse_rs_thresholds(["token_k1"], None)


# ---------------------------------------------------------------- importance weights
def test_token_tis_truncates_above_only_and_zeroes_padding():
    # log r = [ln 4, ln 0.25, ln 1.5 (padding)] -> r = [4, 0.25, -]; U = 2 -> [2, 0.25, 0]
    log_ratio = t([[2 * LN2, -2 * LN2, math.log(1.5)]])
    mask = t([[1, 1, 0]])
    w, m = rollout_is_weights(log_ratio, mask, "token", Bounds(2.0))
    assert torch.allclose(w, t([[2.0, 0.25, 0.0]]))
    assert m["rollout_is_mean"] == pytest.approx(1.125)
    assert m["rollout_is_max"] == pytest.approx(2.0) and m["rollout_is_min"] == pytest.approx(0.25)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # 4 > 2
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(0.5)  # 0.25 < 1/2
    assert not w.requires_grad


def test_sequence_is_uses_the_product_of_ratios_on_every_token():
    # row 0: ln r = [ln 2, ln 2] -> Π = 4, truncated to 3; row 1: [ln 2, -ln 2] -> 1
    log_ratio = t([[LN2, LN2], [LN2, -LN2]])
    mask = t([[1, 1], [1, 1]])
    w, m = rollout_is_weights(log_ratio, mask, "sequence", Bounds(3.0))
    assert torch.allclose(w, t([[3.0, 3.0], [1.0, 1.0]]))
    assert m["rollout_is_max"] == pytest.approx(4.0)  # from the log-sums, before truncation
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)


def test_icepop_zeroes_weights_outside_the_band():
    log_ratio = t([[2 * LN2, -2 * LN2, 0.0]])  # r = 4, 0.25, 1 ; band [0.5, 2]
    w, m = rollout_is_weights(log_ratio, t([[1, 1, 1]]), "token", Bounds(2.0, 0.5))
    assert torch.allclose(w, t([[0.0, 0.0, 1.0]]))
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 3)


def test_batch_normalize_divides_by_the_mean_after_truncation():
    log_ratio = t([[2 * LN2, 0.0]])  # r = 4 -> 2 (U = 2), 1 ; mean 1.5
    w, m = rollout_is_weights(log_ratio, t([[1, 1]]), "token", Bounds(2.0), batch_normalize=True)
    assert torch.allclose(w, t([[2 / 1.5, 1 / 1.5]]))
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(1.5)
    assert m["rollout_is_mean"] == pytest.approx(1.5)  # metrics describe the weights before normalising


# ---------------------------------------------------------------- rejection
def test_token_k1_rejects_tokens_outside_the_ratio_band():
    # r = [4, 1, 0.25]; keep 0.5 <= r <= 2 -> only the middle token
    log_ratio = t([[2 * LN2, 0.0, -2 * LN2]])
    mask, m = rollout_rejection_mask(log_ratio, t([[1, 1, 1]]), ["token_k1"], [Bounds(2.0, 0.5)])
    assert mask.tolist() == [[0.0, 1.0, 0.0]]
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 3)
    assert m["rollout_rs_masked_fraction"] == pytest.approx(2 / 3)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)


def test_seq_mean_k3_rejects_the_whole_sequence():
    # k3 = r - 1 - log r: row 0 r = [1, 1] -> 0; row 1 r = [2, 1] -> mean (1 - ln 2)/2 = 0.1534
    log_ratio = t([[0.0, 0.0], [LN2, 0.0]])
    keep = t([[1, 1], [1, 1]])
    mask, m = rollout_rejection_mask(log_ratio, keep, ["seq_mean_k3"], [Bounds(0.1)])
    assert mask.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert m["rollout_rs_seq_mean_k3_max"] == pytest.approx((1 - LN2) / 2, rel=1e-5)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    mask, _ = rollout_rejection_mask(log_ratio, keep, ["seq_mean_k3"], [Bounds(0.2)])
    assert mask.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_options_combine_by_and_and_padding_stays_zero():
    # token_k2 (½ log² r <= 0.3) keeps every real token (at most ½ ln² 2 = 0.24); seq_sum_k1's band
    # [0.5, 2] keeps row 0 (Π r = e^0.5 = 1.65) and drops row 1 (Π r = 4).
    log_ratio = t([[0.5, 0.0, 5.0], [LN2, LN2, 0.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    out, _ = rollout_rejection_mask(
        log_ratio, mask, ["token_k2", "seq_sum_k1"], [Bounds(0.3), Bounds(2.0, 0.5)]
    )
    assert out.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


# ---------------------------------------------------------------- diagnostics and the entry point
def test_offpolicy_metrics_by_hand():
    train = t([[math.log(0.5), math.log(0.5)]])
    rollout = t([[math.log(0.25), math.log(0.5)]])  # r = [2, 1]
    m = offpolicy_metrics(train, rollout, t([[1, 1]]))
    assert m["training_ppl"] == pytest.approx(2.0, rel=1e-5)
    assert m["rollout_ppl"] == pytest.approx(math.exp((math.log(4) + math.log(2)) / 2), rel=1e-5)
    assert m["kl"] == pytest.approx(-LN2 / 2, rel=1e-5)
    assert m["k3_kl"] == pytest.approx((1 - LN2) / 2, rel=1e-5)
    assert m["chi2_token"] == pytest.approx((4 + 1) / 2 - 1, rel=1e-5)
    assert m["chi2_seq"] == pytest.approx(4 - 1, rel=1e-5)


def test_equal_policies_give_unit_weights_and_reject_nothing():
    lp = t([[-1.0, -2.0], [-0.5, -0.1]])
    cfg = RolloutCorrectionConfig(
        rollout_is="sequence", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001"
    )
    weights, mask, m = compute_rollout_correction(lp, lp.clone(), t([[1, 1], [1, 0]]), cfg)
    assert torch.allclose(weights, t([[1, 1], [1, 0]]))
    assert mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert m["rollout_corr/kl"] == 0.0 and m["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert all(name.startswith("rollout_corr/") for name in m)


def test_disabled_config_only_measures():
    weights, mask, m = compute_rollout_correction(
        t([[-1.0]]), t([[-1.5]]), t([[1]]), RolloutCorrectionConfig.disabled()
    )
    assert weights is None and mask.tolist() == [[1.0]]
    assert m["rollout_corr/kl"] == pytest.approx(-0.5)
    assert not any("rollout_is" in name or "rollout_rs" in name for name in m)


def test_presets_set_verls_fields():
    assert RolloutCorrectionConfig.decoupled_token_icepop().rollout_is_threshold == "0.5_5.0"
    pg = RolloutCorrectionConfig.bypass_pg_is()
    assert (pg.rollout_is, pg.bypass_mode, pg.loss_type) == ("sequence", True, "reinforce")
    assert not correction_enabled(RolloutCorrectionConfig.disabled())
    assert correction_enabled(RolloutCorrectionConfig.bypass_ppo_clip())
