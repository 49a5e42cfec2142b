"""verl's values of our keys that this repository reads otherwise: a value verl 0.9.1 names differently, a
fractional value that is whole, and ``hybrid_engine=false`` (verl 0.9.1, only with ``separate_async``). Applied by
:func:`verl.config.verl_compat.record_compat` once every source is merged.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from verl.config.errors import ConfigError, as_written


def hybrid_engine(cfg: Any, value: Any) -> None:
    """verl 0.9.1: ``hybrid_engine=false`` under ``separate_async`` (the actor holds no rollout engine)."""
    if value is True:
        return
    mode = cfg.trainer.v1.trainer_mode
    if value is not False or mode != "separate_async":
        raise ConfigError(
            f"actor_rollout_ref.hybrid_engine={as_written(value)}: the actor and the rollout share one module "
            f"here, except under trainer.v1.trainer_mode=separate_async (a rollout role of its own; it is {mode}); "
            "accepted here: true, or false with separate_async"
        )


VALUE_SYNONYMS: dict[str, dict[Any, Any]] = {
    # verl 0.9.1's default (#7792): the sequence's reward before the KL penalty, which seq_reward reads here
    "algorithm.filter_groups.metric": {"reward": "seq_reward"},
}
"""verl's names for values of our keys that this repository spells otherwise: read as ours"""
WHOLE_WHEN_INTEGRAL = (
    "trainer.v1.separate_async.num_warmup_batches",
    "trainer.v1.colocate_async.num_warmup_batches",
)
"""keys verl 0.9.1 allows fractional values for (validation refuses a fraction): 2.0 is read as 2"""


def read_verl_values(cfg: Any) -> None:
    """verl's value spellings of our keys, read as ours (:data:`VALUE_SYNONYMS`, :data:`WHOLE_WHEN_INTEGRAL`)."""
    for key, synonyms in VALUE_SYNONYMS.items():
        value = OmegaConf.select(cfg, key)
        if isinstance(value, str) and value in synonyms:
            OmegaConf.update(cfg, key, synonyms[value], merge=False)
    for key in WHOLE_WHEN_INTEGRAL:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, float) and value.is_integer():
            OmegaConf.update(cfg, key, int(value), merge=False)
