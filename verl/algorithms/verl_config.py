"""verl's config objects as its policy losses see them: ``ActorConfig`` and ``PolicyLossConfig``.

A policy loss written for verl 0.9 receives verl's ``ActorConfig`` as ``config`` and reads attributes of it
(``config.clip_ratio_low``, ``config.tau_pos``, ``config.policy_loss.ppo_kl_coef``), optional ones through
``config.get("clip_ratio_c", 3.0)``, and the counts of the global mini-batch through
``config.global_batch_info``, a dict with verl's four keys that the loss spreads into ``agg_loss``::

    {"dp_size": ..., "batch_num_tokens": ..., "global_batch_size": ..., "loss_scale_factor": ...}

These two dataclasses carry the same fields and defaults as verl's (``verl/workers/config/actor.py``), so a
unit test or a loss written against verl builds and reads them unchanged (``verl.workers.config`` re-exports
them). The actor itself passes a `verl.algorithms.policy_loss_base.LossContext`, which has the same shape and
is registered as a virtual subclass of :class:`ActorConfig` (``isinstance(config, ActorConfig)`` holds, as
verl's own losses assert).
"""

from __future__ import annotations

from abc import ABCMeta
from dataclasses import dataclass, field
from typing import Any

GLOBAL_BATCH_INFO_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")
"""the keys of ``ActorConfig.global_batch_info``, which are `agg_loss`'s keyword arguments"""


class ConfigAccess:
    """Mapping-style access on an attribute object, as verl's ``BaseConfig`` offers:
    ``config.get(key, default)``, ``config[key]`` and ``key in config``."""

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and hasattr(self, key)


@dataclass
class VerlPolicyLossConfig(ConfigAccess):
    """verl's ``actor.policy_loss`` section (exported as ``verl.workers.config.PolicyLossConfig``)."""

    loss_mode: str = "vanilla"
    """the registered policy loss"""
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of tokens whose gradient is removed"""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance band"""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of the covariance band"""
    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of tokens that get the |log-ratio| penalty"""
    ppo_kl_coef: float = 0.1
    """kl_cov: coefficient of that penalty (verl 0.9's default)"""
    dro_beta: float | None = None
    """DRO's quadratic log-ratio penalty (verl's ``dro`` loss; not built here)"""
    rollout_correction: Any = None
    """verl's bypass-mode rollout-correction settings (``algorithm.rollout_correction`` here)"""


@dataclass
class VerlActorConfig(ConfigAccess, metaclass=ABCMeta):
    """verl's ``ActorConfig`` as far as a policy loss reads it (exported as ``verl.workers.config.ActorConfig``).

    Fields and defaults are verl 0.9's; ``strategy`` and ``rollout_n``, which verl requires, default to
    ``"fsdp"`` and 1. ``global_batch_info`` starts empty, as in verl: a loss then normalises by the counts of
    the tensors it is given (one process, the whole batch in one piece).
    """

    strategy: str = "fsdp"
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    clip_ratio: float = 0.2
    """PPO clip range ε"""
    clip_ratio_low: float | None = 0.2
    """ε_low (None = ``clip_ratio``)"""
    clip_ratio_high: float | None = 0.2
    """ε_high (None = ``clip_ratio``)"""
    policy_loss: VerlPolicyLossConfig = field(default_factory=VerlPolicyLossConfig)
    clip_ratio_c: float = 3.0
    """dual-clip constant c > 1"""
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    """constant divisor of ``seq-mean-token-sum-norm`` (None = the response length)"""
    entropy_coeff: float = 0.0
    tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages (top level in verl)"""
    tau_neg: float = 1.05
    """SAPO gate temperature for negative advantages"""
    calculate_entropy: bool = False
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    ppo_epochs: int = 1
    shuffle: bool = False
    rollout_n: int = 1
    global_batch_info: dict = field(default_factory=dict)
    """``dp_size``, ``batch_num_tokens`` (valid tokens of the global mini-batch), ``global_batch_size``
    (its sequences), ``loss_scale_factor``: filled per mini-batch by the trainer"""

    def __post_init__(self) -> None:
        if isinstance(self.policy_loss, dict):
            self.policy_loss = VerlPolicyLossConfig(**self.policy_loss)


__all__ = [
    "GLOBAL_BATCH_INFO_KEYS",
    "ConfigAccess",
    "VerlActorConfig",
    "VerlPolicyLossConfig",
]
