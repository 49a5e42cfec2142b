"""The critic: per-token value estimates V(s_t) and their clipped regression onto the returns."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from verl.algorithms import compute_value_loss, masked_mean
from verl.protocol import DataProto
from verl.workers.engine.optim import clip_and_step


def response_values(model: torch.nn.Module, micro: DataProto) -> torch.Tensor:
    """V of the state before each response token: the head's output at the position that predicts it."""
    response_length = micro.batch["responses"].shape[1]
    out = model(
        input_ids=micro.batch["input_ids"],
        attention_mask=micro.batch["attention_mask"],
        position_ids=micro.batch["position_ids"],
        use_cache=False,
    ).logits.squeeze(-1)
    return out[:, -response_length - 1 : -1].float() * micro.batch["response_mask"]


class Critic:
    """Computes values and updates the value model (mini-batches, micro-batches, value clipping)."""

    def __init__(self, model: torch.nn.Module, config: Any, optimizer=None, lr_scheduler=None) -> None:
        self.model = model
        self.config = config
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler

    @torch.no_grad()
    def compute_values(self, data: DataProto, micro_batch_size: int | None) -> torch.Tensor:
        was_training = self.model.training
        self.model.eval()
        values = [
            response_values(self.model, micro)
            for micro in (data.split(micro_batch_size) if micro_batch_size else [data])
        ]
        self.model.train(was_training)
        return torch.cat(values)

    def update_critic(
        self, data: DataProto, mini_batch_size: int, micro_batch_size: int, epochs: int
    ) -> dict:
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
        metrics: dict[str, list[float]] = defaultdict(list)
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        for mini in data.make_iterator(mini_batch_size, epochs=epochs, seed=seed, shuffle=cfg.shuffle):
            self.optimizer.zero_grad(set_to_none=True)
            num_tokens = mini.batch["response_mask"].sum().item()
            agg = {"global_num_tokens": num_tokens, "global_num_seqs": len(mini)}
            totals: dict[str, float] = defaultdict(float)
            for micro in mini.split(micro_batch_size):
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
                vf_loss.backward()
                share = mask.sum().item() / max(num_tokens, 1)
                totals["critic/vf_loss"] += vf_loss.item()
                totals["critic/vf_clipfrac"] += vf_clipfrac.item() * share
                totals["critic/vpred_mean"] += masked_mean(vpreds, mask).item() * share
            grad_norm, stepped = clip_and_step(self.model, self.optimizer, cfg.grad_clip)
            if not stepped:
                metrics["critic/skipped_steps"].append(1.0)
            metrics["critic/grad_norm"].append(grad_norm)
            for key, value in totals.items():
                metrics[key].append(value)
        if self.lr_scheduler is not None:
            metrics["critic/lr"].append(self.lr_scheduler.get_last_lr()[0])
            self.lr_scheduler.step()
        return {k: float(sum(v) / len(v)) for k, v in metrics.items()}
