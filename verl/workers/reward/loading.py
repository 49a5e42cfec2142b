"""Building the configured reward manager: ``reward_model.reward_manager`` and the scoring function of
``custom_reward_function`` (a user file), from a typed :class:`verl.config.TrainerConfig`."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from verl.utils.imports import import_file
from verl.workers.reward.manager import ComputeScoreFn, get_reward_manager_cls
from verl.workers.reward.scorers import default_compute_score


def load_custom_reward_function(path: str | os.PathLike[str], name: str = "compute_score") -> ComputeScoreFn:
    """Import ``name`` from the Python file at ``path`` (a user-provided scoring function)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom reward function file not found: {path}")
    module = import_file(path)
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"reward function {name!r} not found in {path}; callables there: {available}")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{name!r} in {path} is not callable (got {type(fn).__name__})")
    return fn


def get_custom_reward_fn(config: Any) -> ComputeScoreFn | None:
    """The function named by ``config.custom_reward_function`` (with its ``reward_kwargs``), or None."""
    section = config.custom_reward_function
    if not section.path:
        return None
    fn = load_custom_reward_function(section.path, section.name)
    kwargs = dict(section.reward_kwargs)
    return partial(fn, **kwargs) if kwargs else fn


def load_reward_manager(
    config: Any,
    tokenizer: Any,
    num_examine: int = 0,
    compute_score: ComputeScoreFn | None = None,
    **kwargs: Any,
) -> Any:
    """Build the reward manager named by ``config.reward_model.reward_manager``.

    The scoring function is ``compute_score`` when given (a function passed in code, e.g. by
    ``RewardOperator``), else ``config.custom_reward_function.path``/``.name`` when a path is set,
    else :func:`default_compute_score`. Extra ``kwargs`` go to the manager's constructor.
    """
    manager_cls = get_reward_manager_cls(config.reward_model.reward_manager)
    compute_score = compute_score or get_custom_reward_fn(config) or default_compute_score
    kwargs.setdefault("reward_fn_key", config.data.reward_fn_key)
    return manager_cls.from_config(config, tokenizer, num_examine, compute_score, **kwargs)
