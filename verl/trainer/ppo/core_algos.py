"""verl's import path for its RL math, ``verl.trainer.ppo.core_algos``: user code written for verl (a
custom estimator or policy loss registered with ``register_adv_est`` / ``register_policy_loss``, a call
to ``compute_grpo_outcome_advantage`` or ``agg_loss``) imports unchanged. A thin re-export of
:mod:`verl.algorithms`, where the math lives (one registered function per estimator and loss)."""

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

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
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
