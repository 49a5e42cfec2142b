"""The plan of an RL step: which passes exist, decided once from the config and logged at the start."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from verl.algorithms import estimator_needs, get_kl_controller
from verl.algorithms.distillation import get_distillation_loss_settings
from verl.algorithms.rollout_correction import correction_enabled
from verl.config import DerivedSizes, TrainerConfig
from verl.config.backends import training_strategy
from verl.config.validation_distillation import distillation_enabled
from verl.models.loading import resolve_dtype
from verl.models.lora import lora_enabled
from verl.models.plumbing import resolve_device
from verl.utils.precision import actor_compute_choice
from verl.workers.rollout import get_rollout_class

OldLogProbs = Literal["recompute", "from_rollout", "not_needed"]


def critic_enabled(config: TrainerConfig) -> bool:
    """Whether the run trains a critic: ``critic.enable``, or by default when the estimator needs values (GAE;
    verl's rule)."""
    if config.critic.enable is None:
        return estimator_needs(config.algorithm.adv_estimator).critic
    return bool(config.critic.enable)


@dataclass(frozen=True)
class StepPlan:
    """What one RL step does, derived from the config by :meth:`from_config`; the step function reads it."""

    n: int
    """responses per prompt (``rollout.n``): one group each"""
    old_log_probs: OldLogProbs
    """where π_old comes from: ``recompute`` (an extra forward pass), ``from_rollout`` (the engine returned
    the sampling log-probs; the weights have not changed since) or ``not_needed`` (one optimizer step per RL
    step: the update's own detached log-probs are π_old)"""
    ref: bool
    """a KL term (in the reward or in the loss) needs the frozen reference policy's log-probs"""
    critic: bool
    """a value model is trained and scores the batch (GAE and friends)"""
    remax_baseline: bool
    """ReMax: the reward of one greedy response per prompt is its group's baseline"""
    refill_until_varied: bool
    """DAPO dynamic sampling: groups whose rewards all agree are dropped and more prompts generated"""
    balance: bool
    """reorder the batch so every data-parallel rank gets about the same number of tokens"""
    critic_warmup: int
    """the first ``critic_warmup`` steps train only the critic"""
    total_steps: int
    sizes: DerivedSizes
    algorithm: Any
    """the ``algorithm`` config section (estimator, KL penalty, dynamic sampling settings)"""
    kl_ctrl: Any
    """the in-reward KL coefficient controller (its state changes every step); None without that KL term"""
    train_batch_size: int
    """prompts per step (``data.train_batch_size``): the groups dynamic sampling must fill"""
    rollout_ahead: float | None = None
    """trainer.v1.trainer_mode=separate_async: batches the rollout role generates ahead, 1.5 for a fractional
    window (None: synchronous)"""
    streaming: str | None = None
    """fully async (staleness_threshold > 0) or colocate_async: what the rollout's pool holds (None: no pool)"""
    entropy_from_rollout: bool = False
    """every sample is drawn by the current policy, so the entropies a rollout engine returns with them
    (``rollout_entropys``: the fast engine's) are the actor's and give ``actor/entropy`` when no old-log-prob pass
    measures it: the update then needs no forward pass of its own for it (`verl.trainer.advantage.entropy_source`)"""
    loss_agg_mode: str = "token-mean"
    """``actor.loss_agg_mode``: ``actor/entropy`` is aggregated as the actor's loss is (verl's rule)"""
    loss_scale_factor: float | None = None
    """``actor.loss_scale_factor``, for the same aggregation"""
    teacher: bool = False
    """on-policy distillation: the teachers score the batch (``teacher_logprobs`` / ``teacher_ids``) for the
    actor's distillation loss"""
    teacher_topk: int = 0
    """how many of the teacher's top tokens per position it returns (forward_kl_topk); 0 = the sampled token's
    log-prob only (the estimator losses)"""
    source: Any = field(default=None, compare=False, repr=False)
    """the :class:`verl.trainer.sources.BatchSource` the step takes its batch from, chosen by the trainer mode
    (``verl.trainer.pool_source.source_for``; None: generate now)"""

    @classmethod
    def from_config(cls, config: TrainerConfig, sizes: DerivedSizes, total_steps: int) -> StepPlan:
        algo = config.algorithm
        actor = config.actor_rollout_ref.actor
        return cls(
            n=config.actor_rollout_ref.rollout.n,
            old_log_probs=_old_log_probs(config, sizes),
            ref=algo.use_kl_in_reward or actor.use_kl_loss,
            critic=critic_enabled(config),
            remax_baseline=estimator_needs(algo.adv_estimator).greedy_baseline,
            refill_until_varied=algo.filter_groups.enable,
            balance=config.trainer.balance_batch and sizes.dp_size > 1,
            critic_warmup=config.trainer.critic_warmup,
            total_steps=total_steps,
            sizes=sizes,
            algorithm=algo,
            kl_ctrl=get_kl_controller(algo.kl_ctrl) if algo.use_kl_in_reward else None,
            train_batch_size=config.data.train_batch_size,
            rollout_ahead=_rollout_ahead(config),
            streaming=_streaming(config),
            entropy_from_rollout=not stale_samples(config),
            loss_agg_mode=actor.loss_agg_mode,
            loss_scale_factor=actor.loss_scale_factor,
            teacher=distillation_enabled(config),
            teacher_topk=_teacher_topk(config),
        )

    def update_actor(self, step: int) -> bool:
        """Critic warm-up: the policy waits while the value function is fitted first."""
        return step > self.critic_warmup

    def progress(self, step: int) -> float:
        """Fraction of training done before ``step`` (1-based), in [0, 1]: drives clip-ratio schedules."""
        return (step - 1) / max(1, self.total_steps - 1)

    def describe(self) -> str:
        passes = [f"old log-probs: {self.old_log_probs}"]
        teacher = f"teacher (top-{self.teacher_topk})" if self.teacher_topk else "teacher"
        passes += [
            name
            for name, on in (("reference", self.ref), (teacher, self.teacher), ("critic", self.critic))
            if on
        ]
        passes += [name for name, on in self._extras() if on]
        return f"step plan: {self.n} responses per prompt; " + ", ".join(passes)

    def _extras(self) -> list[tuple[str, bool]]:
        return [
            ("ReMax greedy baseline", self.remax_baseline),
            ("dynamic sampling", self.refill_until_varied),
            ("token balance across ranks", self.balance),
            (f"separate rollout role, {self.rollout_ahead} batch(es) ahead", self.rollout_ahead is not None),
            (f"streaming rollout, {self.streaming}", self.streaming is not None),
            (f"critic warm-up {self.critic_warmup} steps", self.critic and self.critic_warmup > 0),
            (
                _describe_correction(self.algorithm.rollout_correction),
                correction_enabled(self.algorithm.rollout_correction),
            ),
        ]


def _teacher_topk(config: TrainerConfig) -> int:
    """``distillation_loss.topk`` for a top-k loss (forward_kl_topk), else 0; 0 without distillation."""
    if not distillation_enabled(config):
        return 0
    loss = config.distillation.distillation_loss  # (checked when the config loaded)
    return int(loss.topk) if get_distillation_loss_settings(loss.loss_mode).use_topk else 0


def _describe_correction(rc: Any) -> str:
    """``rollout correction (decoupled: token IS ≤ 2.0, reject seq_mean_k1)`` and the like, for the plan line."""
    parts = []
    if rc.rollout_is is not None and rc.rollout_is_threshold is not None:
        parts.append(f"{rc.rollout_is} IS {rc.rollout_is_threshold}")
    if rc.rollout_rs is not None:
        parts.append(f"reject {rc.rollout_rs} {rc.rollout_rs_threshold}")
    mode = f"bypass, {rc.loss_type}" if rc.bypass_mode else "decoupled"
    return f"rollout correction ({mode}{': ' if parts else ''}{', '.join(parts)})"


def _old_log_probs(config: TrainerConfig, sizes: DerivedSizes) -> OldLogProbs:
    """``actor.recompute_old_log_prob``: true / false as set; unset (null) recomputes with an engine that holds
    its own weights (vllm), else only when something needs π_old and the engine did not return it."""
    recompute = config.actor_rollout_ref.actor.recompute_old_log_prob
    correction = config.algorithm.rollout_correction
    rollout_cls = get_rollout_class(config.actor_rollout_ref.rollout.name)
    if correction.bypass_mode:  # π_old := π_rollout (validation refused recompute_old_log_prob=true)
        # hf returns them when asked (calculate_log_probs=true; refused with dummy, which has no model)
        if (
            not rollout_cls.returns_log_probs
            and config.actor_rollout_ref.rollout.calculate_log_probs is not True
        ):
            raise ValueError(
                f"algorithm.rollout_correction.bypass_mode=true takes π_old from the rollout's log-probs, and "
                f"rollout.name={config.actor_rollout_ref.rollout.name} returns none: use fast or vllm, or hf "
                "with actor_rollout_ref.rollout.calculate_log_probs=true"
            )
        return "from_rollout"
    if correction_enabled(correction):  # decoupled: π_old must be the trainer's own
        return "recompute"
    if recompute is not None:
        return "recompute" if recompute else "not_needed"
    if rollout_cls.owns_weights:
        # An engine with its own weights and kernels (vllm) samples from a slightly different distribution:
        # π_old is the trainer's, and the pass measures the mismatch (training/rollout_probs_diff_*).
        return "recompute"
    needed = sizes.optimizer_steps_per_rl_step != 1 or config.algorithm.use_kl_in_reward
    if not needed:
        return "not_needed"
    if not rollout_cls.returns_log_probs or reduced_precision(config) or stale_samples(config):
        # (batches generated ahead: the rollout's log-probs are an older policy's; bypass mode alone takes them)
        return "recompute"
    return "from_rollout"


def stale_samples(config: TrainerConfig) -> bool:
    """Whether some samples may be drawn by an older policy than the one trained: batches generated ahead,
    or a streaming rollout (generations carried over updates)."""
    v1 = config.trainer.v1
    if v1.trainer_mode == "colocate_async":
        return True
    return (_rollout_ahead(config) or 0) > 0 or (
        v1.trainer_mode == "separate_async" and config.async_training.staleness_threshold > 0
    )


def _rollout_ahead(config: TrainerConfig) -> float | None:
    v1 = config.trainer.v1
    return v1.separate_async.num_warmup_batches if v1.trainer_mode == "separate_async" else None


def reduced_precision(config: TrainerConfig) -> bool:
    """Whether the actor computes in bf16 / fp16 (its weights' dtype, or FSDP2's mixed precision: bf16 on a
    GPU unless set), or trains LoRA adapters under the plain strategy's bf16 autocast. The rollout engine's
    log-probs equal the actor's only in fp32: in a reduced precision the engine's decode step and the actor's
    forward round differently, so π_old is recomputed. With LoRA the gap is the adapter's: the engine decodes
    with the adapters merged into its weights and rounded without bias (`verl.models.lora.round_merged`),
    where the actor's forward adds the LoRA branch to a rounded bf16 output and loses much of a small update."""
    arr = config.actor_rollout_ref
    if resolve_dtype(arr.model.torch_dtype) != torch.float32:
        return True
    if training_strategy(config) != "fsdp2":
        return lora_enabled(arr.model) and actor_compute_choice(config).dtype not in (None, torch.float32)
    param_dtype = arr.actor.fsdp_config.mixed_precision.param_dtype
    if param_dtype is None:
        return resolve_device(config.trainer.device).type == "cuda"
    return resolve_dtype(param_dtype) != torch.float32


def _streaming(config: TrainerConfig) -> str | None:
    v1, fully = config.trainer.v1, config.async_training
    if v1.trainer_mode == "colocate_async":
        return f"on the actor's workers, {v1.colocate_async.num_warmup_batches} batch(es) more in flight"
    if v1.trainer_mode == "separate_async" and fully.staleness_threshold > 0:
        partial = "partial rollouts" if fully.partial_rollout else "no partial rollouts"
        return f"staleness_threshold {fully.staleness_threshold}, {partial}"
    return None
