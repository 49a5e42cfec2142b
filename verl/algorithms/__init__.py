"""Pure tensor math of RL for LLMs: estimators, losses, KL. No models, no I/O."""

from verl.algorithms.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    EstimatorNeeds,
    estimator_needs,
    get_adv_estimator_fn,
    register_adv_est,
)
from verl.algorithms.core import (
    LOSS_AGG_MODES,
    agg_loss,
    anneal,
    compute_value_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from verl.algorithms.distillation import (
    DISTILLATION_LOSS_REGISTRY,
    DistillationLossOptions,
    get_distillation_loss_fn,
    register_distillation_loss,
)
from verl.algorithms.kl import AdaptiveKLController, FixedKLController, get_kl_controller, kl_penalty
from verl.algorithms.policy_losses import (
    POLICY_LOSS_REGISTRY,
    LossContext,
    get_policy_loss_fn,
    register_policy_loss,
)

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "DISTILLATION_LOSS_REGISTRY",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "DistillationLossOptions",
    "EstimatorNeeds",
    "FixedKLController",
    "LossContext",
    "agg_loss",
    "anneal",
    "compute_value_loss",
    "estimator_needs",
    "get_adv_estimator_fn",
    "get_distillation_loss_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_distillation_loss",
    "register_policy_loss",
]
