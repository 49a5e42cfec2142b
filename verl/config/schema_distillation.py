"""Typed configuration schema of the ``distillation`` section: on-policy distillation (OPD) from frozen teacher
models, with verl 0.9.1's keys and the defaults of its ``distillation.yaml``. Part of :mod:`verl.config.schema`
(which re-exports every class here); the conventions are described there. The math is in
`verl.algorithms.distillation`, the teachers in `verl.workers.teacher`; docs/distillation.md says how a step
uses them.

verl's keys that have no effect here (each teacher's ``inference.*`` server settings and ``num_replicas``,
``distillation.n_gpus_per_node`` / ``nnodes``) are not in this schema: the teachers run in the actor's worker
processes, next to the reference, so they are reported at start-up (:mod:`verl.config.verl_rules_ppo`).
"""

# ruff: noqa: UP007, UP045

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class DistillationLossSection:
    """``distillation.distillation_loss``: how the teacher's log-probs become a loss on the student."""

    loss_mode: str = "k3"
    """per-token divergence: k3 / low_var_kl, k1 / kl, abs, k2 / mse (estimators of the reverse KL from the
    sampled token), forward_kl_topk (forward KL over the teacher's top-k tokens)"""
    topk: Optional[int] = 32
    """k of forward_kl_topk: how many of the teacher's most likely tokens per position it scores"""
    use_task_rewards: bool = True
    """true: loss = task loss + distillation_loss_coef x distillation loss; false: the distillation loss alone
    (the task's policy loss, entropy bonus and KL loss are dropped; rewards are still scored and logged)"""
    distillation_loss_coef: float = 1.0
    """weight of the distillation loss when use_task_rewards=true"""
    loss_max_clamp: Optional[float] = None
    """clamp every per-token distillation loss to [-c, c]; null = no clamp"""
    log_prob_min_clamp: Optional[float] = None
    """forward_kl_topk: clamp the student's and teacher's top-k log-probs below at this value; null = none"""
    use_policy_gradient: bool = False
    """false: back-propagate the aggregated loss itself (GKD); true: use -loss as a per-token advantage in a
    PPO-clipped policy loss (on-policy distillation as a reward)"""
    policy_loss_mode: str = "vanilla"
    """the policy loss of use_policy_gradient=true: only vanilla, as in verl 0.9.1"""
    clip_ratio: float = 0.2
    """PPO clip range of use_policy_gradient=true"""
    clip_ratio_low: float = 0.2
    """lower clip range of use_policy_gradient=true"""
    clip_ratio_high: float = 0.2
    """upper clip range of use_policy_gradient=true"""


def _default_teachers() -> dict[str, Any]:
    return {"teacher_model": {"key": None, "model_path": None}}


@dataclass
class DistillationConfig:
    """``distillation``: train the policy toward frozen teacher models on its own samples."""

    enabled: bool = False
    """score every training sample with a teacher and add the distillation loss to the actor's update
    (validation samples are not scored, as in verl)"""
    teacher_key: str = "data_source"
    """with several teachers, the sample field that names each sample's teacher (its teacher's key)"""
    teacher_models: dict[str, Any] = field(default_factory=_default_teachers)
    """the teachers, by name: <name>.model_path (a model directory or hub id sharing the student's
    tokenizer) and <name>.key (its routing key; a single teacher takes every sample, whatever its key).
    With more than one entry the default teacher_model entry is dropped, as in verl. A teacher runs in the
    actor's worker processes next to the reference (sharded and offloaded like it under FSDP2), so verl's
    <name>.num_replicas and <name>.inference.* (its vLLM / SGLang teacher server) have no effect here"""
    distillation_loss: DistillationLossSection = field(default_factory=DistillationLossSection)
    """the loss"""
