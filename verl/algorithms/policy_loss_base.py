"""What every policy loss shares: the registry, the loss context and the aggregation.

`verl.algorithms.policy_losses` (vanilla, GSPO, SAPO, GPG, CISPO) and
`verl.algorithms.policy_losses_extra` (Clip-Cov, KL-Cov, GMPO) both import from here, and from
nothing else of each other's.

A loss is ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
config=None, rollout_is_weights=None) -> (loss, metrics)``, verl 0.9's signature and return shape.
``config`` is verl's ``ActorConfig`` or anything shaped like it: the actor passes a :class:`LossContext`;
a `verl.algorithms.verl_config.VerlActorConfig` (``verl.workers.config.ActorConfig``), an OmegaConf
section or verl's own dataclass work too. The losses read it only through the helpers below
(:func:`clip_range`, :func:`sapo_taus`, :func:`batch_info`), which accept every one of these shapes; None
means the defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.algorithms.core import agg_loss
from verl.algorithms.external import import_external_modules, same_function
from verl.algorithms.verl_config import ConfigAccess, VerlActorConfig
from verl.config.schema import PolicyLossConfig
from verl.utils.registry import Registry

POLICY_LOSS_REGISTRY = Registry("policy loss (actor_rollout_ref.actor.policy_loss.loss_mode)")


def register_policy_loss(name: str) -> Callable:
    """Decorator: make a loss available as ``actor.policy_loss.loss_mode=<name>``.

    As verl's decorator of the same name (``verl.trainer.ppo.core_algos.register_policy_loss``). Running
    the same file again (a second import of a user's loss file) re-registers its function; a different
    function under a taken name raises."""

    def decorator(fn: Callable) -> Callable:
        same = name in POLICY_LOSS_REGISTRY and same_function(POLICY_LOSS_REGISTRY[name], fn)
        return POLICY_LOSS_REGISTRY.register(name, overwrite=same)(fn)

    return decorator


def get_policy_loss_fn(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    """The loss registered as ``name``; a name not registered yet is looked up again after importing the
    modules of ``VERL_USE_EXTERNAL_MODULES`` (verl's way to load a user's losses; see
    `verl.algorithms.external`)."""
    if name not in POLICY_LOSS_REGISTRY:
        import_external_modules()
    return POLICY_LOSS_REGISTRY.lookup(name)


@dataclass(frozen=True)
class LossContext(ConfigAccess):
    """Everything a policy loss reads besides its tensors, fixed for one mini-batch, shaped like verl's
    ``ActorConfig`` (a virtual subclass of it: ``isinstance(context, ActorConfig)`` holds).

    Built by the actor for each mini-batch (`verl.workers.actor.loss_context`): the clip ranges already
    scaled by the clip-ratio schedule, the token / sequence counts of the whole (global) mini-batch and the
    data-parallel size, with which micro-batch losses add up to the mini-batch loss (see `agg_loss`).
    An attribute it does not hold (``config.entropy_coeff``, ``config.ppo_epochs``) is read from ``actor``,
    the actor's config, when one is given.
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
    """real response tokens of the global mini-batch (verl's ``batch_num_tokens``); None = the call's own"""
    global_num_seqs: float | None = None
    """sequences of the global mini-batch (verl's ``global_batch_size``); None = the call's own"""
    dp_size: int = 1
    """data-parallel ranks: losses are multiplied by it (verl's convention; see `agg_loss`)"""
    tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages"""
    tau_neg: float = 1.05
    """SAPO gate temperature for negative advantages"""
    policy_loss: Any = field(default_factory=PolicyLossConfig)
    """``actor.policy_loss``: the Clip-Cov / KL-Cov options (clip_cov_ratio, clip_cov_lb, clip_cov_ub,
    kl_cov_ratio, ppo_kl_coef), where verl keeps them"""
    seed: int | None = None
    """Clip-Cov's random draw: None = torch's global RNG; a seed draws the same tokens on every call (tests)"""
    actor: Any = None
    """the actor's config: read for any other attribute a loss asks for (None = no others)"""

    def __post_init__(self) -> None:
        for key in ("clip_ratio_low", "clip_ratio_high"):
            if getattr(self, key) is None:
                object.__setattr__(self, key, self.clip_ratio)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes the context does not have itself.
        actor = self.__dict__.get("actor")
        if actor is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(actor, name)

    @property
    def batch_num_tokens(self) -> float | None:
        return self.global_num_tokens

    @property
    def global_batch_size(self) -> float | None:
        return self.global_num_seqs

    @property
    def global_batch_info(self) -> dict[str, Any]:
        """verl's ``config.global_batch_info``: the keyword arguments of `agg_loss` beyond the mode,
        ``agg_loss(..., **config.global_batch_info)``, as verl's losses call it."""
        return {
            "dp_size": self.dp_size,
            "batch_num_tokens": self.global_num_tokens,
            "global_batch_size": self.global_num_seqs,
            "loss_scale_factor": self.loss_scale_factor,
        }


VerlActorConfig.register(LossContext)


def clip_range(config: Any) -> tuple[float, float]:
    """``(ε_low, ε_high)`` of any actor-shaped config: ``clip_ratio_low`` / ``clip_ratio_high``, each
    falling back to ``clip_ratio`` when None, as verl reads them."""
    clip_ratio = config.clip_ratio
    low, high = getattr(config, "clip_ratio_low", None), getattr(config, "clip_ratio_high", None)
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high)


def sapo_taus(config: Any) -> tuple[float, float]:
    """``(τ_pos, τ_neg)``: top level in verl's ActorConfig, under ``policy_loss`` in this project's."""
    options = getattr(config, "policy_loss", None)
    taus = []
    for key, default in (("tau_pos", 1.0), ("tau_neg", 1.05)):
        value = getattr(config, key, None)
        if value is None:
            value = getattr(options, key, None)
        taus.append(float(default if value is None else value))
    return taus[0], taus[1]


def batch_info(config: Any) -> dict[str, Any]:
    """``config.global_batch_info`` as `agg_loss` keywords (verl's keys; empty = the call's own counts)."""
    info = getattr(config, "global_batch_info", None)
    return dict(info) if info else {}


def resolve_config(config: Any) -> Any:
    """The config a loss reads: ``config``, or the defaults when it is None."""
    return DEFAULT_CONTEXT if config is None else config


DEFAULT_CONTEXT = LossContext()
"""What a loss called without ``config`` uses: the actor config's defaults, no global counts."""


def aggregate_pg_losses(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Weight per-token losses by the rollout importance weights (when given), then aggregate with the
    config's global batch info."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info(config))
