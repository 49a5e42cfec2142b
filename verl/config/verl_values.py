"""verl's values of our keys that this repository reads otherwise: a value verl 0.9.1 names differently, a
fractional value that is whole, ``hybrid_engine=false`` (verl 0.9.1, only with ``separate_async``), and a reward
manager imported from a module (``reward.reward_manager.source=importlib``). Applied by
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
"""keys verl 0.9.1 allows fractional values for (both modes read a fraction): 2.0 is read as 2"""


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


MANAGER_KEYS = ("reward.reward_manager", "reward_manager")
"""verl's sections naming where its reward manager class comes from (0.8+, and 0.7's top-level one)"""


def reward_manager_source(cfg: Any, deferred: dict[str, Any]) -> dict[str, Any]:
    """verl's ``source=importlib`` + ``module.path``: ``reward_model.reward_manager`` becomes
    ``<path>:<name>`` (a file, or ``pkg://a.b`` as ``a.b``), the class verl would load. ``source=register`` is the
    name as it is. Returns the keys read."""
    read: dict[str, Any] = {}
    for section in MANAGER_KEYS:
        source, path = deferred.get(f"{section}.source"), deferred.get(f"{section}.module.path")
        if source is None and path is None:
            continue
        read.update({k: v for k, v in ((f"{section}.source", source), (f"{section}.module.path", path)) if v})
        if source in (None, "register"):
            continue  # verl reads module.path only with importlib
        if source != "importlib":
            raise ConfigError(
                f"{section}.source={as_written(source)}: verl's sources are register and importlib"
            )
        if not path:
            raise ConfigError(
                f"{section}.source=importlib needs {section}.module.path (a .py file or pkg://module)"
            )
        module = str(path).removeprefix("file://")
        if module.startswith("pkg://"):
            module = module.removeprefix("pkg://").replace("/", ".")
        cfg.reward_model.reward_manager = f"{module}:{cfg.reward_model.reward_manager}"
    return read
