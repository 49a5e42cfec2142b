"""Value validation of a loaded config: allowed choices, lower bounds, file lists, batch divisibility, and keys
the selected backend would ignore (``backends.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.config.backends import backend_errors, sft_backend_errors
from verl.config.errors import ConfigError, short_repr
from verl.config.schema import TrainerConfig
from verl.config.sizes import TOKEN_BUDGET_KEYS, derive_sizes, token_budgets

TRUNCATION_MODES = ("error", "left", "right")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LR_SCHEDULERS = ("constant", "cosine")
KL_CTRL_TYPES = ("fixed", "adaptive")
BAD_ROW_POLICIES = ("fail", "skip")
REWARD_ERROR_POLICIES = ("fail", "zero")


def as_file_list(value: Any) -> list[str]:
    """Normalise ``data.train_files``/``val_files`` (None, a path, or a list of paths) to a list of str."""
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [str(value)]
    if isinstance(value, (list, tuple, ListConfig)) and all(isinstance(v, (str, Path)) for v in value):
        return [str(v) for v in value]
    raise ConfigError(f"expected a file path or a list of file paths, got {short_repr(value)}")


def _is_trainer(cfg: DictConfig) -> bool:
    tp = OmegaConf.get_type(cfg)
    if isinstance(tp, type) and issubclass(tp, TrainerConfig):
        return True
    return "actor_rollout_ref" in cfg


def _choice(errors: list[str], key: str, value: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        errors.append(f"{key} must be one of {', '.join(allowed)}; got {value!r}")


def _at_least(errors: list[str], key: str, value: Any, low: int) -> None:
    if value is not None and value < low:
        errors.append(f"{key} must be >= {low}; got {value}")


def _files(errors: list[str], key: str, value: Any) -> None:
    try:
        as_file_list(value)
    except ConfigError:
        errors.append(f"{key} must be a file path or a list of file paths; got {short_repr(value)}")


def _optim_errors(errors: list[str], prefix: str, optim: Any) -> None:
    _choice(errors, f"{prefix}.lr_scheduler_type", optim.lr_scheduler_type, LR_SCHEDULERS)
    if not 0.0 <= optim.lr_warmup_steps_ratio <= 1.0:
        errors.append(f"{prefix}.lr_warmup_steps_ratio must be in [0, 1]; got {optim.lr_warmup_steps_ratio}")
    if not 0.0 <= optim.min_lr_ratio <= 1.0:
        errors.append(f"{prefix}.min_lr_ratio must be in [0, 1]; got {optim.min_lr_ratio}")
    if len(optim.betas) != 2:
        errors.append(f"{prefix}.betas must be two numbers [beta1, beta2]; got {list(optim.betas)}")


def validate(cfg: DictConfig) -> None:
    """Check value constraints of a TrainerConfig or SFTConfig; raise one ConfigError listing every problem."""
    errors: list[str] = []
    if _is_trainer(cfg):
        data, arr = cfg.data, cfg.actor_rollout_ref
        actor, rollout = arr.actor, arr.rollout
        _files(errors, "data.train_files", data.train_files)
        _files(errors, "data.val_files", data.val_files)
        _choice(errors, "data.truncation", data.truncation, TRUNCATION_MODES)
        _at_least(errors, "data.max_prompt_length", data.max_prompt_length, 1)
        _at_least(errors, "data.max_response_length", data.max_response_length, 1)
        _at_least(errors, "data.train_batch_size", data.train_batch_size, 1)
        _at_least(errors, "data.val_batch_size", data.val_batch_size, 1)
        if not str(arr.model.path).strip() and not (cfg.prepare.enable and cfg.prepare.tiny_model):
            errors.append(
                "actor_rollout_ref.model.path is required (a model directory or hub id), unless prepare.enable "
                "and prepare.tiny_model build one; got ''"
            )
        _choice(errors, "actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
        _at_least(errors, "actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size, 1)
        _at_least(
            errors,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            actor.ppo_micro_batch_size_per_gpu,
            1,
        )
        _at_least(errors, "actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs, 1)
        _optim_errors(errors, "actor_rollout_ref.actor.optim", actor.optim)
        _at_least(errors, "actor_rollout_ref.rollout.n", rollout.n, 1)
        _at_least(errors, "actor_rollout_ref.rollout.val_kwargs.n", rollout.val_kwargs.n, 1)
        _at_least(errors, "actor_rollout_ref.rollout.micro_batch_size", rollout.micro_batch_size, 1)
        _choice(errors, "algorithm.kl_ctrl.type", cfg.algorithm.kl_ctrl.type, KL_CTRL_TYPES)
        trainer = cfg.trainer
        _choice(errors, "trainer.backend", trainer.backend, ("local", "ray"))
        _choice(errors, "trainer.device", trainer.device, ("cpu", "cuda", "auto"))
        for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
            if trainer[key] is not None:
                _at_least(errors, f"trainer.{key}", trainer[key], 1)
        _choice(errors, "trainer.on_worker_failure", trainer.on_worker_failure, ("fail", "restart"))
        _at_least(errors, "trainer.nnodes", trainer.nnodes, 1)
        _at_least(errors, "trainer.n_gpus_per_node", trainer.n_gpus_per_node, 1)
        _at_least(errors, "reward_model.num_workers", cfg.reward_model.num_workers, 1)
        _choice(errors, "data.bad_rows", data.bad_rows, BAD_ROW_POLICIES)
        _choice(errors, "reward_model.error_policy", cfg.reward_model.error_policy, REWARD_ERROR_POLICIES)
        timeout_s = cfg.reward_model.timeout_s
        if timeout_s is not None and not timeout_s > 0:
            errors.append(f"reward_model.timeout_s must be > 0 seconds or null (no limit); got {timeout_s}")
        _at_least(errors, "trainer.max_worker_restarts", trainer.max_worker_restarts, 0)
        _at_least(errors, "trainer.worker_state_freq", trainer.worker_state_freq, 0)
        workers = trainer.nnodes * trainer.n_gpus_per_node
        if trainer.backend == "local" and (workers > 1 or cfg.reward_model.num_workers > 1):
            errors.append(
                f"trainer.backend=local runs every worker in this process, so it has one data-parallel worker; "
                f"got trainer.nnodes x trainer.n_gpus_per_node = {workers} and reward_model.num_workers = "
                f"{cfg.reward_model.num_workers}: set trainer.backend=ray for more"
            )
        _choice(errors, "critic.loss_agg_mode", cfg.critic.loss_agg_mode, LOSS_AGG_MODES)
        _choice(
            errors,
            "actor_rollout_ref.actor.clip_ratio_schedule",
            actor.clip_ratio_schedule,
            ("linear", "cosine"),
        )
        longest = data.max_prompt_length + data.max_response_length
        for key, budget in token_budgets(cfg).items():
            if budget is not None and budget < longest:
                errors.append(
                    f"{TOKEN_BUDGET_KEYS[key]} (here {budget}; unset ones follow "
                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu) is a token budget per micro-batch "
                    "and must hold the longest sequence, data.max_prompt_length + data.max_response_length = "
                    f"{longest}"
                )
        if (
            data.train_batch_size >= 1
            and actor.ppo_mini_batch_size >= 1
            and data.train_batch_size % actor.ppo_mini_batch_size
        ):
            errors.append(
                f"data.train_batch_size ({data.train_batch_size}) must be divisible by "
                f"actor_rollout_ref.actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size})"
            )
        errors.extend(backend_errors(cfg))
        if not errors:
            try:
                derive_sizes(cfg)
            except ConfigError as e:
                errors.append(str(e))
    else:
        data = cfg.data
        _files(errors, "data.train_files", data.train_files)
        _files(errors, "data.val_files", data.val_files)
        _choice(errors, "data.truncation", data.truncation, TRUNCATION_MODES)
        _at_least(errors, "data.max_length", data.max_length, 1)
        _at_least(errors, "data.train_batch_size", data.train_batch_size, 1)
        if not str(cfg.model.path).strip():
            errors.append("model.path is required (a model directory or hub id); got ''")
        _optim_errors(errors, "optim", cfg.optim)
        errors.extend(sft_backend_errors(cfg))
    if errors:
        raise ConfigError("invalid config: " + "; ".join(errors))
