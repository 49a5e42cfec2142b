"""The critic: per-token value estimates V(s_t) and the clipped value loss of one micro-batch.

The update itself is the loop shared with the actor (`verl.workers.engine.update_loop`): each rank fits
its shard, DDP all-reduces the gradients, and the loss normalisation and metrics use counts and sums
over all ranks.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms import compute_value_loss, masked_mean
from verl.protocol import DataProto
from verl.workers.engine.batching import lockstep_micro_batches, restore_order
from verl.workers.engine.distributed import unwrap
from verl.workers.engine.fsdp import needs_lockstep
from verl.workers.engine.scoring import ValueScorer, response_mask_of
from verl.workers.engine.trained import TrainedModel
from verl.workers.engine.update_loop import RoleUpdate, UpdatePlan, run_update, share_of_tokens

UPDATE_KEYS = (
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "values",
    "returns",
)


def response_values(scorer: torch.nn.Module, micro: DataProto) -> torch.Tensor:
    """V of the state before each response token, ``[rows, response_length]``, zero at padding.
    ``scorer`` is a `ValueScorer` (or DDP around one); a plain value model is wrapped in a padded one."""
    if not isinstance(unwrap(scorer), ValueScorer):
        scorer = ValueScorer(scorer)
    b = micro.batch
    return scorer(b["input_ids"], b["attention_mask"], b["position_ids"], response_mask_of(micro))


class Critic(TrainedModel):
    """Computes values and updates the value model (mini-batches, micro-batches, value clipping).

    ``hf_model`` is the value model, ``scorer`` the `ValueScorer` around it (packed when
    ``remove_padding``), ``trained`` the scorer in DDP when data parallel (see TrainedModel).
    """

    def __init__(
        self,
        hf_model: torch.nn.Module,
        config: Any,
        *args: Any,
        remove_padding: bool = False,
        compute_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        scorer = ValueScorer(unwrap(hf_model), remove_padding, compute_dtype)
        super().__init__(hf_model, config, *args, scorer=scorer, **kwargs)

    @torch.no_grad()
    def compute_values(
        self, data: DataProto, micro_batch_size: int | None, max_tokens: int | None = None
    ) -> torch.Tensor:
        """Values of ``data``'s responses, ``micro_batch_size`` rows or at most ``max_tokens`` real
        tokens (dynamic batch size) per forward pass."""
        was_training = self.hf_model.training
        self.hf_model.eval()
        micros, order, real = lockstep_micro_batches(
            data, micro_batch_size, max_tokens, needs_lockstep(self.scorer)
        )
        with self.resident():
            values = [response_values(self.scorer, micro) for micro in micros][:real]
        self.hf_model.train(was_training)
        return restore_order(torch.cat(values), order)

    def update_critic(self, data: DataProto, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Update the value model from ``data`` (arguments as `plan_update`); the metrics, the same on every
        rank."""
        return run_update(self, self.plan_update(data, *args, **kwargs))

    def plan_update(
        self,
        data: DataProto,
        mini_batch_size: int,
        micro_batch_size: int | None,
        epochs: int,
        max_tokens: int | None = None,
    ) -> RoleUpdate[dict[str, float]]:
        """``epochs`` passes of clipped value regression over mini-batches of this rank's shard ``data``, for
        `run_update`; sizes as `UpdatePlan` (``mini_batch_size`` global, ``micro_batch_size`` /
        ``max_tokens`` per rank)."""
        cfg = self.config
        return RoleUpdate(
            data.select(batch_keys=list(UPDATE_KEYS)),
            UpdatePlan(mini_batch_size, micro_batch_size, epochs, max_tokens, cfg.shuffle, cfg.grad_clip),
            "critic",
            lambda tokens, seqs: {"global_num_tokens": tokens, "global_num_seqs": seqs},
            self.micro_batch_loss,
        )

    def micro_batch_loss(
        self, micro: DataProto, counts: dict[str, float], metrics: dict[str, float]
    ) -> torch.Tensor:
        """The clipped value loss of one micro-batch (its share of the mini-batch loss); adds the
        micro-batch's share of each metric into ``metrics``. ``counts`` are the mini-batch's global
        token and sequence counts (`agg_loss`'s keywords)."""
        cfg = self.config
        mask = micro.batch["response_mask"]
        vpreds = response_values(self.trained, micro)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds,
            micro.batch["returns"],
            micro.batch["values"],
            mask,
            cfg.cliprange_value,
            cfg.loss_agg_mode,
            **counts,
        )
        share = share_of_tokens(mask, counts["global_num_tokens"])
        metrics["critic/vf_loss"] += vf_loss.item()
        metrics["critic/vf_clipfrac"] += vf_clipfrac.item() * share
        metrics["critic/vpred_mean"] += masked_mean(vpreds, mask).item() * share
        return vf_loss
