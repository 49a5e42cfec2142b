"""The value rules of the sections the workers run on: ``actor_rollout_ref`` (the actor, the rollout and the
reference: sampling, multi-turn and agent loops), ``critic``, and ``algorithm`` (advantage estimator, KL
control, rollout correction). Called by :func:`verl.config.validation.validate`; written with the checks of
``value_rules.py``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.algorithms.advantages import estimator_needs
from verl.algorithms.core import LOSS_AGG_MODES
from verl.config.backends import DTYPE_NAMES
from verl.config.validation_shared import ARR, optim_errors
from verl.config.value_rules import check_at_least, check_choice, check_in_range
from verl.tools.config import TOOLS_DIR, tool_config_file

KL_CTRL_TYPES = ("fixed", "adaptive")
TRUNCATE_SIDES = ("left", "right", "middle")


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


def actor_errors(errors: list[str], actor: Any) -> None:
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
    optim_errors(errors, f"{prefix}.optim", actor.optim)


def rollout_ref_errors(errors: list[str], arr: Any) -> None:
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
    check_in_range(
        errors,
        f"{key}.tool_call_timeout_s",
        multi_turn.get("tool_call_timeout_s"),
        0,
        low_open=True,
        null="no limit",
        note="seconds per tool call",
    )
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


def critic_errors(errors: list[str], critic: Any) -> None:
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
    optim_errors(errors, "critic.optim", critic.optim)


def algorithm_errors(errors: list[str], cfg: DictConfig) -> None:
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
    # groups=True) needs rollout.n >= 2 (verl: "GRPO needs rollout.n > 1"), unless its advantages train nothing:
    # on-policy distillation without task rewards (verl's OPD scripts sample once per prompt)
    if estimator_needs(algo.adv_estimator).groups and n == 1 and not _advantages_unused(cfg):
        errors.append(
            f"algorithm.adv_estimator={algo.adv_estimator} compares the responses to each prompt with each "
            f"other, so it needs {ARR}.rollout.n >= 2 (the group size); got 1: set rollout.n (e.g. 8), or use "
            "an estimator that works with one response per prompt (gae, reinforce_plus_plus, remax), or distil "
            "without task rewards (distillation.enabled=true, distillation.distillation_loss.use_task_rewards=false)"
        )


def _advantages_unused(cfg: DictConfig) -> bool:
    """On-policy distillation without task rewards: the actor's loss is the distillation loss alone."""
    from verl.config.validation_distillation import distillation_enabled

    return distillation_enabled(cfg) and not cfg.distillation.distillation_loss.use_task_rewards


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
