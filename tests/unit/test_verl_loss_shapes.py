"""verl 0.9's extension shapes (issue 44): policy losses called as verl's actor calls them, with verl's
``ActorConfig`` and its ``global_batch_info``; a custom loss file written as verl's docs describe, selected by
``actor_rollout_ref.actor.policy_loss.loss_mode``; advantage estimators written for verl.

The expected numbers are verl's formulas (``verl/trainer/ppo/core_algos.py``), written out again below in
float64 and computed independently of the code under test, plus a few worked by hand."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.algorithms import LossContext, agg_loss, external, get_policy_loss_fn
from verl.algorithms.advantages import ADV_ESTIMATOR_NEEDS
from verl.algorithms.policy_loss_base import POLICY_LOSS_REGISTRY
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig

SIX = ("vanilla", "gspo", "sapo", "gpg", "geo_mean", "cispo")
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
VERL_METRICS = {  # the metric names verl's loss returns
    "vanilla": {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"},
    "gspo": {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"},
    "sapo": {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"},
    "gpg": set(),
    "geo_mean": {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"},
    "cispo": {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"},
}
# this rank's 3 rows are half of a global mini-batch of 6 sequences and 19 valid tokens on 2 ranks
GLOBAL_INFO = {"dp_size": 2, "batch_num_tokens": 19, "global_batch_size": 6, "loss_scale_factor": None}
TOL = {"rel": 1e-5, "abs": 1e-6}


# ------------------------------------------------------------------ verl's formulas, independently in float64


def ref_agg(
    loss, mask, mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None
):
    loss, mask = loss.double(), mask.double()
    if mode == "token-mean":
        n = mask.sum() if batch_num_tokens is None else batch_num_tokens
        return (loss * mask).sum() / n * dp_size
    if mode == "token-sum":
        return (loss * mask).sum() * dp_size
    has_tokens = (mask.sum(-1) > 0).double()
    g = has_tokens.sum() if global_batch_size is None else global_batch_size
    per_seq = (loss * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / (mask.sum(-1) + 1e-8)
    out = (per_seq * has_tokens).sum() / g * dp_size
    if mode == "seq-mean-token-sum-norm":
        out = out / (loss_scale_factor if loss_scale_factor is not None else loss.shape[-1])
    return out


def ref_loss(name, old, lp, adv, mask, mode, cfg, weights=None):
    """verl's loss ``name`` on float64 tensors; ``cfg`` = (clip_ratio_low, clip_ratio_high, clip_ratio_c,
    tau_pos, tau_neg, global_batch_info)."""
    low, high, c, tau_pos, tau_neg, info = cfg
    w = 1.0 if weights is None else weights.double()
    d = lp - old
    if name == "vanilla":
        r = torch.exp(d.clamp(-20, 20))
        l1, l2 = -adv * r, -adv * r.clamp(1 - low, 1 + high)
        lc = torch.maximum(l1, l2)
        return ref_agg(torch.where(adv < 0, torch.minimum(-adv * c, lc), lc) * w, mask, mode, **info)
    if name == "gspo":
        s = (d * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        r = torch.exp((lp - lp.detach() + s.detach()[:, None]).clamp(max=10))
        losses = torch.maximum(-adv * r, -adv * r.clamp(1 - low, 1 + high))
        return ref_agg(losses * w, mask, "seq-mean-token-mean", **info)
    if name == "sapo":
        r = torch.exp(d.clamp(-20, 20))
        tau = torch.where(adv > 0, torch.tensor(tau_pos).double(), torch.tensor(tau_neg).double())
        return ref_agg(-torch.sigmoid(tau * (r - 1)) * 4 / tau * adv * w, mask, "seq-mean-token-mean", **info)
    if name == "gpg":
        return ref_agg(-lp * adv * w, mask, mode, **info)
    if name == "cispo":
        r = torch.exp(d.clamp(-20, 20))
        return ref_agg(-r.clamp(1 - low, 1 + high).detach() * adv * lp * w, mask, mode, **info)
    if name == "geo_mean":  # verl: a plain mean over this call's rows, whatever the global info
        sgn = torch.sign(adv)
        dm = sgn * torch.minimum(sgn * d, sgn * d.clamp(-low, high))
        n = mask.sum(-1)
        ratio = torch.exp((dm * mask).sum(-1) / (n + 1e-8))
        losses = -(adv * mask).sum(-1) / (n + 1e-8) * ratio
        if weights is not None:
            losses = losses * torch.exp((torch.log(weights.double() + 1e-10) * mask).sum(-1) / (n + 1e-8))
        return losses.mean()
    raise KeyError(name)


def ref_metrics(name, old, lp, adv, mask, cfg):
    """verl's metric values where this project reports the same ones (GMPO's clip fractions count only tokens
    that were really clipped here, see its docstring; GPG reports ppo_kl, verl nothing)."""
    low, high, c = cfg[:3]
    d, m = lp - old, mask.double()

    def mean(x):
        return ((x.double() * m).sum() / m.sum()).item()

    r = torch.exp(d.clamp(-20, 20))
    metrics = {"actor/ppo_kl": mean(-d)}
    if name == "vanilla":
        l1, l2 = -adv * r, -adv * r.clamp(1 - low, 1 + high)
        metrics["actor/pg_clipfrac"] = mean(l2 > l1)
        metrics["actor/pg_clipfrac_lower"] = mean((torch.maximum(l1, l2) > -adv * c) & (adv < 0))
    elif name == "gspo":
        s = torch.exp((d * m).sum(-1) / m.sum(-1).clamp(min=1))[:, None].expand_as(d)
        metrics["actor/pg_clipfrac"] = mean(-adv * s.clamp(1 - low, 1 + high) > -adv * s)
    elif name == "cispo":
        metrics["actor/pg_clipfrac"] = mean(r != r.clamp(1 - low, 1 + high))
    if name in ("gspo", "sapo", "cispo"):
        metrics["actor/pg_clipfrac_lower"] = 0.0
    if name == "sapo":
        metrics["actor/pg_clipfrac"] = 0.0
    return metrics


def inputs():
    """3 sequences (the last padded to 2 tokens), per-sequence advantages of both signs, log-ratios that
    exercise both clip sides, GSPO's sequence clip and (ρ = e^1.2 > c = 3 with A < 0) the dual clip."""
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5], [-0.7, -1.1, -2.2, -0.9], [-1.3, -0.4, 0.0, 0.0]])
    delta = torch.tensor([[0.50, -0.10, 0.45, 0.45], [-0.40, 0.10, 0.35, -0.05], [1.20, -0.45, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    adv = torch.tensor([[1.5], [-0.8], [-4.0]]) * mask
    weights = torch.tensor([[1.0, 0.9, 1.2, 0.8], [1.1, 1.0, 0.7, 1.3], [0.95, 1.05, 1.0, 1.0]])
    return old, old + delta, adv, mask, weights


def verl_config(mode, info):
    return ActorConfig(
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        tau_pos=1.0,
        tau_neg=1.05,
        loss_agg_mode=mode,
        global_batch_info=dict(info),
    )


# ------------------------------------------------------------------ the six losses, called the verl way


@pytest.mark.parametrize("name", SIX)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("info", [{}, GLOBAL_INFO], ids=["no-global-info", "global-info"])
@pytest.mark.parametrize("with_weights", [False, True], ids=["", "is-weights"])
def test_six_losses_with_verls_signature_and_config(name, mode, info, with_weights):
    old, new, adv, mask, weights = inputs()
    config = verl_config(mode, info)
    log_prob = new.clone().requires_grad_(True)
    out = get_policy_loss_fn(name)(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=adv,
        response_mask=mask.bool(),  # verl's actor passes a bool mask
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=weights if with_weights else None,
    )
    # verl's return shape: (scalar loss, metrics dict of floats) with verl's metric names
    assert isinstance(out, tuple) and len(out) == 2
    loss, metrics = out
    assert loss.dim() == 0 and isinstance(metrics, dict)
    assert VERL_METRICS[name] <= set(metrics) and all(isinstance(v, float) for v in metrics.values())
    loss.backward()

    ref_lp = new.double().requires_grad_(True)
    cfg = (0.2, 0.28, 3.0, 1.0, 1.05, info)
    ref = ref_loss(
        name, old.double(), ref_lp, adv.double(), mask.double(), mode, cfg, weights if with_weights else None
    )
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), **TOL)
    assert log_prob.grad.flatten().tolist() == pytest.approx(ref_lp.grad.flatten().tolist(), **TOL)
    expected = ref_metrics(name, old.double(), new.double(), adv.double(), mask, cfg)
    assert {k: metrics[k] for k in expected} == pytest.approx(expected, **TOL)


def test_vanilla_metrics_and_value_by_hand():
    # one token per case, A = +1 / -1, ε_low = 0.2, ε_high = 0.28, c = 3:
    # ρ = e^0.5 = 1.6487 (A > 0): clipped to 1.28 -> loss -1.28; ρ = e^-0.5 = 0.6065 (A > 0): -0.6065
    # ρ = e^1.5 = 4.4817 (A < 0): max(4.4817, 1.28) = 4.4817 > c -> dual clip to 3
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.5, -0.5, 1.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    config = verl_config("token-sum", {"dp_size": 1})
    loss, metrics = core_algos.compute_policy_loss_vanilla(
        old, new, adv, torch.ones(1, 3), "token-sum", config
    )
    assert loss.item() == pytest.approx(-1.28 - 0.6065307 + 3.0, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(
        1 / 3
    )  # only the first token took the clipped branch
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)  # the dual clip
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.5, rel=1e-6)


def test_agg_loss_global_batch_info_by_hand():
    loss = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    info = {"dp_size": 2, "batch_num_tokens": 6, "global_batch_size": 4, "loss_scale_factor": 3}
    assert agg_loss(loss, mask, "token-mean", **info).item() == pytest.approx(6 / 6 * 2)
    assert agg_loss(loss, mask, "token-sum", **info).item() == pytest.approx(6 * 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum", **info).item() == pytest.approx((3 + 3) / 4 * 2)
    assert agg_loss(loss, mask, "seq-mean-token-mean", **info).item() == pytest.approx((1.5 + 3) / 4 * 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", **info).item() == pytest.approx(
        (3 + 3) / 4 * 2 / 3
    )
    # verl's positional order: (loss_mat, loss_mask, mode, dp_size, batch_num_tokens, global_batch_size, scale)
    assert agg_loss(loss, mask, "token-mean", 1, 12).item() == pytest.approx(0.5)
    # without global counts a fully padded row is not a sequence (as verl); with dp_size > 1 they are required
    padded = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert agg_loss(loss, padded, "seq-mean-token-sum").item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="required when dp_size > 1"):
        agg_loss(loss, mask, "token-mean", dp_size=2)


def test_config_shapes_a_verl_loss_reads():
    context = LossContext(clip_ratio=0.2, global_num_tokens=19, global_num_seqs=6, dp_size=2)
    assert isinstance(context, ActorConfig)  # verl's losses assert isinstance(config, ActorConfig)
    assert context.global_batch_info == GLOBAL_INFO
    assert context.get("clip_ratio_c", 3.0) == 3.0 and context["clip_ratio_high"] == 0.2
    # attributes it does not hold come from the actor config it was built from
    actor = OmegaConf.create({"entropy_coeff": 0.01, "ppo_epochs": 2})
    assert LossContext(actor=actor).entropy_coeff == 0.01
    with pytest.raises(AttributeError):
        _ = LossContext().entropy_coeff
    # verl's defaults, and its policy_loss section with dict access
    verl = ActorConfig(policy_loss={"loss_mode": "gspo"})
    assert (verl.clip_ratio_low, verl.clip_ratio_high, verl.tau_neg) == (0.2, 0.2, 1.05)
    assert verl.policy_loss.get("loss_mode", "vanilla") == "gspo" and verl.global_batch_info == {}
    assert isinstance(verl.policy_loss, PolicyLossConfig) and verl.policy_loss.ppo_kl_coef == 0.1


@pytest.mark.parametrize("name", SIX)
def test_an_omegaconf_actor_section_with_verls_keys(name):
    # verl's YAML shape: tau_pos / tau_neg at the top level of the actor section, clip_ratio_low null
    old, new, adv, mask, _ = inputs()
    section = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": 0.28,
            "clip_ratio_c": 3.0,
            "tau_pos": 1.0,
            "tau_neg": 1.05,
            "policy_loss": {"loss_mode": name},
            "global_batch_info": GLOBAL_INFO,
        }
    )
    loss, _ = get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", section, None)
    ref = ref_loss(name, old.double(), new.double(), adv.double(), mask.double(), "token-mean",
                   (0.2, 0.28, 3.0, 1.0, 1.05, GLOBAL_INFO))  # fmt: skip
    assert loss.item() == pytest.approx(ref.item(), **TOL)


# ------------------------------------------------------------------ a custom loss file, the verl way

CUSTOM_LOSS = """
import torch

from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.workers.config import ActorConfig

SEEN = []


@register_policy_loss("{name}")
def my_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode: str = "token-mean",
    config: ActorConfig | None = None,
    rollout_is_weights=None,
):
    assert isinstance(config, ActorConfig)
    SEEN.append(dict(config.global_batch_info))
    scale = config.policy_loss.get("ppo_kl_coef", 0.1)  # any option of verl's policy_loss section
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = -advantages * ratio * scale
    pg_loss = agg_loss(
        loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
    )
    return pg_loss, {{"actor/my_metric": 1.0}}
"""


@pytest.fixture
def custom_loss_file(tmp_path, monkeypatch):
    """A verl-style loss file named by VERL_USE_EXTERNAL_MODULES (verl's variable); unregistered after."""
    name = "verl_shapes_test_loss"
    path = tmp_path / "my_losses.py"
    path.write_text(textwrap.dedent(CUSTOM_LOSS.format(name=name)))
    monkeypatch.setenv(external.ENV_VAR, str(path))
    monkeypatch.setattr(external, "_imported", set())
    yield name
    POLICY_LOSS_REGISTRY.pop(name, None)


@pytest.mark.parametrize("micro", [None, 3])
def test_custom_loss_file_runs_through_loss_mode(monkeypatch, tiny_model_dir, custom_loss_file, micro):
    from tests.unit._actor_update import ROWS, batch, update

    data = batch(vocab=64, zero_groups=(), off_policy=False)
    tokens = int(data.batch["response_mask"].sum())
    keys = {"loss_scale_factor": 16.0, "policy_loss": {"loss_mode": custom_loss_file, "ppo_kl_coef": 1.0}}
    custom_grads, custom_metrics, _ = update(monkeypatch, tiny_model_dir, data, False, micro, False, **keys)
    seen = get_policy_loss_fn(custom_loss_file).__globals__["SEEN"]
    # every micro-batch saw this run's real global batch info, as verl defines it
    assert seen and all(
        info
        == {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": ROWS, "loss_scale_factor": 16.0}
        for info in seen
    )
    assert custom_metrics["actor/my_metric"] == pytest.approx(1.0)
    # on-policy (ratio 1, nothing clipped) it is PPO's loss: the same gradient as vanilla
    keys["policy_loss"] = {"loss_mode": "vanilla"}
    vanilla_grads, vanilla_metrics, _ = update(monkeypatch, tiny_model_dir, data, False, micro, False, **keys)
    assert custom_metrics["actor/pg_loss"] == pytest.approx(
        vanilla_metrics["actor/pg_loss"], rel=1e-5, abs=1e-7
    )
    for key, grad in vanilla_grads.items():
        torch.testing.assert_close(custom_grads[key], grad, rtol=1e-5, atol=1e-7)


def test_a_loss_file_imported_twice_registers_again(tmp_path):
    from verl.utils.imports import import_file

    name = "verl_shapes_twice_loss"
    path = tmp_path / "twice.py"
    path.write_text(textwrap.dedent(CUSTOM_LOSS.format(name=name)))
    try:
        import_file(path)
        import_file(path)  # a second run of the same file re-registers its function
        with pytest.raises(ValueError, match="already registered"):
            core_algos.register_policy_loss(name)(lambda *a, **k: None)  # another function: a clash
    finally:
        POLICY_LOSS_REGISTRY.pop(name, None)


def test_external_modules_by_dotted_name(tmp_path, monkeypatch):
    name = "verl_shapes_dotted_loss"
    (tmp_path / "verl_shapes_user_pkg.py").write_text(textwrap.dedent(CUSTOM_LOSS.format(name=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(external.ENV_VAR, " verl_shapes_user_pkg , ")
    monkeypatch.setattr(external, "_imported", set())
    try:
        assert get_policy_loss_fn(name).__name__ == "my_loss"  # imported on the first miss
        assert external.import_external_modules() == []  # once per process
    finally:
        POLICY_LOSS_REGISTRY.pop(name, None)


def test_a_loss_returning_verls_older_tuple_is_named():
    from verl.workers.actor import policy_loss_result

    def old_style(*args, **kwargs):
        return torch.tensor(0.0), 0.0, 0.0, 0.0

    with pytest.raises(TypeError, match="old_style returned tuple of 4 items.*as in verl 0.9"):
        policy_loss_result(old_style(), old_style)


# ------------------------------------------------------------------ advantage estimators written for verl


def test_a_verl_estimator_without_kwargs_runs_from_the_trainer():
    from verl.trainer.advantage import compute_advantage

    @core_algos.register_adv_est("verl_shapes_test_est")
    def leave_one_out(token_level_rewards, response_mask, index, epsilon=1e-6, config=None):
        # verl passes a custom estimator only these keywords (and reward_baselines), never **kwargs
        scores = token_level_rewards.sum(-1)
        assert config.norm_adv_by_std_in_grpo is True and epsilon == 1e-6
        groups = {g: scores[index == g] for g in set(index)}
        adv = torch.stack([(s * len(groups[g]) - groups[g].sum()) / (len(groups[g]) - 1)
                           for s, g in zip(scores, index, strict=True)])  # fmt: skip
        return adv[:, None] * response_mask, adv[:, None] * response_mask

    try:
        data = DataProto.from_dict(
            {"token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]]),
             "response_mask": torch.ones(3, 2)},
            non_tensors={"uid": np.array(["a", "a", "a"], dtype=object)},
        )  # fmt: skip
        algorithm = OmegaConf.create(
            {
                "adv_estimator": "verl_shapes_test_est",
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
            }
        )
        out = compute_advantage(data, algorithm)
        # RLOO by hand: r = 1, 0, 2 -> r_i - mean of the others = 1 - 1, 0 - 1.5, 2 - 0.5
        assert out.batch["advantages"][:, 0].tolist() == pytest.approx([0.0, -1.5, 1.5])
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("verl_shapes_test_est", None)
        ADV_ESTIMATOR_NEEDS.pop("verl_shapes_test_est", None)


def test_register_adv_est_takes_verls_enum_and_grpo_takes_verls_kwargs():
    est = core_algos.get_adv_estimator_fn(core_algos.AdvantageEstimator.GRPO)
    assert est is core_algos.compute_grpo_outcome_advantage
    rewards, mask = torch.tensor([[1.0], [0.0], [0.0], [1.0]]), torch.ones(4, 1)
    index = np.array(["p", "p", "p", "p"], dtype=object)
    # mean 0.5, unbiased std sqrt(1/3) = 0.57735; epsilon as given
    adv, returns = est(
        token_level_rewards=rewards, response_mask=mask, index=index, epsilon=0.1,
        norm_adv_by_std_in_grpo=True, config=None,
    )  # fmt: skip
    assert adv[:, 0].tolist() == pytest.approx([0.73817, -0.73817, -0.73817, 0.73817], rel=1e-4)
    adv, _ = est(token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=False)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert torch.equal(returns, est(rewards, mask, index, 0.1, True)[0])

    @core_algos.register_adv_est(core_algos.AdvantageEstimator.GDPO)  # a member: registered as its value
    def gdpo(token_level_rewards, response_mask, **kwargs):
        return response_mask, response_mask

    try:
        assert core_algos.get_adv_estimator_fn("gdpo") is gdpo
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("gdpo", None)
        ADV_ESTIMATOR_NEEDS.pop("gdpo", None)
