"""The actor: log-probabilities of responses and the policy loss of one micro-batch.

The update itself (mini-batches, micro-batches, data-parallel all-reduces, clipping, the optimizer step)
is the loop shared with the critic, `verl.workers.engine.update_loop`; the actor supplies the
`LossContext` of each mini-batch and the loss of each micro-batch (policy loss, entropy bonus, KL loss).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from verl.algorithms import LossContext, agg_loss, anneal, get_policy_loss_fn, kl_penalty
from verl.algorithms.distillation import (
    METRIC_AGGREGATION,
    DistillationLossOptions,
    combine_with_policy_loss,
    distillation_loss,
    forward_kl_topk,
    needs_policy_loss,
)
from verl.algorithms.rollout_correction import compute_rollout_correction
from verl.protocol import DataProto
from verl.workers.engine.batching import lockstep_micro_batches, restore_order
from verl.workers.engine.distributed import dp_world_size, unwrap
from verl.workers.engine.fsdp import needs_lockstep
from verl.workers.engine.scoring import PolicyScorer, response_mask_of
from verl.workers.engine.trained import TrainedModel
from verl.workers.engine.update_loop import RoleUpdate, UpdatePlan, run_update, share_of_tokens

UPDATE_KEYS = ("responses", "input_ids", "attention_mask", "position_ids", "response_mask", "advantages")
OPTIONAL_UPDATE_KEYS = (
    "old_log_probs",
    "ref_log_prob",
    "rollout_is_weights",
    "teacher_logprobs",
    "teacher_ids",
)
DISTILLATION_PREFIX = "actor/"
"""the actor logs verl's ``distillation/*`` metrics as ``actor/distillation/*``"""


def response_logprobs(
    scorer: torch.nn.Module,
    micro: DataProto,
    temperature: float,
    with_entropy: bool,
    at_ids: torch.Tensor | None = None,
) -> (
    tuple[torch.Tensor, torch.Tensor | None]
    | tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]
):
    """log p of each response token (logits divided by the sampling temperature), and the entropies when
    asked for: ``[rows, response_length]``, zero at padding. ``scorer`` is a `PolicyScorer` (or DDP
    around one); a plain causal LM is wrapped in a padded one.

    With ``at_ids`` (``[rows, response_length, k]``, a distillation teacher's top-k ids) a third item holds, from
    the same forward pass, the log-probs at those ids (``at_ids_log_probs``, with gradients) and each position's
    own top-k ids (``topk_ids``), as `PolicyScorer` returns them."""
    if not isinstance(unwrap(scorer), PolicyScorer):
        scorer = PolicyScorer(scorer)
    b = micro.batch
    head = {} if at_ids is None else {"at_ids": at_ids, "topk": at_ids.shape[-1]}
    return scorer(
        b["input_ids"],
        b["attention_mask"],
        b["position_ids"],
        b["responses"],
        response_mask_of(micro),
        temperature,
        with_entropy,
        **head,
    )


@torch.no_grad()
def compute_log_prob(
    scorer: PolicyScorer,
    data: DataProto,
    micro_batch_size: int | None,
    temperature: float,
    with_entropy: bool = False,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``data``'s responses under ``scorer`` (the actor's or the frozen
    reference's), ``micro_batch_size`` rows or (with ``max_tokens``, verl's dynamic batch size) at most
    ``max_tokens`` real tokens per forward pass; the model runs in eval mode and is put back after."""
    # Inference needs no gradient all-reduce: the plain scorer, not DDP.
    hf_model = scorer.hf_model
    was_training = hf_model.training
    hf_model.eval()
    log_probs, entropies = [], []
    micros, order, real = lockstep_micro_batches(data, micro_batch_size, max_tokens, needs_lockstep(scorer))
    for micro in micros:
        lp, ent = response_logprobs(scorer, micro, temperature, with_entropy)
        log_probs.append(lp)
        entropies.append(ent)
    log_probs, entropies = log_probs[:real], entropies[:real]  # the rest kept an FSDP rank in step
    hf_model.train(was_training)
    entropy = restore_order(torch.cat(entropies), order) if with_entropy else None
    return restore_order(torch.cat(log_probs), order), entropy


LOSSES_PROPORTIONAL_TO_ADVANTAGE = ("vanilla", "gspo", "sapo", "gpg", "cispo", "geo_mean")
"""policy losses that are the advantage times a function of the sample's own tokens: a sample whose
advantage is 0 everywhere has zero loss and zero gradient (clip_cov / kl_cov choose tokens by a covariance
over the batch, so they are not here)"""


def zero_advantage_rows(data: DataProto) -> torch.Tensor:
    """Rows whose advantage is 0 on every response token: no policy gradient comes from them."""
    return ~((data.batch["advantages"] != 0) & data.batch["response_mask"].bool()).any(-1)


def loss_context(
    actor_cfg: Any, clip_scale: float, global_num_tokens: float, global_num_seqs: float
) -> LossContext:
    """The `LossContext` of one mini-batch, the ``config`` every policy loss receives, shaped like verl's
    ``ActorConfig``: the actor config's loss settings, the clip ranges scaled by the clip-ratio schedule
    (``clip_scale``), and in ``global_batch_info`` verl's four values for this mini-batch: ``dp_size`` (the
    data-parallel ranks), ``batch_num_tokens`` (valid response tokens of the global mini-batch, summed over
    the ranks), ``global_batch_size`` (its sequences, likewise) and ``loss_scale_factor``. Other attributes
    a loss written for verl reads (``config.entropy_coeff``) come from the actor config."""
    options = actor_cfg.policy_loss
    clip_ratio = actor_cfg.clip_ratio
    low = actor_cfg.clip_ratio_low if actor_cfg.clip_ratio_low is not None else clip_ratio
    high = actor_cfg.clip_ratio_high if actor_cfg.clip_ratio_high is not None else clip_ratio
    return LossContext(
        clip_ratio=clip_ratio * clip_scale,
        clip_ratio_low=low * clip_scale,
        clip_ratio_high=high * clip_scale,
        clip_ratio_c=actor_cfg.clip_ratio_c,
        loss_agg_mode=actor_cfg.loss_agg_mode,
        loss_scale_factor=actor_cfg.loss_scale_factor,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        dp_size=dp_world_size(),
        tau_pos=options.tau_pos,
        tau_neg=options.tau_neg,
        policy_loss=options,
        actor=actor_cfg,
    )


def policy_loss_result(result: Any, loss_fn: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(loss, metrics)`` as a policy loss returns it in verl 0.9; anything else (e.g. verl's older
    ``(loss, clipfrac, ppo_kl, clipfrac_lower)``) is a TypeError naming the function."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result
    name = getattr(loss_fn, "__qualname__", repr(loss_fn))
    raise TypeError(
        f"policy loss {name} returned {type(result).__name__}"
        f"{f' of {len(result)} items' if isinstance(result, tuple) else ''}; a policy loss returns "
        "(loss, metrics dict), as in verl 0.9"
    )


def distillation_reductions() -> dict[str, str]:
    """The actor's ``distillation/*`` metrics that combine over micro-batches and ranks by min or max
    (`METRIC_AGGREGATION`); the rest are sums of shares."""
    return {
        f"{DISTILLATION_PREFIX}{key}": how for key, how in METRIC_AGGREGATION.items() if how in ("min", "max")
    }


def add_distillation_metrics(metrics: dict[str, float], values: dict[str, float], share: float) -> None:
    """Add one micro-batch's ``distillation/*`` metrics into ``metrics`` as ``actor/distillation/*``: a sum as it
    is, a mean weighted by the micro-batch's share of the tokens, a min / max kept as the running min / max."""
    for key, value in values.items():
        name, how = f"{DISTILLATION_PREFIX}{key}", METRIC_AGGREGATION.get(key, "mean")
        if how == "min":
            metrics[name] = min(metrics[name], value) if name in metrics else value
        elif how == "max":
            metrics[name] = max(metrics[name], value) if name in metrics else value
        else:
            metrics[name] += float(value) * (1.0 if how == "sum" else share)


class Actor(TrainedModel):
    """Computes log-probs and updates the policy from a batch with advantages.

    ``hf_model`` is the causal LM (shared with the rollout), ``scorer`` the `PolicyScorer` around it,
    ``trained`` the scorer in DDP when data parallel (see TrainedModel). ``remove_padding`` packs each
    micro-batch, ``share_prompts`` computes each distinct prompt once, ``chunk_size`` bounds the tokens
    whose full logits exist at once (see `verl.workers.engine.scoring`).
    """

    def __init__(
        self,
        hf_model: torch.nn.Module,
        config: Any,
        *args: Any,
        remove_padding: bool = False,
        chunk_size: int = 0,
        share_prompts: bool = False,
        compute_dtype: torch.dtype | None = None,
        distillation: DistillationLossOptions | None = None,
        **kwargs: Any,
    ) -> None:
        scorer = PolicyScorer(unwrap(hf_model), remove_padding, chunk_size, share_prompts, compute_dtype)
        super().__init__(hf_model, config, *args, scorer=scorer, **kwargs)
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        self.distillation = distillation
        """``distillation.distillation_loss`` when on-policy distillation is on (the batches then carry
        ``teacher_logprobs`` / ``teacher_ids``), else None"""

    def compute_log_prob(
        self,
        data: DataProto,
        micro_batch_size: int | None,
        temperature: float,
        with_entropy: bool = False,
        max_tokens: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`compute_log_prob` under the current policy."""
        with self.resident():
            return compute_log_prob(
                self.scorer, data, micro_batch_size, temperature, with_entropy, max_tokens
            )

    def clip_scale(self, progress: float) -> float:
        """Factor applied to the clip ranges at this point of training (1 without a schedule)."""
        cfg = self.config
        if cfg.clip_ratio_final is None:
            return 1.0
        return (
            anneal(cfg.clip_ratio, cfg.clip_ratio_final, progress, cfg.clip_ratio_schedule) / cfg.clip_ratio
        )

    def update_policy(self, data: DataProto, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Update the policy from ``data`` (arguments as `plan_update`); the metrics, the same on every rank."""
        return run_update(self, self.plan_update(data, *args, **kwargs))

    def plan_update(
        self,
        data: DataProto,
        mini_batch_size: int,
        micro_batch_size: int | None,
        temperature: float,
        progress: float = 0.0,
        max_tokens: int | None = None,
        measure_entropy: bool = False,
        bypass_correction: Any = None,
    ) -> RoleUpdate[LossContext]:
        """A PPO-style update for `run_update`: ``ppo_epochs`` passes over mini-batches, each accumulated
        over micro-batches.

        ``data`` is this rank's shard; sizes as `UpdatePlan` (``mini_batch_size`` global,
        ``micro_batch_size`` / ``max_tokens`` per rank). ``progress`` (fraction of training done) drives
        the clip-ratio schedule; ``measure_entropy`` computes ``actor/entropy`` in this forward pass even
        without an entropy bonus (when no old-log-prob pass measured it). ``bypass_correction`` is
        ``algorithm.rollout_correction`` in bypass mode (π_old is π_rollout; see `micro_batch_loss`).
        """
        cfg = self.config
        clip_scale = self.clip_scale(progress)
        keys = [*UPDATE_KEYS, *(k for k in OPTIONAL_UPDATE_KEYS if k in data.batch)]
        data = data.select(batch_keys=keys)
        if self.distillation is not None and "teacher_logprobs" not in data.batch:
            raise ValueError(
                "distillation.enabled=true but the batch has no teacher_logprobs: a custom step must call "
                "compute_teacher_log_prob (see verl.trainer.step.train_on)"
            )
        if "old_log_probs" not in data.batch and (
            cfg.ppo_epochs != 1 or mini_batch_size // dp_world_size() != len(data)
        ):
            raise ValueError(
                "old_log_probs are missing but the update is not on-policy (more than one optimizer step per "
                "RL step); set actor_rollout_ref.actor.recompute_old_log_prob=true"
            )
        closing = {"actor/kl_coef": cfg.kl_loss_coef} if cfg.use_kl_loss else {}
        closing["actor/clip_ratio"] = cfg.clip_ratio * clip_scale
        use_entropy = cfg.entropy_coeff != 0 or measure_entropy
        skip = (
            cfg.skip_zero_advantage
            and cfg.policy_loss.loss_mode in LOSSES_PROPORTIONAL_TO_ADVANTAGE
            and not cfg.use_kl_loss
            and cfg.entropy_coeff == 0
            # batch-normalised weights are normalised over the micro-batch's rows: every row must be there
            and not (bypass_correction is not None and bypass_correction.rollout_is_batch_normalize)
            # a row with zero task advantage still has the teacher's gradient
            and self.distillation is None
        )
        return RoleUpdate(
            data,
            UpdatePlan(
                mini_batch_size, micro_batch_size, cfg.ppo_epochs, max_tokens, cfg.shuffle, cfg.grad_clip
            ),
            "actor",
            functools.partial(loss_context, cfg, clip_scale),
            functools.partial(
                self.micro_batch_loss,
                temperature=temperature,
                use_entropy=use_entropy,
                bypass_correction=bypass_correction,
            ),
            closing,
            no_gradient=zero_advantage_rows if skip else None,
            # On-policy the ratio is 1, so a skipped row's ppo_kl and clip fractions are exactly 0.
            metrics_need_forward=use_entropy or "old_log_probs" in data.batch,
            loss_includes_dp_size=True,  # the losses aggregate with global_batch_info["dp_size"], as verl's
            metric_reductions=distillation_reductions() if self.distillation is not None else {},
        )

    def micro_batch_loss(
        self,
        micro: DataProto,
        context: LossContext,
        metrics: dict[str, float],
        temperature: float,
        use_entropy: bool,
        bypass_correction: Any = None,
    ) -> torch.Tensor:
        """The loss to backward for one micro-batch: the task loss (policy loss, minus the entropy bonus, plus the
        KL loss), and with on-policy distillation the distillation loss combined with it
        (`combine_with_policy_loss`). Each is aggregated with ``context.global_batch_info`` (verl's convention:
        this rank's share of the global mini-batch loss times ``dp_size``); adds the micro-batch's share of each
        metric into ``metrics``."""
        mask = micro.batch["response_mask"]
        share = share_of_tokens(mask, context.global_num_tokens)
        student = self._student_pass(micro, temperature, use_entropy)
        log_prob, entropy = student["log_probs"], student.get("entropy")
        # On-policy (one optimizer step per RL step) the sampling policy is the current one: ratio = 1.
        old_log_prob = micro.batch["old_log_probs"] if "old_log_probs" in micro.batch else log_prob.detach()
        # Decoupled rollout correction: weights computed once per batch by the trainer (π_old vs π_rollout).
        weights = micro.batch["rollout_is_weights"] if "rollout_is_weights" in micro.batch else None
        task_loss = None
        if self.distillation is None or needs_policy_loss(self.distillation):
            task_loss = self._task_loss(
                micro, context, metrics, share, log_prob, old_log_prob, weights, bypass_correction
            )
        if use_entropy:
            entropy_loss = agg_loss(entropy, mask, context.loss_agg_mode, **context.global_batch_info)
            if self.config.entropy_coeff != 0 and task_loss is not None:
                task_loss = task_loss - self.config.entropy_coeff * entropy_loss
            metrics["actor/entropy"] += entropy_loss.item() / context.dp_size
        if task_loss is not None and self.config.use_kl_loss:
            kl = kl_penalty(log_prob, micro.batch["ref_log_prob"], self.config.kl_loss_type)
            kl_loss = agg_loss(kl, mask, context.loss_agg_mode, **context.global_batch_info)
            task_loss = task_loss + self.config.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] += kl_loss.item() / context.dp_size
        if self.distillation is None:
            return task_loss
        data = {
            "response_mask": mask,
            "teacher_logprobs": micro.batch["teacher_logprobs"],
            "old_log_probs": old_log_prob,
            "rollout_is_weights": weights,
        }
        distill_loss, distill_metrics = distillation_loss(
            self.distillation, student, data, context.loss_agg_mode, context.global_batch_info
        )
        metrics[f"{DISTILLATION_PREFIX}distillation/loss"] += distill_loss.item() / context.dp_size
        add_distillation_metrics(metrics, distill_metrics, share)
        return combine_with_policy_loss(task_loss, distill_loss, self.distillation)

    def _student_pass(
        self, micro: DataProto, temperature: float, use_entropy: bool
    ) -> dict[str, torch.Tensor]:
        """The forward pass: ``log_probs`` and (``use_entropy``) ``entropy``; for a top-k distillation loss also
        the student's side of `forward_kl_topk` at the teacher's ids, from the same logits."""
        topk = self.distillation is not None and self.distillation.settings.use_topk
        if not topk:
            log_prob, entropy = response_logprobs(self.trained, micro, temperature, with_entropy=use_entropy)
            return {"log_probs": log_prob, "entropy": entropy}
        teacher_ids = micro.batch["teacher_ids"]
        log_prob, entropy, head = response_logprobs(
            self.trained, micro, temperature, with_entropy=use_entropy, at_ids=teacher_ids
        )
        student = forward_kl_topk(
            head["at_ids_log_probs"],
            micro.batch["teacher_logprobs"],
            teacher_ids,
            head["topk_ids"],
            self.distillation.log_prob_min_clamp,
        )
        return {"log_probs": log_prob, "entropy": entropy, **student}

    def _task_loss(
        self,
        micro: DataProto,
        context: LossContext,
        metrics: dict[str, float],
        share: float,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        weights: torch.Tensor | None,
        bypass_correction: Any,
    ) -> torch.Tensor:
        """The configured policy loss of the micro-batch (with the bypass-mode correction when on), and its
        ``actor/pg_*`` metrics."""
        mask = micro.batch["response_mask"]
        loss_fn, loss_mask = self.policy_loss_fn, mask
        if bypass_correction is not None and bool(mask.any()):
            loss_fn, loss_mask, weights = self._bypass_correction(
                bypass_correction, log_prob, old_log_prob, mask, metrics, share
            )
        # verl's call: keyword arguments, a bool mask, the verl-shaped context as ``config``.
        pg_loss, pg_metrics = policy_loss_result(
            loss_fn(
                old_log_prob=old_log_prob,
                log_prob=log_prob,
                advantages=micro.batch["advantages"],
                response_mask=loss_mask.bool(),
                loss_agg_mode=context.loss_agg_mode,
                config=context,
                rollout_is_weights=weights,
            ),
            loss_fn,
        )
        # Losses are already normalised by mini-batch counts, so their micro-batch values add up (over the
        # ranks too, once the dp_size factor is taken out); the per-token means of the loss function are
        # weighted by this micro-batch's share of the tokens.
        metrics["actor/pg_loss"] += pg_loss.item() / context.dp_size
        for k, v in pg_metrics.items():
            metrics[k] += float(v) * share
        return pg_loss

    def _bypass_correction(
        self,
        correction: Any,
        log_prob: torch.Tensor,
        rollout_log_prob: torch.Tensor,
        mask: torch.Tensor,
        metrics: dict[str, float],
        share: float,
    ) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
        """verl's ``bypass_mode`` loss: π_old is π_rollout, so the correction is measured against the current
        policy on each micro-batch. (loss function, mask after rejection, IS weights to apply).

        ``reinforce``: −A·w·log π_θ (the ``gpg`` loss with the weights). ``ppo_clip``: the configured loss;
        its clipped ratio π_θ/π_rollout is the correction, so the weights are measured, not applied.
        """
        with torch.no_grad():
            weights, loss_mask, corr_metrics = compute_rollout_correction(
                log_prob.detach(), rollout_log_prob, mask, correction
            )
        for k, v in corr_metrics.items():
            metrics[k] += v * share
        if correction.loss_type == "reinforce":
            return get_policy_loss_fn("gpg"), loss_mask, weights
        return self.policy_loss_fn, loss_mask, None
