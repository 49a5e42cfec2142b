"""Policy losses against values and gradients worked out by hand (see the arithmetic in comments)."""

import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from verl.algorithms.policy_losses import (
    LossContext,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
)
from verl.config.schema import PolicyLossConfig

NEW_LOSSES = {
    "gspo": compute_policy_loss_gspo,
    "sapo": compute_policy_loss_sapo,
    "gpg": compute_policy_loss_gpg,
    "clip_cov": compute_policy_loss_clip_cov,
    "kl_cov": compute_policy_loss_kl_cov,
    "geo_mean": compute_policy_loss_geo_mean,
    "cispo": compute_policy_loss_cispo,
}
APPROX = {"rel": 1e-5, "abs": 1e-6}
# The Clip-Cov / KL-Cov options, which live in the actor config's ``policy_loss`` section.
POLICY_LOSS_OPTIONS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")


def _context(config):
    """A LossContext from the test's flat settings (None = the defaults)."""
    config = dict(config or {})
    options = {
        **{k: config.pop(k) for k in POLICY_LOSS_OPTIONS if k in config},
        **config.pop("policy_loss", {}),
    }
    return LossContext(**config, policy_loss=OmegaConf.merge(OmegaConf.structured(PolicyLossConfig), options))


def _run(name, old, new, adv, mask, mode="token-mean", config=None, weights=None):
    """Returns (loss, metrics, d loss / d log_prob)."""
    config = _context(config)
    log_prob = torch.tensor(new, requires_grad=True)
    loss, metrics = get_policy_loss_fn(name)(
        torch.tensor(old),
        log_prob,
        torch.tensor(adv),
        torch.tensor(mask),
        mode,
        config,
        None if weights is None else torch.tensor(weights),
    )
    loss.backward()
    return loss.item(), metrics, log_prob.grad.tolist()


def _close(actual, expected):
    if isinstance(expected, list):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _close(a, e)
    else:
        assert actual == pytest.approx(expected, **APPROX)


@pytest.mark.parametrize("name", sorted(NEW_LOSSES))
def test_registered_and_importable(name):
    assert name in POLICY_LOSS_REGISTRY
    assert get_policy_loss_fn(name) is NEW_LOSSES[name]
    assert NEW_LOSSES[name].__doc__ and "arXiv" in NEW_LOSSES[name].__doc__


# ---------------------------------------------------------------- GSPO
GSPO_IN = dict(
    old=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    new=[[0.1, 0.3, 9.0], [-0.5, -0.1, -0.3]],  # 9.0 is padding
    adv=[[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
    mask=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]],
)
GSPO_CFG = {"clip_ratio": 0.2, "clip_ratio_high": 0.28}


def test_gspo_value_gradient_and_forced_aggregation():
    # seq 0: s_0 = (0.1 + 0.3)/2 = 0.2, every token ratio exp(0.2) = 1.221403 < 1.28 -> unclipped
    #        token loss = -1 * 1.221403; seq mean -1.221403
    # seq 1: s_1 = (-0.5 - 0.1 - 0.3)/3 = -0.3, ratio exp(-0.3) = 0.740818 < 0.8, A = -1:
    #        max(0.740818, 0.8) = 0.8 (clipped); seq mean 0.8
    # seq-mean-token-mean: (-1.221403 + 0.8)/2 = -0.2107014  (token-mean would be
    # (2 * -1.221403 + 3 * 0.8)/5 = -0.0085611: "token-mean" is overridden)
    loss, metrics, grad = _run("gspo", **GSPO_IN, mode="token-mean", config=GSPO_CFG)
    assert loss == pytest.approx(-0.2107014, **APPROX)
    # gradient of seq 0 token t: -A * exp(sg(s_0)) / (|y_0| = 2) / (2 seqs) = -1.221403/4 = -0.3053507,
    # the SAME for both tokens (their own ratios exp(0.1), exp(0.3) would differ); padding 0;
    # seq 1 is clipped -> 0
    _close(grad, [[-0.3053507, -0.3053507, 0.0], [0.0, 0.0, 0.0]])
    # clipped tokens: the 3 of seq 1 out of 5 valid
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.6)
    # ppo_kl = mean(-Δ) = -(0.1 + 0.3 - 0.5 - 0.1 - 0.3)/5 = 0.5/5 = 0.1
    assert metrics["actor/ppo_kl"] == pytest.approx(0.1, **APPROX)


def test_gspo_uses_global_num_seqs():
    # same seq means, divided by the mini-batch's 4 sequences: (-1.221403 + 0.8)/4 = -0.1053507
    loss, _, _ = _run("gspo", **GSPO_IN, config={**GSPO_CFG, "global_num_seqs": 4})
    assert loss == pytest.approx(-0.1053507, **APPROX)


# ---------------------------------------------------------------- SAPO
def test_sapo_soft_gate_value_and_gradient():
    old = [[0.0, 0.0], [0.0, 0.0]]
    new = [[0.0, 0.6931472], [0.0, 3.0]]  # ln 2 = 0.6931472 -> ratio 2; 3.0 is padding
    adv = [[1.0, -1.0], [-1.0, -1.0]]
    mask = [[1.0, 1.0], [1.0, 0.0]]
    # f(ρ) = σ(τ(ρ-1)) * 4/τ, τ = 1.0 if A > 0 else 1.05 (defaults)
    # seq 0 tok 0: ρ=1, A=+1, τ=1: f = σ(0)*4 = 2 -> loss -2
    # seq 0 tok 1: ρ=2, A=-1, τ=1.05: exp(-1.05) = 0.349938, σ(1.05) = 1/1.349938 = 0.740775,
    #              f = 0.740775*4/1.05 = 2.822000 -> loss +2.822000
    # seq 1 tok 0: ρ=1, A=-1, τ=1.05: f = 0.5*4/1.05 = 1.904762 -> loss +1.904762
    # seq-mean-token-mean: ((-2 + 2.822000)/2 + 1.904762)/2 = (0.411000 + 1.904762)/2 = 1.157881
    loss, metrics, grad = _run("sapo", old, new, adv, mask, mode="token-mean")
    assert loss == pytest.approx(1.157881, **APPROX)
    # d(-A f(ρ))/dlogπ = -A * 4σ(1-σ) * ρ (the τ cancels), times 1/(tokens in seq)/(2 seqs):
    # seq 0 tok 0: -1 * 4*0.5*0.5 * 1 / 4 = -0.25
    # seq 0 tok 1: +1 * 4*0.740775*0.259225 * 2 / 4 = 0.768110*2/4 = 0.384055 (soft decay, not cut)
    # seq 1 tok 0: +1 * 1 * 1 / (1*2) = 0.5
    _close(grad, [[-0.25, 0.384055], [0.5, 0.0]])
    # ppo_kl = -(0 + 0.6931472 + 0)/3 = -0.2310491
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.2310491, **APPROX)


def test_sapo_reads_taus_from_config():
    # one token, ρ=1, A=+1, τ_pos=2: f = σ(0)*4/2 = 1 -> loss -1
    loss, _, _ = _run("sapo", [[0.0]], [[0.0]], [[1.0]], [[1.0]], config={"tau_pos": 2.0})
    assert loss == pytest.approx(-1.0)


# ---------------------------------------------------------------- GPG
def test_gpg_value_and_gradient():
    new = [[-1.0, -2.0]]
    adv = [[0.5, -1.0]]
    # per token -logπ*A: -(-1)(0.5) = 0.5, -(-2)(-1) = -2
    loss, _, grad = _run("gpg", [[-9.0, -9.0]], new, adv, [[1.0, 1.0]], mode="token-mean")
    assert loss == pytest.approx((0.5 - 2.0) / 2)  # -0.75; old_log_prob plays no part
    _close(grad, [[-0.25, 0.5]])  # -A/2
    loss, _, _ = _run("gpg", [[0.0, 0.0]], new, adv, [[1.0, 1.0]], mode="seq-mean-token-sum")
    assert loss == pytest.approx(-1.5)  # 0.5 - 2, one sequence


# ---------------------------------------------------------------- CISPO
def test_cispo_value_and_gradient_through_logprob_only():
    old = [[-1.5, -1.9]]
    new = [[-1.0, -2.0]]  # Δ = 0.5, -0.1
    adv = [[1.0, -2.0]]
    # tok 0: ρ = exp(0.5) = 1.648721 -> clipped to 1.2; loss -1.2 * 1 * (-1.0) = 1.2
    # tok 1: ρ = exp(-0.1) = 0.904837 (inside [0.8, 1.2]); loss -0.904837 * (-2) * (-2.0) = -3.619350
    # token-mean: (1.2 - 3.619350)/2 = -1.209675
    loss, metrics, grad = _run("cispo", old, new, adv, [[1.0, 1.0]], config={"clip_ratio": 0.2})
    assert loss == pytest.approx(-1.209675, **APPROX)
    # gradient = -sg(w) * A / 2: tok 0: -1.2*1/2 = -0.6 (a clipped token still learns, unlike PPO);
    # tok 1: 0.904837*2/2 = 0.904837 (a gradient through the weight would add
    # -A*logπ*ρ/2 = -(−2)(−2.0)(0.904837)/2 = -1.809675)
    _close(grad, [[-0.6, 0.9048374]])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/ppo_kl"] == pytest.approx(-(0.5 - 0.1) / 2, **APPROX)


# ---------------------------------------------------------------- Clip-Cov
# A = [2, 2, -2, -2] (mean 0); logπ = [-0.5, -0.5, -2.0, -5.0] (mean -8/4 = -2.0)
# centred logπ = [1.5, 1.5, 0, -3]  ->  cov = [3, 3, 0, 6]
# tok 0: Δ = 0, ρ = 1, cov 3 in (1, 5)                       -> the only candidate
# tok 1: Δ = -0.5-(-1.0) = 0.5, ρ = 1.648721, A > 0 -> PPO-clipped to 1.2: excluded despite cov 3
# tok 2: cov 0 (below lb); tok 3: cov 6 (above ub)
CLIP_COV_IN = dict(
    old=[[-0.5, -1.0, -2.0, -5.0]],
    new=[[-0.5, -0.5, -2.0, -5.0]],
    adv=[[2.0, 2.0, -2.0, -2.0]],
    mask=[[1.0, 1.0, 1.0, 1.0]],
)


def test_clip_cov_zeroes_the_selected_token():
    loss, metrics, grad = _run("clip_cov", **CLIP_COV_IN, config={"clip_ratio": 0.2})
    # losses: tok 0 -> 0 (removed), tok 1 -2*1.2 = -2.4, tok 2 +2, tok 3 +2; token-mean 1.6/4 = 0.4
    assert loss == pytest.approx(0.4, **APPROX)
    # d/dlogπ of -Aρ is -Aρ, /4: tok 0 -> 0 (would be -0.5), tok 1 -> 0 (PPO-clipped), tok 2, 3 -> +0.5
    _close(grad, [[0.0, 0.0, 0.5, 0.5]])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)  # 1 of 4 tokens had its gradient removed
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.5 / 4)


def test_clip_cov_without_candidates_is_ppo():
    # lb 10: no candidate -> plain clipped PPO: (-2 - 2.4 + 2 + 2)/4 = -0.1, tok 0 grad -2/4 = -0.5
    cfg = {"clip_ratio": 0.2, "policy_loss": {"clip_cov_lb": 10.0}}
    loss, metrics, grad = _run("clip_cov", **CLIP_COV_IN, config=cfg)
    assert loss == pytest.approx(-0.1, **APPROX)
    _close(grad, [[-0.5, 0.0, 0.5, 0.5]])
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_clip_cov_random_draw_is_seeded():
    # ρ = 1 everywhere; A = [1, 1, -1, -1] (mean 0), logπ = [-1, -1, -3, -3] (mean -2, centred
    # [1, 1, -1, -1]) -> cov = [1, 1, 1, 1]; lb 0.5 makes all 4 candidates;
    # clip_cov_ratio 0.5 of 4 valid tokens -> 2 are drawn
    lp = [[-1.0, -1.0, -3.0, -3.0]]
    cfg = {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.5, "seed": 7}
    grads = []
    for _ in range(2):
        loss, metrics, grad = _run("clip_cov", lp, lp, [[1.0, 1.0, -1.0, -1.0]], [[1.0] * 4], config=cfg)
        assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
        assert sum(g == 0.0 for g in grad[0]) == 2  # the other two keep -A/4 = ∓0.25
        grads.append(grad)
    assert grads[0] == grads[1]


# ---------------------------------------------------------------- KL-Cov
# A = [2, 1, -1, -2] (mean 0); logπ = [-0.5, -1.0, -2.0, -4.5] (mean -8/4 = -2.0)
# centred logπ = [1.5, 1.0, 0, -2.5] -> cov = [3, 1, 0, 5]: top-1 (k = max(1, int(2e-4*4)) = 1) is tok 3
KL_COV_IN = dict(
    old=[[-0.5, -1.2, -2.0, -4.0]],  # Δ = [0, 0.2, 0, -0.5]
    new=[[-0.5, -1.0, -2.0, -4.5]],
    adv=[[2.0, 1.0, -1.0, -2.0]],
    mask=[[1.0, 1.0, 1.0, 1.0]],
)


def test_kl_cov_value_and_gradient():
    # coef 1.0 (verl's kl_cov falls back to it for a null key; its config default is 0.1, the next test)
    loss, metrics, grad = _run("kl_cov", **KL_COV_IN, config={"policy_loss": {"ppo_kl_coef": 1.0}})
    # tok 0: -2*1 = -2; tok 1: -1*exp(0.2) = -1.221403 (no clipping); tok 2: +1
    # tok 3: -(-2)*exp(-0.5) + 1.0*|−0.5| = 2*0.606531 + 0.5 = 1.713061
    # token-mean: (-2 - 1.221403 + 1 + 1.713061)/4 = -0.508342/4 = -0.1270855
    assert loss == pytest.approx(-0.1270855, **APPROX)
    # grad/4 of -Aρ (+ sign(Δ) for tok 3): -0.5, -1.221403/4 = -0.3053507, 0.25,
    # (2*0.606531 - 1)/4 = 0.0532653 (0.3032653 without the |Δ| term)
    _close(grad, [[-0.5, -0.3053507, 0.25, 0.0532653]])
    # ppo_kl is mean |Δ| = (0 + 0.2 + 0 + 0.5)/4 = 0.175
    assert metrics["actor/ppo_kl"] == pytest.approx(0.175, **APPROX)


def test_kl_cov_coef_from_policy_loss_config():
    # coef 0.1: tok 3 = 1.213061 + 0.05; (-2 - 1.221403 + 1 + 1.263061)/4 = -0.958342/4 = -0.2395855
    loss, _, _ = _run("kl_cov", **KL_COV_IN, config={"policy_loss": {"ppo_kl_coef": 0.1}})
    assert loss == pytest.approx(-0.2395855, **APPROX)


# ---------------------------------------------------------------- GMPO (geo_mean)
def test_geo_mean_value_gradient_and_clip_metrics():
    old = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    new = [[0.6, -0.6, 0.3], [-0.6, 0.5, 7.0]]  # 7.0 is padding
    adv = [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]
    mask = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
    # ε = 0.4 both sides (log space), the paper's range
    # seq 0, A > 0: cap at 0.4 only: [0.4, -0.6, 0.3], mean 0.1/3 -> r0 = exp(0.033333) = 1.033895
    #               loss_0 = -1 * 1.033895
    # seq 1, A < 0: floor at -0.4 only: [-0.4, 0.5], mean 0.05 -> r1 = exp(0.05) = 1.051271
    #               loss_1 = -(-2) * 1.051271 = 2.102542
    # mean over sequences: (-1.033895 + 2.102542)/2 = 0.5343235 (loss_agg_mode ignored)
    loss, metrics, grad = _run(
        "geo_mean", old, new, adv, mask, mode="seq-mean-token-sum", config={"clip_ratio": 0.4}
    )
    assert loss == pytest.approx(0.5343235, **APPROX)
    # d/dlogπ_t = -Ā r / |y| / 2 for unclipped tokens: seq 0 -1.033895/3/2 = -0.1723159;
    # seq 1 +2*1.051271/2/2 = 0.5256355; clipped tokens and padding 0
    _close(grad, [[0.0, -0.1723159, -0.1723159], [0.0, 0.5256355, 0.0]])
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.2)  # seq 0 tok 0, of 5 valid
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.2)  # seq 1 tok 0
    # ppo_kl = -(0.6 - 0.6 + 0.3 - 0.6 + 0.5)/5 = -0.04
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.04, **APPROX)


def test_geo_mean_uses_config_eps_and_global_num_seqs():
    # ε_high 0.1: Δ = 0.3 -> 0.1, r = exp(0.1) = 1.105171; A = 1 -> -1.105171, over 2 sequences
    cfg = {"clip_ratio": 0.1, "global_num_seqs": 2}
    loss, _, _ = _run("geo_mean", [[0.0]], [[0.3]], [[1.0]], [[1.0]], config=cfg)
    assert loss == pytest.approx(-1.105171 / 2, **APPROX)


# ---------------------------------------------------------------- rollout IS weights
def test_rollout_is_weights_scale_token_losses_by_hand():
    # gpg per-token losses [0.5, -2] weighted [3, 0.5]: (1.5 - 1)/2 = 0.25
    loss, _, grad = _run(
        "gpg", [[0.0, 0.0]], [[-1.0, -2.0]], [[0.5, -1.0]], [[1.0, 1.0]], weights=[[3.0, 0.5]]
    )
    assert loss == pytest.approx(0.25)
    _close(grad, [[-0.75, 0.25]])  # -A*w/2


def test_rollout_is_weights_geo_mean_per_sequence():
    # Δ = 0 -> r = 1; A = 1 -> loss -1, times the geometric mean of [4, 1] = sqrt(4) = 2 -> -2
    loss, _, _ = _run(
        "geo_mean", [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]], weights=[[4.0, 1.0]]
    )
    assert loss == pytest.approx(-2.0, **APPROX)


@pytest.mark.parametrize("name", sorted(NEW_LOSSES))
def test_uniform_rollout_is_weights_scale_every_loss(name):
    old = [[-1.0, -1.2, -0.7], [-2.0, -0.5, -1.0]]
    new = [[-0.9, -1.3, -0.7], [-2.2, -0.4, -1.0]]
    adv = [[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]]
    mask = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
    cfg = {"seed": 0}
    base, _, _ = _run(name, old, new, adv, mask, config=cfg)
    scaled, _, _ = _run(name, old, new, adv, mask, config=cfg, weights=[[2.5] * 3, [2.5] * 3])
    assert scaled == pytest.approx(2.5 * base, rel=1e-5, abs=1e-7)
