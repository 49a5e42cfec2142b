"""Seed 003's keyword arguments to ``RLTrainer``, translated into config keys and a scoring function.

``RLTrainer(config, actor_model=path, reward_model=..., use_vllm=True, fsdp_config={...},
checkpoint_config={...})`` is the same as setting ``actor_rollout_ref.model.path``, a ``compute_score``
function (``reward_model`` a function or a built-in scorer's name) or the reward model
(``reward_model.enable`` and ``reward_model.model.path``: any other string),
``actor_rollout_ref.rollout.name=vllm``, the FSDP settings and the checkpoint keys. The config is never
changed in place: a new one is built and validated like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from difflib import get_close_matches
from functools import partial
from pathlib import Path
from typing import Any

from verl.config import ConfigError, TrainerConfig, with_updates

ComputeScore = Callable[..., Any]


SHARDING_STRATEGIES = {
    "FULL_SHARD": {},
    "SHARD_GRAD_OP": {"reshard_after_forward": False},
    "HYBRID_SHARD": {},
}
"""FSDP1's ``sharding_strategy`` names, as FSDP2 settings (HYBRID_SHARD also needs ``fsdp_size``)"""
FSDP_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")


def fsdp_updates(fsdp_config: dict[str, Any]) -> dict[str, Any]:
    """``RLTrainer(fsdp_config=...)``: FSDP2 (strategy fsdp2) with these ``fsdp_config`` settings for the
    actor, reference and critic; FSDP1's ``sharding_strategy`` is read as its FSDP2 equivalent
    (NO_SHARD: strategy dp)."""
    settings = dict(fsdp_config)
    sharding = settings.pop("sharding_strategy", "FULL_SHARD")
    if sharding == "NO_SHARD":
        return {"actor_rollout_ref.actor.strategy": "dp"}
    if sharding not in SHARDING_STRATEGIES:
        raise ConfigError(
            f"RLTrainer(fsdp_config={{'sharding_strategy': {sharding!r}}}): unknown; use one of "
            f"{', '.join([*SHARDING_STRATEGIES, 'NO_SHARD'])}"
        )
    if sharding == "HYBRID_SHARD" and "fsdp_size" not in settings:
        raise ConfigError(
            "RLTrainer(fsdp_config={'sharding_strategy': 'HYBRID_SHARD'}): give fsdp_size too, the number of "
            "ranks that shard one replica"
        )
    settings = {**SHARDING_STRATEGIES[sharding], **settings}
    updates: dict[str, Any] = {"actor_rollout_ref.actor.strategy": "fsdp2"}
    for role in FSDP_ROLES:
        updates.update({f"{role}.fsdp_config.{key}": value for key, value in _flat(settings).items()})
    return updates


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


CHECKPOINT_KEYS = {
    "save_interval": ("trainer.save_freq",),
    "keep_last_k": ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"),
    "async_save": ("trainer.async_save",),
}
"""seed 003's ``checkpoint_config`` keys and the config keys each one sets"""


def checkpoint_updates(checkpoint_config: dict[str, Any]) -> dict[str, Any]:
    """``RLTrainer(checkpoint_config={"save_interval": 100, "keep_last_k": 3, "async_save": True})``: a
    checkpoint every ``save_interval`` steps, the last ``keep_last_k`` kept (actor and critic), written in the
    background when ``async_save``."""
    if not isinstance(checkpoint_config, dict):
        raise ConfigError(
            f"RLTrainer(checkpoint_config=...) must be a dict of {', '.join(CHECKPOINT_KEYS)}; got "
            f"{type(checkpoint_config).__name__}"
        )
    updates: dict[str, Any] = {}
    for key, value in checkpoint_config.items():
        if key not in CHECKPOINT_KEYS:
            close = get_close_matches(str(key), CHECKPOINT_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"RLTrainer(checkpoint_config={{{key!r}: ...}}): unknown key{hint} (known: {', '.join(CHECKPOINT_KEYS)})"
            )
        updates.update(dict.fromkeys(CHECKPOINT_KEYS[key], value))
    return updates


def apply_seed_arguments(
    config: TrainerConfig,
    compute_score: ComputeScore | None,
    *,
    actor_model: str | None = None,
    reward_model: str | ComputeScore | None = None,
    use_vllm: bool = False,
    fsdp_config: dict[str, Any] | None = None,
    checkpoint_config: dict[str, Any] | None = None,
) -> tuple[TrainerConfig, ComputeScore | None]:
    """The config with the keyword arguments applied, and the scoring function (``reward_model`` a function
    or a built-in scorer's name; any other string is the reward model's directory or hub id)."""
    updates: dict[str, Any] = fsdp_updates(fsdp_config) if fsdp_config else {}
    if checkpoint_config is not None:
        updates.update(checkpoint_updates(checkpoint_config))
    if actor_model is not None:
        updates["actor_rollout_ref.model.path"] = str(actor_model)
    if use_vllm:
        updates["actor_rollout_ref.rollout.name"] = "vllm"
    if reward_model is not None and compute_score is not None:
        raise ValueError("RLTrainer: pass reward_model or compute_score, not both")
    if reward_model is not None and not callable(reward_model) and not _is_scorer(reward_model):
        # a reward model: it scores every response in a reward worker of its own (reward_model.enable)
        if config.custom_reward_function.path:
            raise ConfigError(
                f"RLTrainer(reward_model={reward_model!r}) with custom_reward_function.path set: verl would serve "
                "the model to that function as a generative judge; for that set reward_model.enable=true and "
                "reward_model.model.path in the config, or leave custom_reward_function.path unset"
            )
        updates["reward_model.enable"] = True
        updates["reward_model.model.path"] = str(reward_model)
    elif reward_model is not None:
        compute_score = scoring_function(reward_model, "RLTrainer(reward_model=...)")
    return with_updates(config, updates), compute_score


def _is_scorer(name: str) -> bool:
    """Whether ``RLTrainer(reward_model=name)`` names a built-in scorer rather than a reward model; a name
    close to a scorer's that is no local directory is taken for a typo."""
    from verl.workers.reward.scorers import SCORERS

    if name in SCORERS:
        return True
    close = get_close_matches(str(name), SCORERS, n=1, cutoff=0.75)
    if close and not Path(name).is_dir():
        raise ConfigError(
            f"RLTrainer(reward_model={name!r}): no built-in scorer and no directory of that name; did you mean "
            f"the scorer {close[0]!r}? (scorers: {', '.join(sorted(SCORERS))}; any other string is a reward "
            "model's directory)"
        )
    return False


def scoring_function(reward: str | ComputeScore | None, where: str) -> ComputeScore | None:
    """A built-in scorer name -> a function applying that scorer to every sample; a function as is."""
    if reward is None or callable(reward):
        return reward
    from verl.workers.reward.scorers import SCORERS

    if reward not in SCORERS:
        raise ValueError(
            f"{where}: {reward!r} is not a built-in scorer ({', '.join(sorted(SCORERS))}); pass one of those "
            "or a function compute_score(data_source, solution_str, ground_truth, extra_info=None)"
        )
    return partial(_score_with, reward)


def _score_with(
    scorer: str, data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> Any:
    """Score with the named built-in scorer (a module-level function, so it pickles for Ray)."""
    from verl.workers.reward.scorers import SCORERS

    return SCORERS[scorer](solution_str, ground_truth, extra_info=extra_info)
