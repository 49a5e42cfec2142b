"""verl's import path for its RL math, ``verl.trainer.ppo.core_algos``: user code written for verl (a
custom estimator or policy loss registered with ``register_adv_est`` / ``register_policy_loss``, a call
to ``compute_grpo_outcome_advantage``, ``compute_policy_loss_vanilla`` or ``agg_loss``) imports unchanged.
A thin re-export of :mod:`verl.algorithms`, where the math lives (one registered function per estimator
and loss), plus verl's ``AdvantageEstimator`` names."""

from enum import Enum

from verl.algorithms import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    compute_value_loss,
    get_adv_estimator_fn,
    get_kl_controller,
    get_policy_loss_fn,
    kl_penalty,
    register_adv_est,
    register_policy_loss,
)
from verl.algorithms.advantages import (
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from verl.algorithms.policy_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from verl.algorithms.verl_config import VerlActorConfig as ActorConfig


class AdvantageEstimator(str, Enum):
    """verl's names of its advantage estimators (``register_adv_est`` and ``get_adv_estimator_fn`` take a
    member or its string). Only the names are verl's: a name with no estimator registered here is reported
    by the lookup."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "ActorConfig",
    "AdvantageEstimator",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "register_adv_est",
    "register_policy_loss",
]
