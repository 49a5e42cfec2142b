"""On-policy distillation (OPD): the per-token divergence of the student from a teacher, and the loss made of it.

The student samples responses; a frozen teacher scores them (`verl.workers.teacher`); the student is trained
toward the teacher at the states it visited itself (Agarwal et al. 2024, "On-policy distillation of language
models", arXiv 2306.13649; Lu & Thinking Machines Lab 2025, "On-Policy Distillation"). Names, key names
(``distillation.distillation_loss.*``), formulas and metric names are verl 0.9.1's
(``verl/trainer/distillation/losses.py``, ``verl/trainer/distillation/fsdp/losses.py``).

Two families of per-token losses, one registered function each (``loss_mode``):

* single-sample estimators of the reverse KL(π_θ‖ν) from the sampled token's log-probs (``k1``/``kl``,
  ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl``): `compute_distillation_loss_reverse_kl_estimator`;
* ``forward_kl_topk``: the forward KL(ν‖π_θ) over the **teacher's** top-k tokens, not renormalised
  (`forward_kl_topk`, `compute_forward_kl_topk`).

The per-token losses are used either directly (``use_policy_gradient=false``: aggregated with `agg_loss` and
the actor's ``loss_agg_mode``, GKD) or as a reward (``use_policy_gradient=true``: −loss is the per-token
advantage of a PPO-clipped policy loss, PG OPD), and then combined with the task's policy loss
(`combine_with_policy_loss`). All tensors are (batch, response_length) unless said otherwise; top-k tensors
add a last dimension k.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from verl.algorithms.core import agg_loss, masked_mean
from verl.algorithms.kl import kl_penalty
from verl.algorithms.policy_loss_base import LossContext, get_policy_loss_fn
from verl.utils.registry import Registry

logger = logging.getLogger(__name__)

DistillationLossFn = Callable[
    ["DistillationLossOptions", Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]],
    tuple[torch.Tensor, dict[str, float]],
]
"""``fn(loss_config, model_output, data) -> (per-token losses, metrics)``, verl's contract without the actor
config: ``model_output`` holds the student's tensors, ``data`` the batch's (``response_mask``, the teacher's)."""

DISTILLATION_LOSS_REGISTRY = Registry("distillation loss (distillation.distillation_loss.loss_mode)")
DISTILLATION_SETTINGS_REGISTRY: dict[str, DistillationLossSettings] = {}
_NULLABLE = ("topk", "loss_max_clamp", "log_prob_min_clamp")

METRIC_AGGREGATION = {
    "distillation/loss": "sum",
    "distillation/loss_min": "min",
    "distillation/loss_max": "max",
    "distillation/student_mass_min": "min",
    "distillation/student_mass_max": "max",
    "distillation/teacher_mass_min": "min",
    "distillation/teacher_mass_max": "max",
}
"""How a metric combines over micro-batches (verl's ``AggregationType``); any other ``distillation/*`` metric
is a mean over tokens (weigh it by the micro-batch's share of the tokens). ``distillation/loss`` is already
normalised by the global mini-batch's counts, so its micro-batch values add up, like ``actor/pg_loss``."""


@dataclass(frozen=True)
class DistillationLossSettings:
    """What a registered loss needs from the teacher (verl's class of the same name): exactly one of
    ``use_topk`` (the teacher's top-k ids and log-probs) or ``use_estimator`` (the sampled token's log-prob)."""

    names: tuple[str, ...]
    use_topk: bool = False
    use_estimator: bool = False

    def __post_init__(self) -> None:
        if self.use_topk == self.use_estimator:
            raise ValueError(f"expected exactly one of use_topk / use_estimator, got {self}")


def register_distillation_loss(settings: DistillationLossSettings) -> Callable[[DistillationLossFn], Any]:
    """Decorator: make a loss available as ``distillation.distillation_loss.loss_mode=<name>`` for each name."""

    def decorator(fn: DistillationLossFn) -> DistillationLossFn:
        for name in settings.names:
            DISTILLATION_LOSS_REGISTRY.register(name)(fn)
            DISTILLATION_SETTINGS_REGISTRY[name] = settings
        return fn

    return decorator


def get_distillation_loss_fn(name: str) -> DistillationLossFn:
    return DISTILLATION_LOSS_REGISTRY.lookup(name)


def get_distillation_loss_settings(name: str) -> DistillationLossSettings:
    DISTILLATION_LOSS_REGISTRY.lookup(name)  # an unknown name: the registry's error, naming the closest
    return DISTILLATION_SETTINGS_REGISTRY[name]


@dataclass(frozen=True)
class DistillationLossOptions:
    """``distillation.distillation_loss``: verl 0.9.1's keys with the defaults of its YAML
    (``verl/trainer/config/distillation/distillation.yaml``), which is what a verl run starts from."""

    loss_mode: str = "k3"
    topk: int | None = 32
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    log_prob_min_clamp: float | None = None
    use_policy_gradient: bool = False
    policy_loss_mode: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2

    @classmethod
    def of(cls, section: Any) -> DistillationLossOptions:
        """The options of a config section (OmegaConf node, dataclass, mapping or None = the defaults),
        checked as verl's ``DistillationLossConfig.__post_init__`` checks them. Keys not listed above (verl's
        ``use_chunked_topk``, ``global_batch_info``, ...) are ignored."""
        if isinstance(section, cls):
            return section
        missing = object()
        values = {}
        for f in fields(cls):
            if isinstance(section, Mapping):
                value = section.get(f.name, missing)
            else:
                value = getattr(section, f.name, missing)
            # A key set to null keeps null where verl allows it (topk, the clamps), else the default.
            if value is not missing and (value is not None or f.name in _NULLABLE):
                values[f.name] = value
        options = cls(**values)
        options.check()
        return options

    @property
    def settings(self) -> DistillationLossSettings:
        return get_distillation_loss_settings(self.loss_mode)

    def check(self) -> None:
        """verl's rules: only the ``vanilla`` policy loss for PG OPD; k1 cannot be back-propagated (its gradient
        does not depend on the teacher); top-k needs ``topk``; top-k as a reward only warns."""
        settings = self.settings
        if self.policy_loss_mode != "vanilla":
            raise NotImplementedError(
                "distillation.distillation_loss.policy_loss_mode: only vanilla is supported (as in verl 0.9.1), "
                f"got {self.policy_loss_mode!r}"
            )
        if not self.use_policy_gradient and self.loss_mode == "k1":
            raise ValueError(
                "distillation.distillation_loss.loss_mode=k1 with use_policy_gradient=false: the gradient of the "
                "k1 loss does not depend on the teacher's log-probs; use k3 or forward_kl_topk, or "
                "use_policy_gradient=true"
            )
        if settings.use_topk and (self.topk is None or self.topk < 1):
            raise ValueError(f"distillation.distillation_loss.topk must be >= 1 for {self.loss_mode}")
        if self.use_policy_gradient and settings.use_topk:
            logger.warning(
                "forward_kl_topk is most effective as a supervised loss (use_policy_gradient=false): a policy "
                "gradient moves only the sampled token's log-prob, so the top-k signal is largely unused"
            )


# ---------------------------------------------------------------------------------------------- estimators


@register_distillation_loss(
    DistillationLossSettings(names=("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"), use_estimator=True)
)
def compute_distillation_loss_reverse_kl_estimator(
    loss_config: DistillationLossOptions,
    model_output: Mapping[str, torch.Tensor],
    data: Mapping[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """Single-sample estimators of the reverse KL(π_θ‖ν) at each sampled token y_t ~ π_θ (Schulman 2020,
    "Approximating KL divergence"), with Δ = log π_θ(y_t) − log ν(y_t) (`verl.algorithms.kl.kl_penalty` with
    the teacher as the reference, as verl calls it):

    ``k1``/``kl``: Δ;  ``abs``: |Δ|;  ``k2``/``mse``: ½Δ²;  ``k3``/``low_var_kl``: e^{−Δ} + Δ − 1 (Δ clamped to
    ±20, the value to [−10, 10]). k3 is unbiased and ≥ 0, and its gradient w.r.t. log π_θ is 1 − e^{−Δ}:
    descending it raises log π_θ(y_t) where the teacher likes y_t more (Δ < 0) and lowers it where less.

    ``model_output["log_probs"]``: the student's; ``data["teacher_logprobs"]``: the teacher's, (B, T) or
    (B, T, 1). Metric ``distillation/abs_loss``: mean |loss| over response tokens (k1 can be negative).
    """
    student = model_output["log_probs"]
    teacher = data["teacher_logprobs"]
    if teacher.dim() == student.dim() + 1:
        teacher = teacher.squeeze(-1)
    if teacher.shape != student.shape:
        raise ValueError(
            f"teacher_logprobs {tuple(teacher.shape)} != student log_probs {tuple(student.shape)}"
        )
    losses = kl_penalty(student, teacher.to(student.dtype), loss_config.loss_mode)
    mask = data["response_mask"].bool()
    return losses, {"distillation/abs_loss": masked_mean(losses.detach().abs(), mask).item()}


# ------------------------------------------------------------------------------------------------- top-k


def student_topk_log_probs(
    student_logits: torch.Tensor, teacher_topk_ids: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's log-probs at the teacher's top-k ids, ``(..., k)`` (gradients flow), and the student's own
    top-k ids (for the overlap metrics only), from its logits ``(..., V)`` divided by the sampling temperature
    as verl's engine does before the top-k loss. log-softmax in fp32."""
    logits = student_logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = F.log_softmax(logits, dim=-1)
    own_ids = torch.topk(log_probs.detach(), k=teacher_topk_ids.shape[-1], dim=-1).indices
    return log_probs.gather(-1, teacher_topk_ids.long()), own_ids


def forward_kl_topk(
    student_topk_log_probs: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    teacher_topk_ids: torch.Tensor | None = None,
    student_topk_ids: torch.Tensor | None = None,
    log_prob_min_clamp: float | None = None,
) -> dict[str, torch.Tensor]:
    """Forward KL over the teacher's top-k tokens S_t = TopK(ν(·|s_t)) (GKD, Agarwal et al. 2024), not
    renormalised (verl's ``compute_forward_kl_topk``):

        L_t = Σ_{v ∈ S_t} ν(v) · (log ν(v) − log π_θ(v))

    Inputs are ``(..., k)``: the teacher's top-k log-probs and the student's log-probs at the same ids. Both
    are clamped below by ``log_prob_min_clamp`` when set (after the masses are taken). Because both
    distributions are cut to S_t, L_t can be negative (the caller clamps it at 0, see
    `compute_forward_kl_topk`). Returns per position ``distillation_losses``, ``student_mass`` = Σ_S π_θ,
    ``teacher_mass`` = Σ_S ν and, with both id sets given, the overlap diagnostics of Li et al. 2026
    (arXiv 2604.13016): ``overlap_count`` = |S_t ∩ TopK(π_θ)| and ``overlap_token_advantage`` = the mean of
    −ν(v)(log ν(v) − log π_θ(v)) over the overlapping v (0 where none overlap).
    """
    student = student_topk_log_probs.float()
    teacher = teacher_topk_log_probs.float()
    out = {"student_mass": student.exp().sum(-1), "teacher_mass": teacher.exp().sum(-1)}
    if log_prob_min_clamp is not None:
        student = student.clamp_min(log_prob_min_clamp)
        teacher = teacher.clamp_min(log_prob_min_clamp)
    token_kl = teacher.exp() * (teacher - student)
    out["distillation_losses"] = token_kl.sum(-1)
    if teacher_topk_ids is not None and student_topk_ids is not None:
        overlap = (teacher_topk_ids.unsqueeze(-1) == student_topk_ids.unsqueeze(-2)).any(-1)
        count = overlap.sum(-1)
        advantage = (-token_kl.detach() * overlap).sum(-1) / count.clamp_min(1)
        out["overlap_count"] = count
        out["overlap_token_advantage"] = torch.where(count > 0, advantage, torch.zeros_like(advantage))
    return out


@register_distillation_loss(DistillationLossSettings(names=("forward_kl_topk",), use_topk=True))
def compute_forward_kl_topk(
    loss_config: DistillationLossOptions,
    model_output: Mapping[str, torch.Tensor],
    data: Mapping[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """The ``forward_kl_topk`` loss and its metrics from `forward_kl_topk`'s outputs in ``model_output``
    (computed where the student's logits exist, verl's "logits processor"); the losses clamped at 0.

    Metrics (means over response tokens, min / max over them): ``distillation/student_mass{,_min,_max}``,
    ``distillation/teacher_mass{,_min,_max}``, and with the overlap tensors ``distillation/overlap_ratio``
    (mean overlap_count / k) and ``distillation/overlap_token_advantage`` (mean over positions with overlap).
    """
    mask = data["response_mask"].bool()
    losses = model_output["distillation_losses"]
    metrics: dict[str, float] = {}
    for name in ("student_mass", "teacher_mass"):
        values = model_output[name].detach()[mask]
        if values.numel():
            metrics[f"distillation/{name}"] = values.float().mean().item()
            metrics[f"distillation/{name}_min"] = values.min().item()
            metrics[f"distillation/{name}_max"] = values.max().item()
    count = model_output.get("overlap_count")
    advantage = model_output.get("overlap_token_advantage")
    if count is not None and advantage is not None and mask.any():
        k = loss_config.topk
        metrics["distillation/overlap_ratio"] = count[mask].float().mean().item() / k
        overlapping = mask & (count > 0)
        metrics["distillation/overlap_token_advantage"] = (
            advantage[overlapping].float().mean().item() if overlapping.any() else 0.0
        )
    return losses.clamp_min(0.0), metrics


# ------------------------------------------------------------------------------------------ the loss


def distillation_advantages(distillation_losses: torch.Tensor) -> torch.Tensor:
    """PG OPD's per-token reward, used as the advantage as is (no baseline, no whitening): A_t = −sg(L_t), the
    negative reverse-KL estimate (Lu & Thinking Machines Lab 2025): tokens the teacher likes more than the
    student get a positive advantage."""
    return -distillation_losses.detach()


def distillation_loss(
    loss_config: DistillationLossOptions,
    model_output: Mapping[str, torch.Tensor],
    data: Mapping[str, torch.Tensor],
    loss_agg_mode: str = "token-mean",
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The aggregated distillation loss of one micro-batch and its metrics (verl's ``distillation_loss``).

    1. per-token losses L from the registered ``loss_mode``; ``distillation/loss_min``/``loss_max`` over the
       response tokens (before the clamp);
    2. L clamped to [−c, c] with c = ``loss_max_clamp`` when set;
    3. ``use_policy_gradient=false`` (GKD): agg_loss(L, mask, loss_agg_mode, **global_batch_info);
       ``use_policy_gradient=true`` (PG OPD): the ``policy_loss_mode`` loss (vanilla PPO clip with the
       distillation's ``clip_ratio_low``/``clip_ratio_high``, dual-clip c = 3) with advantages −sg(L),
       π_old = ``data["old_log_probs"]`` (or the detached current log-probs, on-policy) and
       ``data["rollout_is_weights"]`` when present; its metrics renamed ``actor/x`` → ``distillation/x``.

    ``global_batch_info``: the actor's `agg_loss` counts (``dp_size``, ``batch_num_tokens``,
    ``global_batch_size``, ``loss_scale_factor``); None = this micro-batch's own.
    """
    loss_fn = get_distillation_loss_fn(loss_config.loss_mode)
    losses, metrics = loss_fn(loss_config, model_output, data)
    mask = data["response_mask"].bool()
    if mask.any():
        valid = losses.detach()[mask]
        metrics["distillation/loss_min"] = valid.min().item()
        metrics["distillation/loss_max"] = valid.max().item()
    if loss_config.loss_max_clamp is not None:
        losses = losses.clamp(min=-loss_config.loss_max_clamp, max=loss_config.loss_max_clamp)
    info = dict(global_batch_info or {})
    if not loss_config.use_policy_gradient:
        return agg_loss(losses, mask, loss_agg_mode, **info), metrics
    log_prob = model_output["log_probs"]
    old = data.get("old_log_probs")
    context = LossContext(
        clip_ratio=loss_config.clip_ratio,
        clip_ratio_low=loss_config.clip_ratio_low,
        clip_ratio_high=loss_config.clip_ratio_high,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=info.get("loss_scale_factor"),
        global_num_tokens=info.get("batch_num_tokens"),
        global_num_seqs=info.get("global_batch_size"),
        dp_size=info.get("dp_size", 1),
    )
    loss, pg_metrics = get_policy_loss_fn(loss_config.policy_loss_mode)(
        old_log_prob=log_prob.detach() if old is None else old,
        log_prob=log_prob,
        advantages=distillation_advantages(losses),
        response_mask=mask,
        loss_agg_mode=loss_agg_mode,
        config=context,
        rollout_is_weights=data.get("rollout_is_weights"),
    )
    metrics.update({f"distillation/{k.removeprefix('actor/')}": float(v) for k, v in pg_metrics.items()})
    return loss, metrics


def needs_policy_loss(loss_config: DistillationLossOptions) -> bool:
    """Whether verl computes the task's policy loss at all: not when neither task rewards nor the policy
    gradient is on (pure GKD, verl's ``distillation_only``)."""
    return loss_config.use_task_rewards or loss_config.use_policy_gradient


def combine_with_policy_loss(
    policy_loss: torch.Tensor | float | None,
    distill_loss: torch.Tensor,
    loss_config: DistillationLossOptions,
) -> torch.Tensor:
    """The loss to back-propagate (verl's ``distillation_ppo_loss``):

    ``use_task_rewards=true``:  L = L_policy + λ·L_distill, λ = ``distillation_loss_coef``;
    ``use_task_rewards=false``: L = L_distill (the whole task loss, with its entropy and KL-loss terms,
    is dropped; λ is not applied).

    ``policy_loss`` is the actor's whole task loss of the micro-batch (policy loss, entropy bonus, KL loss);
    None or 0 when `needs_policy_loss` is false.
    """
    if not loss_config.use_task_rewards or policy_loss is None:
        return distill_loss
    return policy_loss + loss_config.distillation_loss_coef * distill_loss


__all__ = [
    "DISTILLATION_LOSS_REGISTRY",
    "METRIC_AGGREGATION",
    "DistillationLossOptions",
    "DistillationLossSettings",
    "combine_with_policy_loss",
    "compute_distillation_loss_reverse_kl_estimator",
    "compute_forward_kl_topk",
    "distillation_advantages",
    "distillation_loss",
    "forward_kl_topk",
    "get_distillation_loss_fn",
    "get_distillation_loss_settings",
    "needs_policy_loss",
    "register_distillation_loss",
    "student_topk_log_probs",
]
