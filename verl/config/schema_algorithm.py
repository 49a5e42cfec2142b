"""Typed configuration schema of the ``algorithm`` section: advantage estimation, the in-reward KL penalty and
its controller, DAPO's dynamic sampling and the rollout correction (with verl's presets). Part of
:mod:`verl.config.schema` (which re-exports every class here); the conventions are described there.
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KLControlConfig:
    """``algorithm.kl_ctrl``: controller for the in-reward KL penalty."""

    type: str = "fixed"
    """controller type: fixed | adaptive"""
    kl_coef: float = 0.001
    """(initial) KL coefficient"""
    horizon: int = 10000
    """adaptive controller horizon"""
    target_kl: float = 0.1
    """adaptive controller target KL"""


@dataclass
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO's dynamic sampling."""

    enable: bool = False
    """drop groups whose responses all score the same and generate more until the batch is full"""
    metric: str = "seq_reward"
    """what must vary within a group: seq_reward (the sequence's reward before the KL penalty; verl 0.9.1's
    default, reward, is read as seq_reward) | a field the reward function returns (e.g. acc)"""
    max_num_gen_batches: int = 0
    """give up (with an error) after this many generation batches in one step; 0 = no limit"""


@dataclass
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction``: reweight or reject samples that the rollout engine drew from another
    policy than π_old (another engine's kernels, lower precision, older weights). verl's keys and presets;
    the math is in `verl.algorithms.rollout_correction`."""

    rollout_is: Optional[str] = None
    """importance weights: null (none) | token (truncated IS per token) | sequence (per sequence)"""
    rollout_is_threshold: Any = 2.0
    """a number U (weights truncated at U) or "L_U" (IcePop: weights outside [L, U] set to 0)"""
    rollout_is_batch_normalize: bool = False
    """divide the weights by their batch mean (after truncation)"""
    rollout_rs: Optional[str] = None
    """rejection: null | comma-separated token_k1/2/3, seq_sum_k1/2/3, seq_mean_k1/2/3, seq_max_k2/3"""
    rollout_rs_threshold: Any = None
    """one bound for all rejection options or one per option: "L_U" ratios for k1, an upper value for k2/k3"""
    bypass_mode: bool = False
    """π_old := π_rollout: no old-log-prob pass; the loss corrects against the current policy per micro-batch"""
    loss_type: str = "ppo_clip"
    """bypass mode's loss: ppo_clip (the clipped ratio π_θ/π_rollout is the correction) | reinforce (−A·w·log π_θ)"""

    # verl's presets (RolloutCorrectionConfig.<name>() in Python; the same fields can be set as keys).
    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> "RolloutCorrectionConfig":
        return cls(rollout_is="token", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> "RolloutCorrectionConfig":
        return cls(rollout_is="sequence", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_token_icepop(
        cls, threshold: float = 5.0, threshold_lower: float = 0.5
    ) -> "RolloutCorrectionConfig":
        return cls(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}")

    @classmethod
    def decoupled_seq_is_rs(
        cls, is_threshold: float = 2.0, rs_threshold: Any = "0.5_2.0"
    ) -> "RolloutCorrectionConfig":
        return cls(rollout_is="sequence", rollout_is_threshold=is_threshold, rollout_rs="seq_sum_k1",
                   rollout_rs_threshold=rs_threshold)  # fmt: skip

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs(cls, rs_threshold: float = 0.01) -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold)

    @classmethod
    def bypass_ppo_clip(cls) -> "RolloutCorrectionConfig":
        return cls(bypass_mode=True)

    @classmethod
    def bypass_ppo_clip_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True)

    @classmethod
    def bypass_ppo_clip_k3_rs(cls, rs_threshold: float = 0.01) -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold, bypass_mode=True)

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> "RolloutCorrectionConfig":
        return cls(
            rollout_is="sequence", rollout_is_threshold=threshold, bypass_mode=True, loss_type="reinforce"
        )

    @classmethod
    def bypass_pg_token_icepop(
        cls, threshold: float = 5.0, threshold_lower: float = 0.5
    ) -> "RolloutCorrectionConfig":
        return cls(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}", bypass_mode=True,
                   loss_type="reinforce")  # fmt: skip

    @classmethod
    def bypass_pg_geo_rs(cls, rs_threshold: Any = "0.999_1.001") -> "RolloutCorrectionConfig":
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold, bypass_mode=True,
                   loss_type="reinforce")  # fmt: skip

    @classmethod
    def disabled(cls) -> "RolloutCorrectionConfig":
        return cls()


@dataclass
class AlgorithmConfig:
    """``algorithm``: advantage estimation and reward shaping."""

    adv_estimator: str = "grpo"
    """advantage estimator: grpo | gae | rloo | reinforce_plus_plus | remax | ..."""
    gamma: float = 1.0
    """discount factor, in [0, 1]"""
    lam: float = 1.0
    """GAE lambda, in [0, 1]"""
    norm_adv_by_std_in_grpo: bool = True
    """divide GRPO advantages by the group std (False = Dr. GRPO)"""
    use_kl_in_reward: bool = False
    """subtract a KL penalty from the token rewards"""
    kl_penalty: str = "kl"
    """KL estimator for the in-reward penalty: kl (k1) | abs | mse (k2) | low_var_kl (k3)"""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller"""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling"""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """importance weights / rejection of samples drawn by another policy than π_old"""
