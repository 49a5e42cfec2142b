"""``PPOTrainer``: PPO with a critic on batches you bring, on top of an ``ActorRolloutRefWorker``.

The Python API of seed 001::

    trainer = PPOTrainer(actor_rollout_ref_worker=worker,
                         config=dict(kl_coef=0.1, cliprange_value=0.2, ppo_epochs=1, mini_batch_size=1))
    loss_dict = trainer.step(batch)     # batch: input_ids, attention_mask, prompt_mask, reward (one per row)
    loss_dict["policy_loss"], loss_dict["value_loss"]

One step, with verl's registered algorithms (nothing re-derived here):

1. once, without gradients: the actor's log-probs of the response tokens (the "old" policy), the
   worker's reference log-probs, the value model's values;
2. rewards per token: the row's ``reward`` on its last response token, minus ``kl_coef`` x KL(actor ‖ ref)
   on every response token (``algorithm.use_kl_in_reward``, estimator ``kl_penalty``);
3. advantages and returns: the ``gae`` estimator (``gamma``, ``lam``);
4. ``ppo_epochs`` passes over the batch, one optimizer step per ``mini_batch_size`` rows: the registered
   policy loss (``loss_mode``, PPO clip by default) for the actor plus the clipped value loss for the critic.

The value model is built from the actor's model directory (``verl.models.load_value_model``: the same
backbone with a new scalar head), or from ``critic_path``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl.algorithms import (
    LossContext,
    compute_value_loss,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    kl_penalty,
    masked_mean,
)
from verl.config import ConfigError, suggest_key
from verl.models import load_value_model
from verl.trainer.base import BaseTrainer, Batch, model_outputs, response_mask, token_log_probs


@dataclass(frozen=True)
class PPOConfig:
    """``PPOTrainer(config=...)``: each key is named after the verl key it mirrors."""

    kl_coef: float = 0.001
    """β of the KL penalty in the reward (``algorithm.kl_ctrl.kl_coef``); 0 = no reference policy needed"""
    kl_penalty: str = "kl"
    """KL estimator of that penalty (``algorithm.kl_penalty``): kl | abs | mse | low_var_kl"""
    cliprange_value: float = 0.5
    """value clipping (``critic.cliprange_value``): new values move at most this far from the old ones"""
    ppo_epochs: int = 1
    """passes over each batch (``actor.ppo_epochs``)"""
    mini_batch_size: int | None = None
    """rows per optimizer step (verl's ``ppo_mini_batch_size`` counts prompts); None = the whole batch"""
    clip_ratio: float = 0.2
    """PPO clip range ε (``actor.clip_ratio``)"""
    loss_mode: str = "vanilla"
    """registered policy loss (``actor.policy_loss.loss_mode``)"""
    loss_agg_mode: str = "token-mean"
    """aggregation of the policy and value losses (``actor.loss_agg_mode``)"""
    gamma: float = 1.0
    """discount (``algorithm.gamma``)"""
    lam: float = 1.0
    """GAE λ (``algorithm.lam``)"""
    lr: float = 1e-6
    """actor learning rate (``actor.optim.lr``)"""
    critic_lr: float = 1e-5
    """value-model learning rate (``critic.optim.lr``)"""
    grad_clip: float = 1.0
    """max gradient norm of each model (``actor.grad_clip``, ``critic.grad_clip``)"""
    critic_path: str | None = None
    """value model directory (``critic.model.path``); None = the actor's model directory"""

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None) -> PPOConfig:
        """Build from a dict; an unknown key is an error naming the nearest valid one."""
        config, names = dict(config or {}), [f.name for f in dataclasses.fields(cls)]
        for key in config:
            if key not in names:
                hint = suggest_key(key, cls)
                raise ConfigError(
                    f"PPOTrainer config: unknown key {key!r}"
                    + (f"; did you mean {hint!r}?" if hint else f"; valid keys: {', '.join(names)}")
                )
        return cls(**config)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` that never trains (the reference policy)."""
    return copy.deepcopy(model).eval().requires_grad_(False)


class PPOTrainer(BaseTrainer):
    """PPO on the worker's actor (``worker.actor_model``) with a value model of its own.

    ``config`` is a dict of :class:`PPOConfig` keys (or a PPOConfig). When ``kl_coef`` is not 0 the KL
    penalty reads the worker's frozen reference policy (``worker.ref_model``), or, when the worker built
    none (its config has no KL term), a frozen copy of the actor as it is when the trainer is built.
    """

    def __init__(
        self, actor_rollout_ref_worker: Any, config: Mapping[str, Any] | PPOConfig | None = None
    ) -> None:
        self.config = config if isinstance(config, PPOConfig) else PPOConfig.from_dict(config)
        cfg = self.config
        self.actor = actor_rollout_ref_worker.actor_model
        self.ref = None
        if cfg.kl_coef:
            # The worker builds a reference only when its own config has a KL term; else the reference is
            # the policy as the trainer starts, which is what the worker's copy would have been.
            self.ref = actor_rollout_ref_worker.ref_model
            if self.ref is None:
                self.ref = frozen_copy(self.actor)
        first = next(self.actor.parameters())
        self.critic = load_value_model(
            cfg.critic_path or self.actor.name_or_path, torch_dtype=first.dtype
        ).to(first.device)
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for p in self.actor.parameters() if p.requires_grad], "lr": cfg.lr},
                {"params": list(self.critic.parameters()), "lr": cfg.critic_lr},
            ]
        )
        super().__init__(
            {"actor": self.actor, "critic": self.critic},
            optimizer,
            epochs=cfg.ppo_epochs,
            mini_batch_size=cfg.mini_batch_size,
            grad_clip=cfg.grad_clip,
        )
        self.policy_loss = get_policy_loss_fn(cfg.loss_mode)
        self.loss_context = LossContext(clip_ratio=cfg.clip_ratio, loss_agg_mode=cfg.loss_agg_mode)

    def values(self, batch: Batch) -> torch.Tensor:
        """``(rows, seq_len - 1)``: the value of the state before each token (zero off the response)."""
        return model_outputs(self.critic, batch)[..., 0].float() * response_mask(batch)

    def prepare(self, batch: Batch) -> Batch:
        """Old log-probs, values, per-token rewards (reward on the last response token, minus the KL
        penalty), then GAE advantages and returns."""
        cfg = self.config
        if "reward" not in batch or batch["reward"].dim() != 1:
            raise KeyError("PPOTrainer needs batch['reward']: one scalar per row, shape (rows,)")
        mask = response_mask(batch)
        old_log_probs = token_log_probs(self.actor, batch) * mask
        values = self.values(batch)
        last = (mask * torch.arange(1, mask.shape[1] + 1, device=mask.device)).argmax(dim=-1)
        scores = torch.zeros_like(mask)
        scores[torch.arange(mask.shape[0]), last] = batch["reward"].to(scores.dtype)
        kl = torch.zeros_like(mask)
        if self.ref is not None:
            kl = kl_penalty(old_log_probs, token_log_probs(self.ref, batch) * mask, cfg.kl_penalty) * mask
        rewards = scores - cfg.kl_coef * kl
        advantages, returns = get_adv_estimator_fn("gae")(
            token_level_rewards=rewards, values=values, response_mask=mask, gamma=cfg.gamma, lam=cfg.lam
        )
        return {
            **batch,
            "response_mask": mask,
            "old_log_probs": old_log_probs,
            "values": values,
            "kl": kl,
            "advantages": advantages,
            "returns": returns,
        }

    def compute_loss(self, batch: Batch) -> dict[str, Any]:
        """Policy loss (actor) + clipped value loss (critic); the two models share no parameters, so one
        backward pass gives each its own loss's gradient."""
        cfg, mask = self.config, batch["response_mask"]
        log_probs = token_log_probs(self.actor, batch)
        policy_loss, metrics = self.policy_loss(
            old_log_prob=batch["old_log_probs"],
            log_prob=log_probs,
            advantages=batch["advantages"],
            response_mask=mask,
            loss_agg_mode=cfg.loss_agg_mode,
            config=self.loss_context,
        )
        value_loss, vf_clipfrac = compute_value_loss(
            vpreds=self.values(batch),
            returns=batch["returns"],
            values=batch["values"],
            response_mask=mask,
            cliprange_value=cfg.cliprange_value,
            loss_agg_mode=cfg.loss_agg_mode,
        )
        return {
            "loss": policy_loss + value_loss,
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "critic/vf_clipfrac": vf_clipfrac,
            "actor/reward_kl_penalty": masked_mean(batch["kl"], mask),
            **metrics,
        }
