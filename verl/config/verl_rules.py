"""The rules reading the original verl's config keys: for each key (or glob of keys), whether it is verl's
other spelling of a key here, has no effect here (and why), is accepted only at the values that mean what
happens here, or is read once every source is merged. Pure data; :mod:`verl.config.verl_compat` applies it,
and ``docs/verl_compat.md`` is generated from it.

The parts: :mod:`verl.config.verl_rules_common` (the :class:`Rule` and the reasons many keys share),
:mod:`verl.config.verl_rules_ppo` (``PPO_RULES``) and :mod:`verl.config.verl_rules_sft` (``SFT_RULES``); this
module adds the free-form mappings and Hydra's config groups, and gathers all of them under one name.
"""

from __future__ import annotations

from verl.config.verl_rules_common import (
    ASYNC,
    CHECKPOINT,
    COMPUTE_DTYPE,
    DERIVED,
    FSDP,
    FSDP_KEYS,
    HYDRA,
    KERNELS,
    LOADER,
    LOGGING,
    MEDIA,
    PROFILER,
    RAY,
    REWARD_MODEL,
    ROLLOUT_IS_V06,
    SEED,
    SERVER,
    STRATEGY,
    TARGET,
    ULYSSES,
    Rule,
)
from verl.config.verl_rules_ppo import PPO_RULES
from verl.config.verl_rules_sft import SFT_FSDP, SFT_ONE_PASS, SFT_RULES, SFT_SAVE

__all__ = [
    "ASYNC",
    "CHECKPOINT",
    "COMPUTE_DTYPE",
    "DERIVED",
    "FREE_FORM",
    "FSDP",
    "FSDP_KEYS",
    "HYDRA",
    "HYDRA_GROUPS",
    "KERNELS",
    "LOADER",
    "LOGGING",
    "MEDIA",
    "PPO_RULES",
    "PROFILER",
    "RAY",
    "READ_BY_LEAF",
    "REWARD_MODEL",
    "ROLLOUT_IS_V06",
    "SEED",
    "SERVER",
    "SFT_FSDP",
    "SFT_ONE_PASS",
    "SFT_RULES",
    "SFT_SAVE",
    "STRATEGY",
    "TARGET",
    "ULYSSES",
    "Rule",
]

# verl keys whose value is a free-form mapping: any key below them is verl's (read by code verl calls).
FREE_FORM = {
    "ppo_trainer": (
        "*.engine_kwargs",
        "*.override_optimizer_config",
        "*reward_kwargs",
        "ray_kwargs",
        "ray_init",
        "data.mm_processor_kwargs",
        "trainer.v1.sync",
        "*.checkpoint_engine.engine_kwargs",
        "distillation.teacher_models.*",  # named teachers: +distillation.teacher_models.<name>.* (multi-teacher OPD)
        "critic.fsdp.mixed_precision",  # null in verl >= 0.8's engine config; its scripts add the dtypes with +
        "hydra",
    ),
    "sft_trainer": ("optim.override_optimizer_config", "hydra"),
}

# Free-form mappings of ours read leaf by leaf through the rules, because verl's entries hold keys with no effect
# here beside the ones read: a distillation teacher's key and model_path are kept, its inference.* reported.
READ_BY_LEAF = {"ppo_trainer": ("distillation.teacher_models",), "sft_trainer": ()}

HYDRA_GROUPS = {"ppo_trainer": ("model_engine",), "sft_trainer": ("engine", "model", "optim", "profiler")}
"""Hydra config groups verl's scripts select by name (``engine=fsdp``): keys with a name for a value"""
