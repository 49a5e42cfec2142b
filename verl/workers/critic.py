"""The critic: per-token value estimates V(s_t) and their clipped regression onto the returns.

Data parallel like the actor (see `verl.workers.actor`): each rank fits its shard, DDP all-reduces the
gradients, and the loss normalisation and metrics use counts and sums over all ranks.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from verl.algorithms import compute_value_loss, masked_mean
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
from verl.workers.engine.scoring import ValueScorer, response_mask_of
from verl.workers.engine.trained import TrainedModel


def response_values(scorer: torch.nn.Module, micro: DataProto) -> torch.Tensor:
    """V of the state before each response token, ``[rows, response_length]``, zero at padding.
    ``scorer`` is a `ValueScorer` (or DDP around one); a plain value model is wrapped in a padded one."""
    if not isinstance(unwrap(scorer), ValueScorer):
        scorer = ValueScorer(scorer)
    b = micro.batch
    return scorer(b["input_ids"], b["attention_mask"], b["position_ids"], response_mask_of(micro))


class Critic(TrainedModel):
    """Computes values and updates the value model (mini-batches, micro-batches, value clipping).

    ``self.module`` is the value model, ``self.scorer`` the `ValueScorer` around it (packed when
    ``remove_padding``), ``self.model`` what is trained (the scorer, in DDP when data parallel).
    """

    def __init__(
        self, model: torch.nn.Module, config: Any, *args: Any, remove_padding: bool = False, **kwargs: Any
    ) -> None:
        scorer = ValueScorer(unwrap(model), remove_padding)
        super().__init__(model, config, *args, scorer=scorer, **kwargs)

    @torch.no_grad()
    def compute_values(
        self, data: DataProto, micro_batch_size: int | None, max_tokens: int | None = None
    ) -> torch.Tensor:
        """Values of ``data``'s responses, ``micro_batch_size`` rows or at most ``max_tokens`` real
        tokens (dynamic batch size) per forward pass."""
        was_training = self.module.training
        self.module.eval()
        micros, order = micro_batches(data, micro_batch_size, max_tokens)
        values = [response_values(self.scorer, micro) for micro in micros]
        self.module.train(was_training)
        return restore_order(torch.cat(values), order)

    def update_critic(
        self,
        data: DataProto,
        mini_batch_size: int,
        micro_batch_size: int,
        epochs: int,
        max_tokens: int | None = None,
    ) -> dict:
        """``epochs`` passes of clipped value regression over mini-batches of this rank's shard ``data``.

        ``mini_batch_size`` is GLOBAL (each rank takes ``mini_batch_size // world_size`` rows),
        ``micro_batch_size`` PER RANK (or ``max_tokens`` real tokens), as in `Actor.update_policy`. Every
        rank returns the same metrics.
        """
        cfg = self.config
        self.model.train()
        keys = [
            "responses",
            "input_ids",
            "attention_mask",
            "position_ids",
            "response_mask",
            "values",
            "returns",
        ]
        data = data.select(batch_keys=keys)
        local_mini = local_mini_batch_size(mini_batch_size, len(data))
        metrics: dict[str, list[float]] = defaultdict(list)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator).item())
        for mini in data.make_iterator(local_mini, epochs=epochs, seed=seed, shuffle=cfg.shuffle):
            self.optimizer.zero_grad(set_to_none=True)
            counts = all_reduce_sum({"tokens": mini.batch["response_mask"].sum().item(), "seqs": len(mini)})
            agg = {"global_num_tokens": counts["tokens"], "global_num_seqs": counts["seqs"]}
            totals: dict[str, float] = defaultdict(float)
            micros, _ = micro_batches(mini, micro_batch_size, max_tokens)
            for i, micro in enumerate(micros):
                with gradient_sync(self.model, sync=i == len(micros) - 1):
                    self._micro_step(micro, agg, totals)
            # Each rank holds its shares of the global mini-batch's metrics: their sum is the global value.
            for key, value in all_reduce_sum(totals).items():
                metrics[key].append(value)
            grad_norm, stepped = clip_and_step(self.model, self.optimizer, cfg.grad_clip)
            record_optimizer_step(metrics, "critic", grad_norm, stepped)
        if self.lr_scheduler is not None:
            metrics["critic/lr"].append(self.lr_scheduler.get_last_lr()[0])
            self.lr_scheduler.step()
        return summarize_metrics(metrics)

    def _micro_step(self, micro: DataProto, agg: dict[str, float], totals: dict[str, float]) -> None:
        """Forward + backward one micro-batch; adds its share of each mini-batch metric into ``totals``."""
        cfg = self.config
        mask = micro.batch["response_mask"]
        vpreds = response_values(self.model, micro)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds,
            micro.batch["returns"],
            micro.batch["values"],
            mask,
            cfg.cliprange_value,
            cfg.loss_agg_mode,
            **agg,
        )
        # DDP averages gradients over ranks; the world-size factor makes it the sum of the shares.
        (vf_loss * dp_world_size()).backward()
        share = mask.sum().item() / max(agg["global_num_tokens"], 1)
        totals["critic/vf_loss"] += vf_loss.item()
        totals["critic/vf_clipfrac"] += vf_clipfrac.item() * share
        totals["critic/vpred_mean"] += masked_mean(vpreds, mask).item() * share
