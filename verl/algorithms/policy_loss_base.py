"""What every policy loss shares: the registry, the loss context and the aggregation.

`verl.algorithms.policy_losses` (vanilla, GSPO, SAPO, GPG, CISPO) and
`verl.algorithms.policy_losses_extra` (Clip-Cov, KL-Cov, GMPO) both import from here, and from
nothing else of each other's.

A loss is ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) -> (loss, metrics)``, verl's signature. verl passes its ``ActorConfig`` as
``config``; here it is a :class:`LossContext`, which has the attributes verl's losses read
(``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c`` / ``get("clip_ratio_c", ..)``,
``tau_pos``, ``tau_neg``, ``policy_loss.<option>`` and ``global_batch_info``), so a loss written for
verl runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.algorithms.core import agg_loss
from verl.config.schema import PolicyLossConfig
from verl.utils.registry import Registry

POLICY_LOSS_REGISTRY = Registry("policy loss (actor_rollout_ref.actor.policy_loss.loss_mode)")


def register_policy_loss(name: str) -> Callable:
    """Decorator: make a loss available as ``actor.policy_loss.loss_mode=<name>``."""
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    return POLICY_LOSS_REGISTRY.lookup(name)


@dataclass(frozen=True)
class LossContext:
    """Everything a policy loss reads besides its tensors, fixed for one mini-batch.

    Built by the actor for each mini-batch (`verl.workers.actor.loss_context`): the clip ranges already
    scaled by the clip-ratio schedule, and the token / sequence counts of the whole (global) mini-batch,
    with which micro-batch losses add up to the mini-batch loss (see `agg_loss`).
    """

    clip_ratio: float = 0.2
    """PPO clip range ε"""
    clip_ratio_low: float | None = None
    """ε_low; None = ``clip_ratio`` (resolved on construction, so a built context always holds a number)"""
    clip_ratio_high: float | None = None
    """ε_high (DAPO's clip-higher); None = ``clip_ratio`` (resolved likewise)"""
    clip_ratio_c: float = 3.0
    """dual-clip constant c (> 1) for negative advantages"""
    loss_agg_mode: str = "token-mean"
    """the actor's aggregation mode (entropy and KL terms use it too)"""
    loss_scale_factor: float | None = None
    """constant divisor of ``seq-mean-token-sum-norm``; None = the response length"""
    global_num_tokens: float | None = None
    """real response tokens of the global mini-batch; None = the micro-batch's own count"""
    global_num_seqs: float | None = None
    """sequences of the global mini-batch; None = the micro-batch's own count"""
    tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages"""
    tau_neg: float = 1.05
    """SAPO gate temperature for negative advantages"""
    policy_loss: Any = field(default_factory=PolicyLossConfig)
    """``actor.policy_loss``: the Clip-Cov / KL-Cov options (clip_cov_ratio, clip_cov_lb, clip_cov_ub,
    kl_cov_ratio, ppo_kl_coef), where verl keeps them"""
    seed: int | None = None
    """Clip-Cov's random draw: None = torch's global RNG; a seed draws the same tokens on every call (tests)"""

    def __post_init__(self) -> None:
        for key in ("clip_ratio_low", "clip_ratio_high"):
            if getattr(self, key) is None:
                object.__setattr__(self, key, self.clip_ratio)

    @property
    def global_batch_info(self) -> dict[str, float | None]:
        """The keyword arguments of `agg_loss` beyond the mode: ``agg_loss(..., **config.global_batch_info)``,
        as verl's losses call it."""
        return {
            "loss_scale_factor": self.loss_scale_factor,
            "global_num_tokens": self.global_num_tokens,
            "global_num_seqs": self.global_num_seqs,
        }

    def get(self, key: str, default: Any = None) -> Any:
        """``config.get(key, default)``, as verl's losses read optional settings (e.g. ``clip_ratio_c``)."""
        return getattr(self, key, default)


DEFAULT_CONTEXT = LossContext()
"""What a loss called without ``config`` uses: the actor config's defaults, no global counts."""


def aggregate_pg_losses(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: LossContext,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Weight per-token losses by the rollout importance weights (when given), then aggregate."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)
