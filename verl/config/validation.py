"""Value validation of a loaded config: allowed choices, numeric ranges, file lists, batch divisibility, and keys
the selected backend would ignore (``backends.py``).

Every problem is collected and reported in one :class:`ConfigError`, each naming the full key, its value and
what is allowed. The numeric rules are grouped by section below (``_data_errors``, ``_actor_errors``, ...),
written with the checks of ``value_rules.py``; the asynchronous modes' rules are ``validation_async.py``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.algorithms.advantages import estimator_needs
from verl.config.backends import DTYPE_NAMES, backend_errors
from verl.config.errors import ConfigError, short_repr
from verl.config.reward_fns import term_config_problems
from verl.config.schema import TrainerConfig
from verl.config.sizes import TOKEN_BUDGET_KEYS, derive_sizes, token_budgets
from verl.config.validation_async import async_errors
from verl.config.value_rules import (
    check_at_least,
    check_choice,
    check_files,
    check_in_range,
    check_off_or_at_least,
    check_seed,
    check_torch_threads,
)
from verl.tools.config import TOOLS_DIR, tool_config_file
from verl.utils.trackers import BUILT as BUILT_TRACKERS
from verl.utils.trackers import missing_packages

ON_EXISTING_RUN = ("refuse", "move_aside")
LOGGERS = BUILT_TRACKERS
TRUNCATION_MODES = ("error", "left", "right")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LR_SCHEDULERS = ("constant", "cosine")
KL_CTRL_TYPES = ("fixed", "adaptive")
BAD_ROW_POLICIES = ("fail", "skip")
REWARD_ERROR_POLICIES = ("fail", "zero")

ARR = "actor_rollout_ref"


def _is_trainer(cfg: DictConfig) -> bool:
    tp = OmegaConf.get_type(cfg)
    if isinstance(tp, type) and issubclass(tp, TrainerConfig):
        return True
    return "actor_rollout_ref" in cfg


# ------------------------------------------------------------------------------------------------ shared sections
def _optim_errors(errors: list[str], prefix: str, optim: Any) -> None:
    check_choice(errors, f"{prefix}.lr_scheduler_type", optim.lr_scheduler_type, LR_SCHEDULERS)
    check_in_range(errors, f"{prefix}.lr", optim.lr, 0)
    check_in_range(errors, f"{prefix}.weight_decay", optim.weight_decay, 0)
    check_off_or_at_least(
        errors, f"{prefix}.lr_warmup_steps", optim.lr_warmup_steps, -1, "use lr_warmup_steps_ratio", 0
    )
    check_in_range(errors, f"{prefix}.lr_warmup_steps_ratio", optim.lr_warmup_steps_ratio, 0, 1)
    check_in_range(errors, f"{prefix}.min_lr_ratio", optim.min_lr_ratio, 0, 1)
    if len(optim.betas) != 2:
        errors.append(f"{prefix}.betas must be two numbers [beta1, beta2]; got {list(optim.betas)}")
    else:
        for i, beta in enumerate(optim.betas):
            check_in_range(errors, f"{prefix}.betas[{i}]", beta, 0, 1, high_open=True)
    for key in ("eps", "grad_clip"):  # only some optim sections have them (SFT's has grad_clip)
        if key in optim:
            check_in_range(errors, f"{prefix}.{key}", optim[key], 0, low_open=True)


def _trainer_loop_errors(errors: list[str], trainer: Any) -> None:
    """Keys shared by the RL and the SFT trainer sections."""
    check_at_least(
        errors, "trainer.total_training_steps", trainer.total_training_steps, 1, null="total_epochs of data"
    )
    check_at_least(errors, "trainer.total_epochs", trainer.total_epochs, 1)
    check_seed(errors, "trainer.seed", trainer.seed)
    check_torch_threads(errors, "trainer.torch_threads", trainer.torch_threads)
    if "log_val_generations" in trainer:  # RL only
        check_at_least(errors, "trainer.log_val_generations", trainer.log_val_generations, 0)
    for name in trainer.logger:
        check_choice(errors, "each of trainer.logger", name, LOGGERS)
        if name in LOGGERS and missing_packages(name):
            errors.append(
                f"trainer.logger {name} needs {', '.join(missing_packages(name))}, not installed: "
                f"pip install {' '.join(missing_packages(name))} (or pip install -e '.[tracking]')"
            )
    check_choice(errors, "trainer.on_existing_run", trainer.on_existing_run, ON_EXISTING_RUN)


# ------------------------------------------------------------------------------------------------ RL sections
TRUNCATE_SIDES = ("left", "right", "middle")
CHAT_TEMPLATE_OWN_ARGS = (
    "conversation",
    "add_generation_prompt",
    "tokenize",
    "continue_final_message",
    "return_dict",
    "return_tensors",
)
"""arguments of ``apply_chat_template`` that verl sets itself when rendering prompts"""


def _chat_template_kwargs_errors(errors: list[str], data: Any) -> None:
    """``data.apply_chat_template_kwargs`` (RL and SFT): none of the arguments the renderer sets itself."""
    kwargs = data.apply_chat_template_kwargs
    taken = [k for k in kwargs if k in CHAT_TEMPLATE_OWN_ARGS]
    if taken:
        errors.append(
            f"data.apply_chat_template_kwargs may not set {', '.join(map(str, taken))}: prompts are rendered "
            f"with {', '.join(CHAT_TEMPLATE_OWN_ARGS)} chosen by verl; pass only what the template reads "
            "(e.g. enable_thinking: false)"
        )


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
    _chat_template_kwargs_errors(errors, data)


def _sampling_errors(errors: list[str], prefix: str, section: Any, *, scored: bool) -> None:
    """temperature / top_p / top_k of ``rollout`` (``scored``: the actor and reference divide the logits by
    its temperature) or ``rollout.val_kwargs``."""
    temperature = section.temperature
    if scored:
        check_in_range(
            errors,
            f"{prefix}.temperature",
            temperature,
            0,
            low_open=True,
            note="the actor and reference score responses with softmax(logits / temperature), even with "
            "do_sample=false: for greedy rollouts set do_sample=false and keep temperature > 0",
        )
    elif section.do_sample and temperature == 0:
        errors.append(
            f"{prefix}.temperature must be > 0 when {prefix}.do_sample=true; got {temperature} "
            f"(temperature 0 is greedy decoding: set {prefix}.do_sample=false for it)"
        )
    else:
        check_in_range(errors, f"{prefix}.temperature", temperature, 0, low_open=bool(section.do_sample))
    check_in_range(errors, f"{prefix}.top_p", section.top_p, 0, 1, low_open=True)
    if section.top_k < -1:
        errors.append(f"{prefix}.top_k must be -1 or 0 (off) or >= 1; got {section.top_k}")


def _actor_errors(errors: list[str], actor: Any) -> None:
    prefix = f"{ARR}.actor"
    check_choice(errors, f"{prefix}.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES)
    check_choice(errors, f"{prefix}.clip_ratio_schedule", actor.clip_ratio_schedule, ("linear", "cosine"))
    check_at_least(errors, f"{prefix}.ppo_mini_batch_size", actor.ppo_mini_batch_size, 1)
    check_at_least(errors, f"{prefix}.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu, 1)
    check_at_least(errors, f"{prefix}.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu, 1)
    check_at_least(errors, f"{prefix}.ppo_epochs", actor.ppo_epochs, 1)
    check_in_range(errors, f"{prefix}.clip_ratio", actor.clip_ratio, 0, low_open=True)
    for key in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_final"):
        check_in_range(errors, f"{prefix}.{key}", actor[key], 0, low_open=True, null="clip_ratio")
    check_in_range(
        errors,
        f"{prefix}.clip_ratio_c",
        actor.clip_ratio_c,
        1,
        low_open=True,
        note="the dual-clip bound on negative advantages, as in verl",
    )
    check_in_range(errors, f"{prefix}.grad_clip", actor.grad_clip, 0, low_open=True)
    check_in_range(
        errors,
        f"{prefix}.loss_scale_factor",
        actor.loss_scale_factor,
        0,
        low_open=True,
        null="max_response_length",
    )
    check_in_range(errors, f"{prefix}.kl_loss_coef", actor.kl_loss_coef, 0)
    loss = actor.policy_loss
    check_in_range(errors, f"{prefix}.policy_loss.clip_cov_ratio", loss.clip_cov_ratio, 0, 1, low_open=True)
    check_in_range(errors, f"{prefix}.policy_loss.kl_cov_ratio", loss.kl_cov_ratio, 0, 1, low_open=True)
    if not loss.clip_cov_lb < loss.clip_cov_ub:
        errors.append(
            f"{prefix}.policy_loss.clip_cov_lb ({loss.clip_cov_lb}) must be < "
            f"{prefix}.policy_loss.clip_cov_ub ({loss.clip_cov_ub})"
        )
    check_in_range(errors, f"{prefix}.policy_loss.ppo_kl_coef", loss.ppo_kl_coef, 0)
    check_in_range(errors, f"{prefix}.policy_loss.tau_pos", loss.tau_pos, 0, low_open=True)
    check_in_range(errors, f"{prefix}.policy_loss.tau_neg", loss.tau_neg, 0, low_open=True)
    _optim_errors(errors, f"{prefix}.optim", actor.optim)


def _rollout_ref_errors(errors: list[str], arr: Any) -> None:
    rollout, ref = arr.rollout, arr.ref
    prefix = f"{ARR}.rollout"
    check_at_least(errors, f"{ARR}.model.log_prob_chunk_size", arr.model.log_prob_chunk_size, 0)
    check_at_least(errors, f"{prefix}.n", rollout.n, 1)
    check_at_least(errors, f"{prefix}.val_kwargs.n", rollout.val_kwargs.n, 1)
    check_at_least(errors, f"{prefix}.micro_batch_size", rollout.micro_batch_size, 1)
    check_choice(errors, f"{prefix}.mode", rollout.mode, ("sync", "async"))
    check_choice(
        errors, f"{prefix}.logprobs_mode", rollout.logprobs_mode, ("processed_logprobs", "raw_logprobs")
    )
    check_at_least(errors, f"{prefix}.max_num_seqs", rollout.max_num_seqs, 1)
    check_at_least(errors, f"{prefix}.tensor_model_parallel_size", rollout.tensor_model_parallel_size, 1)
    check_at_least(errors, f"{prefix}.max_model_len", rollout.max_model_len, 1)
    check_at_least(errors, f"{prefix}.max_num_batched_tokens", rollout.max_num_batched_tokens, 1)
    check_in_range(
        errors, f"{prefix}.gpu_memory_utilization", rollout.gpu_memory_utilization, 0, 1, low_open=True
    )
    if rollout.dtype is not None:
        check_choice(errors, f"{prefix}.dtype", rollout.dtype, DTYPE_NAMES)
    _sampling_errors(errors, prefix, rollout, scored=True)
    _sampling_errors(errors, f"{prefix}.val_kwargs", rollout.val_kwargs, scored=False)
    _multi_turn_errors(errors, rollout, prefix)
    for section, name in ((rollout, prefix), (ref, f"{ARR}.ref")):
        check_at_least(
            errors, f"{name}.log_prob_micro_batch_size_per_gpu", section.log_prob_micro_batch_size_per_gpu, 1
        )
        check_at_least(
            errors, f"{name}.log_prob_max_token_len_per_gpu", section.log_prob_max_token_len_per_gpu, 1
        )


def _agent_loop_names(path: Any) -> set[str]:
    """The built-in agent loops, those registered so far (importing verl.agent_loop here would import every
    rollout engine) and the names listed in ``agent_loop_config_path`` (read, not imported)."""
    base = sys.modules.get("verl.agent_loop.base")
    names = {"single_turn_agent", "tool_agent", *(base.AGENT_LOOPS if base is not None else ())}
    if path is not None:
        try:
            entries = OmegaConf.to_container(OmegaConf.load(str(path)))
        except Exception:  # a malformed file is reported with its entry when the loops are built
            entries = []
        names |= {str(e["name"]) for e in entries or [] if isinstance(e, dict) and e.get("name")}
    return names


def _multi_turn_errors(errors: list[str], rollout: Any, prefix: str) -> None:
    multi_turn, key = rollout.multi_turn, f"{prefix}.multi_turn"
    check_at_least(errors, f"{key}.max_assistant_turns", multi_turn.max_assistant_turns, 1)
    check_at_least(errors, f"{key}.max_user_turns", multi_turn.max_user_turns, 1)
    check_at_least(errors, f"{key}.max_parallel_calls", multi_turn.max_parallel_calls, 1)
    check_at_least(errors, f"{key}.max_tool_response_length", multi_turn.max_tool_response_length, 1)
    check_choice(
        errors, f"{key}.tool_response_truncate_side", multi_turn.tool_response_truncate_side, TRUNCATE_SIDES
    )
    check_choice(errors, f"{key}.format", multi_turn.format, ("hermes",))
    if (
        multi_turn.tool_config_path is not None
        and not tool_config_file(multi_turn.tool_config_path).is_file()
    ):
        errors.append(
            f"{key}.tool_config_path: no such file {multi_turn.tool_config_path} (nor a tool config shipped with "
            f"verl: {', '.join(sorted(p.stem for p in TOOLS_DIR.glob('*.yaml')))})"
        )
    if (
        multi_turn.enable
        and multi_turn.tool_config_path is None
        and rollout.agent.default_agent_loop
        in (
            "single_turn_agent",
            "tool_agent",
        )
    ):
        errors.append(
            f"{key}.enable=true runs the tool agent loop, and {key}.tool_config_path names no tools: set it (e.g. "
            f"calculator), or name a loop of your own in {prefix}.agent.default_agent_loop"
        )
    path = rollout.agent.agent_loop_config_path
    if path is not None and not os.path.isfile(str(path)):
        errors.append(f"{prefix}.agent.agent_loop_config_path: no such file {path}")
    elif rollout.agent.default_agent_loop not in _agent_loop_names(path):
        names = _agent_loop_names(path)
        check_choice(
            errors, f"{prefix}.agent.default_agent_loop", rollout.agent.default_agent_loop, sorted(names)
        )
    if (multi_turn.enable or path or rollout.agent.default_agent_loop != "single_turn_agent") and (
        rollout.tensor_model_parallel_size > 1
    ):
        errors.append(
            f"{prefix}.tensor_model_parallel_size={rollout.tensor_model_parallel_size} with agent loops: a "
            "tensor-parallel engine generates one batch for its ranks together, and agent loops send requests "
            "one turn at a time; use tensor_model_parallel_size=1"
        )


def _lora_errors(errors: list[str], cfg: DictConfig, prefix: str = f"{ARR}.model") -> None:
    """The LoRA keys of the model section ``prefix`` (the actor's, or ``model`` of verl sft): rank and
    alpha in range, module names of the forms peft takes, and peft installed when LoRA is on (it is an
    optional dependency: the message says what to install)."""
    import importlib.util

    model = OmegaConf.select(cfg, prefix)
    check_at_least(errors, f"{prefix}.lora_rank", model.lora_rank, 0)
    check_in_range(errors, f"{prefix}.lora_alpha", model.lora_alpha, 0, low_open=True)
    for key, nullable in (("target_modules", False), ("exclude_modules", True)):
        value = model[key]
        if value is None and nullable:
            continue
        names = OmegaConf.to_container(value) if isinstance(value, ListConfig) else [value]
        if not names or not all(isinstance(name, str) and name for name in names):
            null = " or null" if nullable else ""
            errors.append(
                f"{prefix}.{key} must be a module name or regular expression, or a list of module names "
                f"(e.g. [q_proj, v_proj]){null}; got {short_repr(value)}"
            )
    if model.lora_rank > 0 and importlib.util.find_spec("peft") is None:
        errors.append(
            f"{prefix}.lora_rank={model.lora_rank} needs the peft package, which is not installed: "
            "pip install peft (or pip install -e '.[peft]')"
        )


def _critic_errors(errors: list[str], critic: Any) -> None:
    check_choice(errors, "critic.loss_agg_mode", critic.loss_agg_mode, LOSS_AGG_MODES)
    for key in (
        "ppo_mini_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "ppo_epochs",
        "forward_micro_batch_size_per_gpu",
        "ppo_max_token_len_per_gpu",
        "forward_max_token_len_per_gpu",
    ):
        check_at_least(errors, f"critic.{key}", critic[key], 1)
    check_in_range(errors, "critic.cliprange_value", critic.cliprange_value, 0, low_open=True)
    check_in_range(errors, "critic.grad_clip", critic.grad_clip, 0, low_open=True)
    _optim_errors(errors, "critic.optim", critic.optim)


def _algorithm_errors(errors: list[str], cfg: DictConfig) -> None:
    algo, n = cfg.algorithm, cfg.actor_rollout_ref.rollout.n
    check_in_range(errors, "algorithm.gamma", algo.gamma, 0, 1)
    check_in_range(errors, "algorithm.lam", algo.lam, 0, 1)
    check_choice(errors, "algorithm.kl_ctrl.type", algo.kl_ctrl.type, KL_CTRL_TYPES)
    check_in_range(errors, "algorithm.kl_ctrl.kl_coef", algo.kl_ctrl.kl_coef, 0)
    check_at_least(errors, "algorithm.kl_ctrl.horizon", algo.kl_ctrl.horizon, 1)
    check_in_range(errors, "algorithm.kl_ctrl.target_kl", algo.kl_ctrl.target_kl, 0, low_open=True)
    check_at_least(
        errors, "algorithm.filter_groups.max_num_gen_batches", algo.filter_groups.max_num_gen_batches, 0
    )
    _rollout_correction_errors(
        errors, algo.rollout_correction, cfg.actor_rollout_ref.actor.recompute_old_log_prob
    )
    # an estimator whose baseline comes from the other responses to the same prompt (registered with
    # groups=True) needs rollout.n >= 2 (verl: "GRPO needs rollout.n > 1")
    if estimator_needs(algo.adv_estimator).groups and n == 1:
        errors.append(
            f"algorithm.adv_estimator={algo.adv_estimator} compares the responses to each prompt with each "
            f"other, so it needs {ARR}.rollout.n >= 2 (the group size); got 1: set rollout.n (e.g. 8), or use "
            "an estimator that works with one response per prompt (gae, reinforce_plus_plus, remax)"
        )


def _rollout_correction_errors(errors: list[str], rc: Any, recompute: Any) -> None:
    """Parse the thresholds now (verl parses them at the first step), so a typo stops the run before it starts."""
    from verl.algorithms.rollout_correction import (
        IS_LEVELS,
        parse_is_threshold,
        parse_rs_options,
        parse_rs_thresholds,
    )

    key = "algorithm.rollout_correction"
    if rc.rollout_is is not None:
        check_choice(errors, f"{key}.rollout_is", rc.rollout_is, IS_LEVELS)
    check_choice(errors, f"{key}.loss_type", rc.loss_type, ("ppo_clip", "reinforce"))
    try:
        if rc.rollout_is is not None and rc.rollout_is_threshold is not None:
            parse_is_threshold(rc.rollout_is_threshold)
        if rc.rollout_rs is not None:
            parse_rs_thresholds(parse_rs_options(rc.rollout_rs), rc.rollout_rs_threshold)
    except (TypeError, ValueError) as error:
        errors.append(str(error))
    if rc.loss_type == "reinforce" and not rc.bypass_mode:
        errors.append(
            f"{key}.loss_type=reinforce is bypass mode's loss: set {key}.bypass_mode=true, or leave ppo_clip"
        )
    if rc.bypass_mode and recompute:
        errors.append(
            f"{key}.bypass_mode=true uses the rollout's log-probs as π_old, and "
            f"{ARR}.actor.recompute_old_log_prob=true asks for the pass it skips: set one of them to false"
        )
    decoupled = not rc.bypass_mode and (rc.rollout_rs is not None or rc.rollout_is is not None)
    if decoupled and recompute is False:
        errors.append(
            f"{key}: decoupled correction weighs π_old against π_rollout, and "
            f"{ARR}.actor.recompute_old_log_prob=false leaves no π_old: leave it unset, or use bypass_mode=true"
        )


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
            "reward_model.enable=true needs reward_model.model.path (a sequence-classification reward model "
            "directory or hub id); got null"
        )
    term_config_problems(cfg, errors)


def _trainer_errors(errors: list[str], cfg: DictConfig) -> None:
    trainer = cfg.trainer
    _trainer_loop_errors(errors, trainer)
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
    _actor_errors(errors, arr.actor)
    _rollout_ref_errors(errors, arr)
    _lora_errors(errors, cfg)
    _critic_errors(errors, cfg.critic)
    _algorithm_errors(errors, cfg)
    _reward_errors(errors, cfg)
    _trainer_errors(errors, cfg)
    async_errors(errors, cfg)
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
    _chat_template_kwargs_errors(errors, data)
    if not str(cfg.model.path).strip():
        errors.append("model.path is required (a model directory or hub id); got ''")
    _lora_errors(errors, cfg, "model")
    if data.train_files is None:
        errors.append("data.train_files is required (the parquet / jsonl file(s) to train on); got null")
    _optim_errors(errors, "optim", cfg.optim)
    _trainer_loop_errors(errors, cfg.trainer)
    return errors


def validate(cfg: DictConfig) -> None:
    """Check the values of a TrainerConfig or SFTConfig; raise one ConfigError listing every problem."""
    errors = _trainer_config_errors(cfg) if _is_trainer(cfg) else _sft_config_errors(cfg)
    if errors:
        raise ConfigError("invalid config: " + "; ".join(errors))
