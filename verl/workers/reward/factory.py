"""Building the reward role's scoring from a typed :class:`verl.config.TrainerConfig`: the reward manager
named by ``reward_model.reward_manager`` (:func:`load_reward_manager`) and the reward functions that wrap it
with the weighted terms of ``reward_model.reward_fns`` and the reward model (:func:`build_reward_fns`).

It sits above :mod:`verl.workers.reward.loading` (the user's scoring function) and
:mod:`verl.workers.reward.combine` (the terms), which import nothing from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from verl.config.genrm import serves_genrm
from verl.config.reward_fns import parse_reward_fns
from verl.workers.reward.batch import BatchRewardManager
from verl.workers.reward.combine import (
    RewardFunction,
    batched_sample_scorer,
    check_no_reward_fn_in_code,
    sample_scorer,
)
from verl.workers.reward.loading import accepted_kwargs, get_custom_reward_fn
from verl.workers.reward.manager import get_reward_manager_cls
from verl.workers.reward.scorers import default_compute_score
from verl.workers.reward.scoring import ComputeScoreFn
from verl.workers.reward.verl_shapes import build_manager


def load_reward_manager(
    config: Any,
    tokenizer: Any,
    num_examine: int = 0,
    compute_score: ComputeScoreFn | None = None,
    client_kwargs: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Build the reward manager named by ``config.reward_model.reward_manager``.

    The scoring function is ``compute_score`` when given (a function passed in code, e.g. by
    ``RewardOperator``), else ``config.custom_reward_function.path``/``.name`` when a path is set,
    else :func:`default_compute_score`. Extra ``kwargs`` go to the manager's constructor. A manager written for
    verl (its classic constructor, or a reward-loop ``run_single``) is built as verl builds it
    (:func:`verl.workers.reward.verl_shapes.build_manager`).

    With ``reward_model.reward_fns``, that function is the ``correctness`` term, and the manager scores each
    sample with the weighted sum of the per-sample terms (:mod:`verl.workers.reward.combine`).

    ``client_kwargs``: a generative reward model's ``reward_router_address`` and ``reward_model_tokenizer``
    (:func:`verl.workers.reward.genrm.client_kwargs`), bound to the scoring function as far as it takes them.
    """
    manager_cls = get_reward_manager_cls(config.reward_model.reward_manager)
    client_kwargs = dict(client_kwargs or {})
    if compute_score is not None:
        bound = accepted_kwargs(compute_score, client_kwargs)
        compute_score = partial(compute_score, **bound) if bound else compute_score
    compute_score = compute_score or get_custom_reward_fn(config, client_kwargs) or default_compute_score
    terms = parse_reward_fns(config.reward_model.reward_fns)
    if any(not term.per_batch for term in terms):
        batched = isinstance(manager_cls, type) and issubclass(manager_cls, BatchRewardManager)
        compute_score = (batched_sample_scorer if batched else sample_scorer)(terms, compute_score)
    kwargs.setdefault("reward_fn_key", config.data.reward_fn_key)
    return build_manager(manager_cls, config, tokenizer, num_examine, compute_score, client_kwargs, **kwargs)


def build_reward_fns(
    config: Any,
    tokenizer: Any,
    device: torch.device,
    reward_fn: Any = None,
    val_reward_fn: Any = None,
    compute_score: ComputeScoreFn | None = None,
    client_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Any, Any]:
    """The reward role's (training, validation) reward functions: the configured managers (or the ones passed
    in code), wrapped in :class:`RewardFunction` when ``reward_fns`` or a discriminative reward model is
    configured; one reward model serves both. A generative reward model is the scoring function's to call
    (``client_kwargs``, see :func:`load_reward_manager`)."""
    terms = parse_reward_fns(config.reward_model.reward_fns)
    check_no_reward_fn_in_code(terms, reward_fn or val_reward_fn)
    num_examine = config.reward_model.num_examine
    train = reward_fn or load_reward_manager(config, tokenizer, num_examine, compute_score, client_kwargs)
    val = val_reward_fn or load_reward_manager(config, tokenizer, 0, compute_score, client_kwargs)
    scorer = None
    if config.reward_model.enable and not serves_genrm(config):
        from verl.workers.reward.model import RewardModelScorer, default_max_length

        scorer = RewardModelScorer(config.reward_model, tokenizer, device, default_max_length(config))
    if not terms and scorer is None:
        return train, val
    wrap = partial(
        RewardFunction, terms=terms, reward_model=scorer, max_response_length=config.data.max_response_length
    )
    return wrap(train), wrap(val)
