"""Validation of ``trainer.v1`` and ``async_training``: the asynchronous trainer modes, the pipeline depth
against the staleness bound, the weight-sync period, and what the asynchronous modes do not do yet (each
refused with the reason, not left to misbehave). Called by :func:`verl.config.validation.validate`.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig

from verl.config.value_rules import check_at_least, check_choice

ARR = "actor_rollout_ref"


def async_errors(errors: list[str], cfg: DictConfig) -> None:
    """``trainer.v1`` and ``async_training``: the mode, the pipeline depth against the staleness bound, and
    what the asynchronous modes do not do yet (each refused with the reason, not left to misbehave)."""
    v1, key = cfg.trainer.v1, "trainer.v1"
    mode = v1.trainer_mode
    check_choice(errors, f"{key}.trainer_mode", mode, ("sync", "separate_async", "colocate_async"))
    check_choice(
        errors, f"{key}.sampler.max_off_policy_strategy", v1.sampler.max_off_policy_strategy, ("drop", "wait")
    )
    check_at_least(
        errors,
        f"{key}.sampler.max_off_policy_threshold",
        v1.sampler.max_off_policy_threshold,
        1,
        null="no bound",
    )
    if mode in ("separate_async", "colocate_async"):  # read only in its own mode, as in verl
        _warmup_errors(errors, f"{key}.{mode}.num_warmup_batches", v1[mode].num_warmup_batches)
    fully = cfg.async_training
    check_at_least(errors, "async_training.staleness_threshold", fully.staleness_threshold, 0)
    check_at_least(errors, "async_training.require_batches", fully.require_batches, 1)
    streaming = isinstance(fully.staleness_threshold, (int, float)) and fully.staleness_threshold > 0
    _wait_bound_errors(errors, cfg, streaming)
    if mode not in ("separate_async", "colocate_async"):
        if streaming:
            errors.append(
                f"async_training.staleness_threshold={fully.staleness_threshold}: the streaming rollout of "
                f"fully-async training needs {key}.trainer_mode=separate_async (it is {mode})"
            )
        return
    if fully.require_batches != 1:
        errors.append(
            f"async_training.require_batches={fully.require_batches}: here one ppo mini-batch is one optimizer "
            f"step; make {ARR}.actor.ppo_mini_batch_size {fully.require_batches}x larger instead"
        )
    if mode == "colocate_async":
        # a group submitted for the batch W steps ahead and finished early waits in the pool for its turn
        ahead = v1.colocate_async.num_warmup_batches
        oldest = _oldest_lag(ahead, None, streaming=True)
        _depth_errors(errors, cfg, f"{key}.colocate_async.num_warmup_batches={ahead}", oldest,
                      "groups finished ahead of their batch")  # fmt: skip
        if streaming:
            errors.append(
                f"async_training.staleness_threshold={fully.staleness_threshold} is for trainer_mode="
                f"separate_async; colocate_async keeps {key}.colocate_async.num_warmup_batches batches more in "
                "flight instead"
            )
        if not fully.partial_rollout:
            errors.append(
                "async_training.partial_rollout=false with colocate_async: verl's colocate_async always continues "
                "the generations an update interrupted, under the new weights"
            )
    else:
        _separate_async_errors(errors, cfg, streaming)


def _separate_async_errors(errors: list[str], cfg: DictConfig, streaming: bool) -> None:
    """``trainer.v1.separate_async``: the depth against the staleness bound; the weight-sync period."""
    v1, key = cfg.trainer.v1, "trainer.v1"
    arr, data = cfg.actor_rollout_ref, cfg.data
    ahead = v1.separate_async.num_warmup_batches
    oldest = _oldest_lag(ahead, data.train_batch_size, streaming)
    _depth_errors(errors, cfg, f"{key}.separate_async.num_warmup_batches={ahead}", oldest, "samples")
    sync_step = v1.separate_async.parameter_sync_step
    trigger = cfg.async_training.trigger_parameter_sync_step
    if trigger is not None and sync_step is not None and trigger != sync_step:
        errors.append(
            f"async_training.trigger_parameter_sync_step={trigger} and {key}.separate_async.parameter_sync_step="
            f"{sync_step} name the same thing (optimizer steps per weight sync); set one"
        )
    sync_key = f"{key}.separate_async.parameter_sync_step"
    if sync_step is None:
        sync_step, sync_key = trigger, "async_training.trigger_parameter_sync_step"
    mini = arr.actor.ppo_mini_batch_size
    if (
        sync_step is not None
        and isinstance(mini, int)
        and mini > 0
        and sync_step * mini != data.train_batch_size
    ):
        errors.append(
            f"{sync_key}={sync_step}: the weights are synced once per RL step, after "
            f"data.train_batch_size / {ARR}.actor.ppo_mini_batch_size = {data.train_batch_size} / {mini} "
            "mini-batches; leave it null or make the product equal data.train_batch_size (verl's rule)"
        )


def _depth_errors(errors: list[str], cfg: DictConfig, depth: str, oldest: int | None, what: str) -> None:
    """A pipeline ``depth`` (``key=value``) whose ``oldest`` samples would reach the staleness bound."""
    bound = cfg.trainer.v1.sampler.max_off_policy_threshold
    if oldest is not None and isinstance(bound, int) and oldest >= bound:
        errors.append(
            f"{depth}: {what} would be {oldest} policy versions old, at or past "
            f"trainer.v1.sampler.max_off_policy_threshold={bound}"
        )


def _wait_bound_errors(errors: list[str], cfg: DictConfig, streaming: bool) -> None:
    """``max_off_policy_strategy=wait`` in a pool (colocate_async, or separate_async streaming): a generation
    still running when a batch is taken is carried into a later one, its first token drawn by weights the lag
    of the pool behind the trainer's (0 colocated, floor(num_warmup_batches) streaming), so it trains with a
    span (versions, inclusive, as verl counts) of at least lag + 2. A smaller threshold cannot be held by
    waiting; drop holds any, by starting such generations again."""
    v1, key = cfg.trainer.v1, "trainer.v1"
    bound, mode = v1.sampler.max_off_policy_threshold, v1.trainer_mode
    if v1.sampler.max_off_policy_strategy != "wait" or isinstance(bound, bool) or not isinstance(bound, int):
        return
    if mode == "colocate_async":
        lag = 0
    elif mode == "separate_async" and streaming:
        lag = _oldest_lag(v1.separate_async.num_warmup_batches, None, streaming=True)
        if lag is None:
            return
    else:
        return  # a fixed depth: nothing is carried over (its bound is checked against the depth)
    if bound < lag + 2:
        errors.append(
            f"{key}.sampler.max_off_policy_strategy=wait with {key}.sampler.max_off_policy_threshold={bound}: "
            f"in {mode}'s pool a generation carried over a batch trains with a span of at least {lag + 2} "
            f"versions, past the bound; set the threshold to {lag + 2} or more, or max_off_policy_strategy=drop "
            "(which starts such generations again)"
        )


def _oldest_lag(ahead: object, batch_size: object, streaming: bool) -> int | None:
    """Policy versions between the oldest sample of a batch generated ahead and the policy that trains it: the
    whole batches of the window, one more when its fraction adds prompts (verl 0.9.1's floor(num_warmup_batches
    x data.train_batch_size) prompts in flight: 1.5 trains half of each batch two versions old). Streaming, the
    fraction's prompts join the pool, whose bound is enforced as it runs. None: not numbers (refused elsewhere)."""
    if isinstance(ahead, bool) or not isinstance(ahead, (int, float)) or ahead < 0:
        return None
    if streaming or not isinstance(batch_size, int) or batch_size <= 0:
        return math.floor(ahead)
    return math.ceil(math.floor(ahead * batch_size) / batch_size)


def _warmup_errors(errors: list[str], key: str, value: object) -> None:
    """A number of batches >= 0, a fraction as in verl 0.9.1 (1.5: floor(1.5 x data.train_batch_size) prompts
    in flight beyond the step's own)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errors.append(f"{key} must be a number of batches >= 0; got {value!r}")
    else:
        check_at_least(errors, key, value, 0)
