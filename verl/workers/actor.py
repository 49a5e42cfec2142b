"""The actor: log-probabilities of responses and the policy update (mini-batches, micro-batches, clipping).

Data parallel with torch.distributed when a process group is up (see `verl.workers.engine.distributed`):
each rank updates from its own shard of the batch, DDP all-reduces the gradients, and the loss
normalisation and metrics use counts and sums over all ranks, so the update equals the one-process
update of the whole batch. With one process nothing of this is active.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from verl.algorithms import agg_loss, anneal, get_policy_loss_fn, kl_penalty
from verl.algorithms.policy_losses import agg_kwargs
from verl.protocol import DataProto
from verl.workers.engine.batching import micro_batches, restore_order
from verl.workers.engine.distributed import (
    all_reduce_sum,
    dp_world_size,
    gradient_sync,
    local_mini_batch_size,
    unwrap,
)
from verl.workers.engine.optim import clip_and_step, record_optimizer_step, summarize_metrics
from verl.workers.engine.scoring import PolicyScorer, response_mask_of
from verl.workers.engine.trained import TrainedModel


def response_logprobs(
    scorer: torch.nn.Module, micro: DataProto, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p of each response token (logits divided by the sampling temperature), and the entropies when
    asked for: ``[rows, response_length]``, zero at padding. ``scorer`` is a `PolicyScorer` (or DDP
    around one); a plain causal LM is wrapped in a padded one."""
    if not isinstance(unwrap(scorer), PolicyScorer):
        scorer = PolicyScorer(scorer)
    b = micro.batch
    return scorer(
        b["input_ids"],
        b["attention_mask"],
        b["position_ids"],
        b["responses"],
        response_mask_of(micro),
        temperature,
        with_entropy,
    )


class Actor(TrainedModel):
    """Computes log-probs and updates the policy from a batch with advantages.

    ``self.module`` is the HF model (shared with the rollout), ``self.scorer`` the `PolicyScorer` around
    it that computes log-probs, ``self.model`` what is trained (the scorer, in DDP when data parallel);
    a reference actor has no optimizer and is never wrapped (see TrainedModel). ``remove_padding``
    packs each micro-batch, ``share_prompts`` computes each distinct prompt once, ``chunk_size``
    bounds the tokens whose full logits exist at once (see `verl.workers.engine.scoring`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: Any,
        *args: Any,
        remove_padding: bool = False,
        chunk_size: int = 0,
        share_prompts: bool = False,
        **kwargs: Any,
    ) -> None:
        scorer = PolicyScorer(unwrap(model), remove_padding, chunk_size, share_prompts)
        super().__init__(model, config, *args, scorer=scorer, **kwargs)
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)

    @torch.no_grad()
    def compute_log_prob(
        self,
        data: DataProto,
        micro_batch_size: int | None,
        temperature: float,
        with_entropy: bool = False,
        max_tokens: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of ``data``'s responses, ``micro_batch_size`` rows or (with
        ``max_tokens``, verl's dynamic batch size) at most ``max_tokens`` real tokens per forward pass."""
        # Inference needs no gradient all-reduce: the plain scorer, not DDP.
        was_training = self.module.training
        self.module.eval()
        log_probs, entropies = [], []
        micros, order = micro_batches(data, micro_batch_size, max_tokens)
        for micro in micros:
            lp, ent = response_logprobs(self.scorer, micro, temperature, with_entropy)
            log_probs.append(lp)
            entropies.append(ent)
        self.module.train(was_training)
        entropy = restore_order(torch.cat(entropies), order) if with_entropy else None
        return restore_order(torch.cat(log_probs), order), entropy

    def clip_scale(self, progress: float) -> float:
        """Factor applied to the clip ranges at this point of training (1 without a schedule)."""
        cfg = self.config
        if cfg.clip_ratio_final is None:
            return 1.0
        return (
            anneal(cfg.clip_ratio, cfg.clip_ratio_final, progress, cfg.clip_ratio_schedule) / cfg.clip_ratio
        )

    def update_policy(
        self,
        data: DataProto,
        mini_batch_size: int,
        micro_batch_size: int,
        temperature: float,
        progress: float = 0.0,
        max_tokens: int | None = None,
    ) -> dict:
        """PPO-style update: ``ppo_epochs`` passes over mini-batches, each accumulated over micro-batches.

        ``data`` is this rank's shard. ``mini_batch_size`` is GLOBAL (samples per optimizer step over
        all ranks; each rank takes ``mini_batch_size // world_size`` of its rows), ``micro_batch_size``
        is PER RANK (rows per forward/backward), as verl's ppo_mini_batch_size and
        ppo_micro_batch_size_per_gpu; with ``max_tokens`` (use_dynamic_bsz) micro-batches hold at most
        that many real tokens instead. The loss of each micro-batch is normalised by the token /
        sequence counts of the whole global mini-batch, so the accumulated, all-reduced gradient equals
        that of the global mini-batch in one piece. Every rank returns the same metrics.
        """
        cfg = self.config
        clip_scale = self.clip_scale(progress)
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "advantages"]
        keys += [k for k in ("old_log_probs", "ref_log_prob") if k in data.batch]
        data = data.select(batch_keys=keys)
        local_mini = local_mini_batch_size(mini_batch_size, len(data))
        if "old_log_probs" not in data.batch and (cfg.ppo_epochs != 1 or local_mini != len(data)):
            raise ValueError(
                "old_log_probs are missing but the update is not on-policy (more than one optimizer step per "
                "RL step); set actor_rollout_ref.actor.recompute_old_log_prob=true"
            )
        # Without an old_log_prob pass the entropy metric comes from the update's own forward pass (the
        # trainer says so in meta_info; old log-probs may also have come from the rollout engine).
        measure = data.meta_info.get("measure_entropy", "old_log_probs" not in data.batch)
        use_entropy = cfg.entropy_coeff != 0 or measure
        # Drawn from the actor's own generator: the same on every rank seeded alike, and untouched by
        # whatever else in the process uses torch's global generator.
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator).item())
        for mini in data.make_iterator(local_mini, epochs=cfg.ppo_epochs, seed=seed, shuffle=cfg.shuffle):
            self.optimizer.zero_grad(set_to_none=True)
            counts = all_reduce_sum({"tokens": mini.batch["response_mask"].sum().item(), "seqs": len(mini)})
            loss_cfg = _LossConfig(
                cfg, global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"], clip_scale=clip_scale
            )
            mini_metrics: dict[str, float] = defaultdict(float)
            micros, _ = micro_batches(mini, micro_batch_size, max_tokens)
            for i, micro in enumerate(micros):
                with gradient_sync(self.model, sync=i == len(micros) - 1):
                    self._micro_step(micro, loss_cfg, temperature, use_entropy, mini_metrics)
            # Each rank holds its shares of the global mini-batch's metrics: their sum is the global value.
            for k, v in all_reduce_sum(mini_metrics).items():
                metrics[k].append(v)
            # DDP reduced the gradients during backward: norm, clipping and the non-finite skip see the
            # same gradients, and so decide the same, on every rank.
            grad_norm, stepped = clip_and_step(self.model, self.optimizer, cfg.grad_clip)
            record_optimizer_step(metrics, "actor", grad_norm, stepped)
        if cfg.use_kl_loss:
            metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
        metrics["actor/clip_ratio"].append(cfg.clip_ratio * clip_scale)
        if self.lr_scheduler is not None:
            metrics["actor/lr"].append(self.lr_scheduler.get_last_lr()[0])
            self.lr_scheduler.step()
        return summarize_metrics(metrics)

    def _micro_step(
        self, micro: DataProto, loss_cfg: Any, temperature: float, use_entropy: bool, metrics
    ) -> None:
        """Forward + backward one micro-batch; adds its share of each mini-batch metric into ``metrics``."""
        cfg = self.config
        mask = micro.batch["response_mask"]
        share = mask.sum().item() / max(loss_cfg.global_num_tokens, 1)
        log_prob, entropy = response_logprobs(self.model, micro, temperature, with_entropy=use_entropy)
        # On-policy (one optimizer step per RL step) the sampling policy is the current one: ratio = 1.
        old_log_prob = micro.batch["old_log_probs"] if "old_log_probs" in micro.batch else log_prob.detach()
        pg_loss, pg_metrics = self.policy_loss_fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=micro.batch["advantages"],
            response_mask=mask,
            loss_agg_mode=cfg.loss_agg_mode,
            config=loss_cfg,
            rollout_is_weights=None,
        )
        loss = pg_loss
        agg = {"loss_agg_mode": cfg.loss_agg_mode, **agg_kwargs(loss_cfg)}
        if use_entropy:
            entropy_loss = agg_loss(entropy, mask, **agg)
            if cfg.entropy_coeff != 0:
                loss = loss - cfg.entropy_coeff * entropy_loss
            metrics["actor/entropy"] += entropy_loss.item()
        if cfg.use_kl_loss:
            kl = kl_penalty(log_prob, micro.batch["ref_log_prob"], cfg.kl_loss_type)
            kl_loss = agg_loss(kl, mask, **agg)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] += kl_loss.item()
        # The loss is this rank's share of the global mini-batch loss, and DDP AVERAGES gradients over
        # the ranks; scaling by the world size turns that average into the sum, the global gradient.
        (loss * dp_world_size()).backward()
        # Losses are already normalised by mini-batch counts, so their micro-batch values add up; the
        # per-token means of the loss function are weighted by this micro-batch's share of the tokens.
        metrics["actor/pg_loss"] += pg_loss.item()
        for k, v in pg_metrics.items():
            metrics[k] += v * share


class _LossConfig:
    """The actor config seen by a policy loss, plus the mini-batch counts for micro-batch-invariant aggregation."""

    def __init__(
        self, actor_cfg: Any, global_num_tokens: float, global_num_seqs: int, clip_scale: float = 1.0
    ) -> None:
        self._cfg = actor_cfg
        self.global_num_tokens = global_num_tokens
        self.global_num_seqs = global_num_seqs
        # The clip-ratio schedule scales every clip range by the same factor.
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            value = getattr(actor_cfg, key)
            setattr(self, key, None if value is None else value * clip_scale)

    def __getattr__(self, key: str) -> Any:
        return getattr(self._cfg, key)
