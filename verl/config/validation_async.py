"""Validation of ``trainer.v1`` and ``async_training``: the asynchronous trainer modes, the pipeline depth
against the staleness bound, the weight-sync period, and what the asynchronous modes do not do yet (each
refused with the reason, not left to misbehave). Called by :func:`verl.config.validation.validate`.
"""

from __future__ import annotations

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
        _warmup_errors(errors, f"{key}.{mode}.num_warmup_batches", v1[mode].num_warmup_batches, mode)
    fully = cfg.async_training
    check_at_least(errors, "async_training.staleness_threshold", fully.staleness_threshold, 0)
    check_at_least(errors, "async_training.require_batches", fully.require_batches, 1)
    streaming = isinstance(fully.staleness_threshold, (int, float)) and fully.staleness_threshold > 0
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
    if mode == "colocate_async" or streaming:
        _staleness_errors(errors, v1, f"{key}.trainer_mode={mode}" + (" with streaming" if streaming else ""))
    if mode == "colocate_async":
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
        _separate_async_errors(errors, cfg)


def _separate_async_errors(errors: list[str], cfg: DictConfig) -> None:
    """``trainer.v1.separate_async``: the depth against the staleness bound; the weight-sync period."""
    v1, key = cfg.trainer.v1, "trainer.v1"
    ahead, bound = v1.separate_async.num_warmup_batches, v1.sampler.max_off_policy_threshold
    if isinstance(ahead, int) and isinstance(bound, int) and ahead >= bound:
        errors.append(
            f"{key}.separate_async.num_warmup_batches={ahead}: every sample would be {ahead} policy versions old, "
            f"at or past {key}.sampler.max_off_policy_threshold={v1.sampler.max_off_policy_threshold}"
        )
    arr, data = cfg.actor_rollout_ref, cfg.data
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


def _warmup_errors(errors: list[str], key: str, value: object, mode: str) -> None:
    """A number of batches >= 0. colocate_async takes verl 0.9.1's fractional windows (1.5: floor(1.5 x
    data.train_batch_size) prompts in flight beyond the step's own); separate_async refuses them with the reason."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errors.append(f"{key} must be a number of batches >= 0; got {value!r}")
    elif (
        isinstance(value, float) and mode == "separate_async"
    ):  # an integral float was read as an int already
        errors.append(
            f"{key}={value}: a fractional window (verl 0.9.1: the whole batches plus floor(fraction x "
            "data.train_batch_size) prompts) is not built for separate_async here: its rollout generates whole "
            "batches ahead, each a fixed set of prompts trained at one step; give a whole number of batches, or "
            "stream with async_training.staleness_threshold=<fraction> (that many batches' prompts more in flight)"
        )
    else:
        check_at_least(errors, key, value, 0)


def _staleness_errors(errors: list[str], v1: DictConfig, where: str) -> None:
    """The pool modes restart an unfinished generation older than the bound (null: none is); strategy drop."""
    sampler, key = v1.sampler, "trainer.v1.sampler"
    if sampler.max_off_policy_strategy == "wait":
        errors.append(
            f"{key}.max_off_policy_strategy=wait with {where}: finishing a stale generation and training it "
            "(verl's wait) is not built here; the rollout pool restarts it under the current weights (drop)"
        )
