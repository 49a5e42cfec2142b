"""Value validation of a loaded config: allowed choices, numeric ranges, file lists, batch divisibility, and keys
the selected backend would ignore (``backends.py``).

Every problem is collected and reported in one :class:`ConfigError`, each naming the full key, its value and
what is allowed. The numeric rules are grouped by section, written with the checks of ``value_rules.py``: the
data, reward, trainer and batch sections below (and the SFT config's), the rules the RL and SFT configs share
in ``validation_shared.py``, the actor_rollout_ref, critic and algorithm sections in ``validation_workers.py``,
the asynchronous modes' rules in ``validation_async.py`` and the distillation section's in
``validation_distillation.py``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.config.backends import backend_errors
from verl.config.checkpoint_engine import checkpoint_engine_errors
from verl.config.errors import ConfigError
from verl.config.genrm import genrm_errors
from verl.config.reward_fns import term_config_problems
from verl.config.schema import TrainerConfig
from verl.config.sizes import TOKEN_BUDGET_KEYS, derive_sizes, token_budgets
from verl.config.validation_async import async_errors
from verl.config.validation_distillation import distillation_errors
from verl.config.validation_shared import (
    chat_template_kwargs_errors,
    lora_errors,
    optim_errors,
    trainer_loop_errors,
)
from verl.config.validation_workers import actor_errors, algorithm_errors, critic_errors, rollout_ref_errors
from verl.config.value_rules import (
    check_at_least,
    check_choice,
    check_files,
    check_in_range,
    check_off_or_at_least,
    check_seed,
)

TRUNCATION_MODES = ("error", "left", "right")
BAD_ROW_POLICIES = ("fail", "skip")
REWARD_ERROR_POLICIES = ("fail", "zero")


def _is_trainer(cfg: DictConfig) -> bool:
    tp = OmegaConf.get_type(cfg)
    if isinstance(tp, type) and issubclass(tp, TrainerConfig):
        return True
    return "actor_rollout_ref" in cfg


def _data_errors(errors: list[str], data: Any) -> None:
    check_files(errors, "data.train_files", data.train_files)
    check_files(errors, "data.val_files", data.val_files)
    check_choice(errors, "data.truncation", data.truncation, TRUNCATION_MODES)
    check_choice(errors, "data.bad_rows", data.bad_rows, BAD_ROW_POLICIES)
    check_at_least(errors, "data.max_prompt_length", data.max_prompt_length, 1)
    check_at_least(errors, "data.max_response_length", data.max_response_length, 1)
    check_at_least(errors, "data.train_batch_size", data.train_batch_size, 1)
    check_at_least(errors, "data.val_batch_size", data.val_batch_size, 1)
    check_off_or_at_least(errors, "data.train_max_samples", data.train_max_samples, -1, "all rows")
    check_off_or_at_least(errors, "data.val_max_samples", data.val_max_samples, -1, "all rows")
    check_seed(errors, "data.seed", data.seed, null="trainer.seed")
    chat_template_kwargs_errors(errors, data)


def _reward_errors(errors: list[str], cfg: DictConfig) -> None:
    reward = cfg.reward_model
    check_choice(errors, "reward_model.error_policy", reward.error_policy, REWARD_ERROR_POLICIES)
    check_at_least(errors, "reward_model.num_workers", reward.num_workers, 1)
    check_at_least(errors, "reward_model.num_examine", reward.num_examine, 0)
    check_in_range(
        errors, "reward_model.timeout_s", reward.timeout_s, 0, low_open=True, null="no limit", note="seconds"
    )
    buffer = reward.overlong_buffer
    check_at_least(errors, "reward_model.overlong_buffer.len", buffer.len, 1)
    longest = cfg.data.max_response_length
    if buffer.enable and buffer.len >= 1 and buffer.len >= longest:
        errors.append(
            f"reward_model.overlong_buffer.len must be < data.max_response_length ({longest}); "
            f"got {buffer.len}"
        )
    check_in_range(errors, "reward_model.overlong_buffer.penalty_factor", buffer.penalty_factor, 0)
    check_at_least(
        errors, "reward_model.micro_batch_size_per_gpu", reward.micro_batch_size_per_gpu, 1, null="all"
    )
    check_at_least(errors, "reward_model.max_length", reward.max_length, 1, null="prompt + response lengths")
    if reward.enable and not str(reward.model.path or "").strip():
        errors.append(
            "reward_model.enable=true needs reward_model.model.path (a sequence-classification reward model, or "
            "a causal LM served as a generative one with custom_reward_function.path: a directory or hub id); "
            "got null"
        )
    errors.extend(genrm_errors(cfg))
    term_config_problems(cfg, errors)
    _reward_manager_errors(errors, reward)


NOT_BUILT_REWARD_MANAGERS = {
    "gdpo": "GDPO's per-term group normalisation of several rewards is not built here",
    "remote": "scoring in Ray tasks of its own is not built here; reward_model.num_workers with "
    "trainer.backend=ray scores in parallel worker processes (the same scores)",
}
"""verl's reward managers not built here, and why (a custom manager registered in code is looked up at start)"""

BUILT_IN_REWARD_MANAGERS = ("naive", "batch", "dapo", "limited")
"""this repository's managers: configured by their own keys, never by reward_model.manager_kwargs"""


def _reward_manager_errors(errors: list[str], reward: DictConfig) -> None:
    """verl's managers not built here; the limited manager's rate limits, read by it alone."""
    manager = reward.reward_manager
    if manager in NOT_BUILT_REWARD_MANAGERS:
        errors.append(
            f"reward_model.reward_manager={manager}: {NOT_BUILT_REWARD_MANAGERS[manager]}; built here: "
            f"{', '.join(BUILT_IN_REWARD_MANAGERS)}"
        )
    if reward.manager_kwargs and manager in BUILT_IN_REWARD_MANAGERS:
        errors.append(
            f"reward_model.manager_kwargs (verl's reward.reward_kwargs) {sorted(reward.manager_kwargs)}: keyword "
            f"arguments of a reward manager written for verl; the built-in reward_model.reward_manager={manager} "
            "takes none (as verl's own managers refuse unknown arguments)"
        )
    check_at_least(errors, "reward_model.max_rpm", reward.max_rpm, 1, null="no limit")
    check_at_least(errors, "reward_model.max_tpm", reward.max_tpm, 1, null="no limit")
    check_at_least(
        errors, "reward_model.estimated_tokens_per_request", reward.estimated_tokens_per_request, 1
    )
    limits = [f"{k}={reward[k]}" for k in ("max_rpm", "max_tpm") if reward[k] is not None]
    if limits and manager != "limited":
        errors.append(
            f"reward_model.{' and reward_model.'.join(limits)} has no effect with reward_model.reward_manager="
            f"{manager}: the rate limits are the limited manager's (reward_model.reward_manager=limited)"
        )


def _trainer_errors(errors: list[str], cfg: DictConfig) -> None:
    trainer = cfg.trainer
    trainer_loop_errors(errors, trainer)
    check_choice(errors, "trainer.backend", trainer.backend, ("local", "ray"))
    check_choice(errors, "trainer.device", trainer.device, ("cpu", "cuda", "auto"))
    check_choice(errors, "trainer.on_worker_failure", trainer.on_worker_failure, ("fail", "restart"))
    check_off_or_at_least(errors, "trainer.test_freq", trainer.test_freq, -1, "never")
    check_off_or_at_least(errors, "trainer.save_freq", trainer.save_freq, -1, "never")
    for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
        check_at_least(errors, f"trainer.{key}", trainer[key], 1, null="keep all")
    check_at_least(errors, "trainer.nnodes", trainer.nnodes, 1)
    check_at_least(errors, "trainer.n_gpus_per_node", trainer.n_gpus_per_node, 1)
    check_at_least(errors, "trainer.critic_warmup", trainer.critic_warmup, 0)
    check_at_least(errors, "trainer.max_worker_restarts", trainer.max_worker_restarts, 0)
    check_at_least(errors, "trainer.worker_state_freq", trainer.worker_state_freq, 0)
    check_at_least(errors, "trainer.worker_timeout_s", trainer.worker_timeout_s, 0, null="no deadline")
    check_at_least(
        errors, "trainer.heartbeat_timeout_s", trainer.heartbeat_timeout_s, 0, null="deadline only"
    )
    check_seed(errors, "prepare.seed", cfg.prepare.seed, null="trainer.seed")
    callback = trainer.checkpoint_callback_class
    if callback and not all(str(callback).rpartition(".")[::2]):
        errors.append(
            "trainer.checkpoint_callback_class must be a fully qualified class name (e.g. "
            f"my_pkg.callbacks.MyCheckpointCallback) or null; got {callback!r}"
        )
    workers = trainer.nnodes * trainer.n_gpus_per_node
    if trainer.backend == "local" and (workers > 1 or cfg.reward_model.num_workers > 1):
        errors.append(
            f"trainer.backend=local runs every worker in this process, so it has one data-parallel worker; "
            f"got trainer.nnodes x trainer.n_gpus_per_node = {workers} and reward_model.num_workers = "
            f"{cfg.reward_model.num_workers}: set trainer.backend=ray for more"
        )


def _batch_errors(errors: list[str], cfg: DictConfig) -> None:
    """Token budgets against the longest sequence, and batch divisibility."""
    data, actor = cfg.data, cfg.actor_rollout_ref.actor
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


def _trainer_config_errors(cfg: DictConfig) -> list[str]:
    errors: list[str] = []
    arr = cfg.actor_rollout_ref
    _data_errors(errors, cfg.data)
    builds_model = cfg.prepare.enable and (cfg.prepare.tiny_model or cfg.prepare.model)
    if not str(arr.model.path).strip() and not builds_model:
        errors.append(
            "actor_rollout_ref.model.path is required (a model directory, a .gguf file or a hub id), unless "
            "prepare.enable and prepare.model or prepare.tiny_model make one; got ''"
        )
    if cfg.prepare.model is not None:
        from verl.models.gguf import FETCHABLE

        check_choice(errors, "prepare.model", cfg.prepare.model, tuple(FETCHABLE))
    actor_errors(errors, arr.actor)
    rollout_ref_errors(errors, arr)
    checkpoint_engine_errors(errors, cfg)
    lora_errors(errors, cfg)
    critic_errors(errors, cfg.critic)
    algorithm_errors(errors, cfg)
    _reward_errors(errors, cfg)
    _trainer_errors(errors, cfg)
    async_errors(errors, cfg)
    distillation_errors(errors, cfg)
    _batch_errors(errors, cfg)
    errors.extend(backend_errors(cfg))
    if not errors:
        try:
            derive_sizes(cfg)
        except ConfigError as e:
            errors.append(str(e))
    return errors


def _sft_config_errors(cfg: DictConfig) -> list[str]:
    errors: list[str] = []
    data = cfg.data
    check_files(errors, "data.train_files", data.train_files)
    check_files(errors, "data.val_files", data.val_files)
    check_choice(errors, "data.truncation", data.truncation, TRUNCATION_MODES)
    check_at_least(errors, "data.max_length", data.max_length, 1)
    check_at_least(errors, "data.train_batch_size", data.train_batch_size, 1)
    check_off_or_at_least(errors, "data.train_max_samples", data.train_max_samples, -1, "all rows")
    if data.messages_key is not None and not data.messages_key.strip():
        errors.append(
            "data.messages_key must name the column holding the chats, or be null (prompt/response rows); "
            "got ''"
        )
    chat_template_kwargs_errors(errors, data)
    if not str(cfg.model.path).strip():
        errors.append("model.path is required (a model directory or hub id); got ''")
    lora_errors(errors, cfg, "model")
    if data.train_files is None:
        errors.append("data.train_files is required (the parquet / jsonl file(s) to train on); got null")
    optim_errors(errors, "optim", cfg.optim)
    trainer_loop_errors(errors, cfg.trainer)
    return errors


def validate(cfg: DictConfig) -> None:
    """Check the values of a TrainerConfig or SFTConfig; raise one ConfigError listing every problem."""
    errors = _trainer_config_errors(cfg) if _is_trainer(cfg) else _sft_config_errors(cfg)
    if errors:
        raise ConfigError("invalid config: " + "; ".join(errors))
