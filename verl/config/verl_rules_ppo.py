"""The rules for the original verl's PPO trainer keys (``verl_keys/ppo_trainer.json``), as ``verl run`` reads
them: verl's other spellings of keys here, values accepted only where they mean what happens here, and keys with
no effect here. Pure data (:mod:`verl.config.verl_rules`).
"""

from __future__ import annotations

from verl.config.verl_rules_common import (
    ASYNC,
    CHECKPOINT,
    CHUNKED_TOPK,
    COMPUTE_DTYPE,
    CONCURRENCY,
    DERIVED,
    FSDP,
    FSDP_KEYS,
    GENRM_PLACEMENT,
    GENRM_SERVER,
    HYDRA,
    KERNELS,
    LOADER,
    LOGGING,
    MEDIA,
    PROFILER,
    RAY,
    REWARD_MODEL,
    ROLLOUT_IS_V06,
    ROUTER,
    SEED,
    SERVER,
    STRATEGY,
    TARGET,
    TEACHER_PLACEMENT,
    TEACHER_SERVER,
    ULYSSES,
    WEIGHT_SYNC,
    Rule,
    _deferred,
    _no,
    _only,
    _rename,
)

READ_MANAGER = (
    "where verl finds the reward manager class: register (by reward_manager.name) or importlib (the class "
    "reward_manager.name in module.path, a file or pkg://module), read as reward_model.reward_manager"
)

GENRM_READ = (
    "name",
    "dtype",
    "temperature",
    "top_p",
    "top_k",
    "do_sample",
    "response_length",
    "max_model_len",
    "max_num_seqs",
    "gpu_memory_utilization",
    "enforce_eager",
    "free_cache_engine",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "max_num_batched_tokens",
)
"""verl's reward.reward_model.rollout keys read here (reward_model.rollout.*, with engine_kwargs)"""
LEGACY_ROLLOUT = (
    "skip_tokenizer_init",
    "load_format",
    "tensor_model_parallel_size",
    "data_parallel_size",
    "expert_parallel_size",
    "cudagraph_capture_sizes",
    "disable_log_stats",
    "limit_images",
    "prompt_length",
)
"""verl 0.7's top-level reward_model.rollout keys that are not ours (the others are reward_model.rollout.* here)"""


def _genrm_rules() -> tuple[Rule, ...]:
    """verl 0.8+'s reward.reward_model.rollout.* onto reward_model.rollout.* (its legacy top-level
    reward_model.rollout.* is that key already), and what the keys not read here do, in both spellings."""
    renames = [
        _rename(f"reward.reward_model.rollout.{key}", f"reward_model.rollout.{key}") for key in GENRM_READ
    ]
    renames.append(
        _rename("reward.reward_model.rollout.engine_kwargs*", "reward_model.rollout.engine_kwargs*")
    )
    weights = "the reward model's weights load from reward_model.model.path with transformers"
    refused = [
        (
            "skip_tokenizer_init",
            (False,),
            "the reward-model server needs its tokenizer (verl asserts it too)",
        ),
        ("quantization", (None,), "a quantized reward model is not built here"),
        ("quantization_config_file", (None,), "a quantized reward model is not built here"),
        ("load_format", (None, "auto", "safetensors", "pt", "hf"), f"{weights} (dummy: random weights)"),
        ("disaggregation.enabled", (False,), "prefill/decode disaggregation: " + GENRM_SERVER),
    ]
    placement = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
    tuning = ("cudagraph_capture_sizes", "disable_log_stats", "layered_summon", "scheduling_policy")
    tuning += ("multi_stage_wake_up", "limit_images", "disaggregation.*")
    unread = {
        **dict.fromkeys((*placement, "expert_parallel_size"), GENRM_PLACEMENT),
        **dict.fromkeys(tuning, GENRM_SERVER),
        "prompt_length": "verl's token-in generate path of its reward-model server: a chat request here is "
        "bounded by reward_model.rollout.max_model_len",
        "n": "as in verl, a request's own n says how many replies it gets",
        "seed": SEED,
        "ignore_eos": "as in verl, a request's own ignore_eos decides (default false)",
    }
    rules = list(renames)
    for prefix, keys in (("reward.reward_model.rollout.", None), ("reward_model.rollout.", LEGACY_ROLLOUT)):
        rules += [_only(prefix + k, ok, why) for k, ok, why in refused if keys is None or k in keys]
        rules += [_no(prefix + k, why) for k, why in unread.items() if keys is None or k in keys]
    for prefix in ("reward.reward_model.", "reward_model."):
        rules += [
            _no(prefix + key, GENRM_PLACEMENT)
            for key in ("enable_resource_pool", "n_gpus_per_node", "nnodes")
        ]
    return tuple(rules)


# Ordered: the first rule whose pattern matches a key decides. Exact keys first, then globs.
PPO_RULES: tuple[Rule, ...] = (
    # --- verl's other spellings of our keys
    _rename("reward.custom_reward_function.*", "custom_reward_function.*"),
    _rename("reward.reward_manager.name", "reward_model.reward_manager"),
    _rename("reward_manager.name", "reward_model.reward_manager"),
    _rename("reward.num_workers", "reward_model.num_workers"),
    _rename("reward.reward_model.enable", "reward_model.enable"),
    _rename("reward.reward_model.model_path", "reward_model.model.path"),
    *_genrm_rules(),
    # the limited manager's per-call timeout and rate limits (verl reads them with .get: scripts add them with +)
    _rename("reward.timeout", "reward_model.timeout_s"),
    _rename("reward_model.timeout", "reward_model.timeout_s"),
    _rename("reward.max_rpm", "reward_model.max_rpm"),
    _rename("reward.max_tpm", "reward_model.max_tpm"),
    _rename("reward.estimated_tokens_per_request", "reward_model.estimated_tokens_per_request"),
    _no("reward.max_concurrent", CONCURRENCY),
    _no("reward_model.max_concurrent", CONCURRENCY),
    _no("reward_model.reward_kwargs.overlong_buffer_cfg.log", "the overlong metrics are always logged here"),
    _no("reward.reward_kwargs.overlong_buffer_cfg.log", "the overlong metrics are always logged here"),
    _rename("reward_model.reward_kwargs.overlong_buffer_cfg.*", "reward_model.overlong_buffer.*"),
    _rename("reward.reward_kwargs.overlong_buffer_cfg.*", "reward_model.overlong_buffer.*"),
    _deferred(
        "reward_model.reward_kwargs.max_resp_len",
        "the DAPO manager's response budget: here it is data.max_response_length, so only that value is accepted",
    ),
    _deferred(
        "reward.reward_kwargs.max_resp_len",
        "the DAPO manager's response budget: here it is data.max_response_length, so only that value is accepted",
    ),
    _rename("actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip"),
    _rename("critic.optim.clip_grad", "critic.grad_clip"),
    _rename(
        "actor_rollout_ref.actor.optim.warmup_style", "actor_rollout_ref.actor.optim.lr_scheduler_type", True
    ),
    _rename("critic.optim.warmup_style", "critic.optim.lr_scheduler_type", True),
    _rename("actor_rollout_ref.actor.tau_pos", "actor_rollout_ref.actor.policy_loss.tau_pos"),
    _rename("actor_rollout_ref.actor.tau_neg", "actor_rollout_ref.actor.policy_loss.tau_neg"),
    _rename("actor_rollout_ref.actor.use_remove_padding", "actor_rollout_ref.model.use_remove_padding"),
    _rename("actor_rollout_ref.actor.checkpoint.async_save", "trainer.async_save"),
    _rename("critic.checkpoint.async_save", "trainer.async_save"),
    # Old global micro-batch sizes: divided by the number of ranks once the config is complete.
    _deferred(
        "actor_rollout_ref.actor.ppo_micro_batch_size", "deprecated in verl: a global micro-batch size"
    ),
    _deferred(
        "actor_rollout_ref.rollout.log_prob_micro_batch_size", "deprecated in verl: a global micro-batch size"
    ),
    _deferred(
        "actor_rollout_ref.ref.log_prob_micro_batch_size", "deprecated in verl: a global micro-batch size"
    ),
    _deferred("critic.ppo_micro_batch_size", "deprecated in verl: a global micro-batch size"),
    _deferred("critic.forward_micro_batch_size", "deprecated in verl: a global micro-batch size"),
    _deferred(
        "trainer.resume_from_path",
        "read only with trainer.resume_mode=resume_path, as in verl (here trainer.resume_mode=<path> says both)",
    ),
    # --- values that would change what is learned: accepted only where they mean what happens here
    _no(
        "reward_model.micro_batch_size",
        "verl's deprecated global micro-batch of the reward model: reward_model.micro_batch_size_per_gpu sets "
        "its forward passes here (the scores do not depend on it)",
    ),
    _only(
        "reward_model.model.override_config",
        (None, {}),
        "overriding the reward model's HuggingFace config is not built here",
    ),
    _only("reward_model.use_reward_loop", (True, False, None), REWARD_MODEL),
    # verl's source=importlib + module.path: read as reward_model.reward_manager=<path>:<name> once merged
    _deferred("reward.reward_manager.source", READ_MANAGER),
    _deferred("reward.reward_manager.module.path", READ_MANAGER),
    _deferred("reward_manager.source", READ_MANAGER),
    _deferred("reward_manager.module.path", READ_MANAGER),
    _only(
        "reward_model.reward_loop_source",
        (None, "register"),
        "a reward loop imported from a file is not built",
    ),
    _only(
        "reward_model.reward_loop_module_path",
        (None,),
        "a reward loop imported from a file is not built here",
    ),
    _only("algorithm.use_pf_ppo", (False,), "PF-PPO's reweighting of samples by reward is not built here"),
    _only(
        "algorithm.rollout_correction.rollout_rs_threshold_lower",
        (None,),
        "verl 0.7.0's lower rejection bound: write it into rollout_rs_threshold as 'lower_upper' (verl 0.7.1 on)",
    ),
    _only(
        "algorithm.rollout_correction.rollout_token_veto_threshold",
        (None,),
        "verl 0.7.0's catastrophic-token veto (removed in verl 0.7.1): reject by a statistic instead, e.g. "
        "rollout_rs=token_k1 with rollout_rs_threshold",
    ),
    _only("algorithm.rollout_is", (None, False), ROLLOUT_IS_V06),
    _only("algorithm.rollout_is_threshold", (None,), ROLLOUT_IS_V06),
    _deferred(
        "actor_rollout_ref.hybrid_engine",
        "whether verl's actor holds the rollout engine: here the actor and the rollout share one module, except "
        "under trainer.v1.trainer_mode=separate_async, where the rollout is a role of its own (verl 0.9.1's false)",
    ),
    _only("skip.*.enable", (False,), "replaying dumped rollouts instead of generating is not built here"),
    _only("actor_rollout_ref.rollout.skip.enable", (False,), "replaying dumped rollouts is not built here"),
    _only("actor_rollout_ref.rollout.skip_rollout", (False,), "replaying dumped rollouts is not built here"),
    _only(
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
        (None,),
        "simulated users (verl's interactions) are not built; a user loop is an agent loop of your own "
        "(rollout.agent.agent_loop_config_path)",
    ),
    _only(
        "actor_rollout_ref.rollout.multi_turn.function_tool_path",
        (None,),
        "tools from plain Python functions are not built; list tool classes in multi_turn.tool_config_path",
    ),
    _only(
        "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template",
        (False,),
        "inserted messages are rendered with the training chat template (the one the prompt used)",
    ),
    _only(
        "actor_rollout_ref.rollout.agent.custom_async_server.*",
        (None,),
        "a custom inference server class: the rollout engines are chosen by rollout.name here",
    ),
    _only(
        "actor_rollout_ref.rollout.over_sample_rate",
        (0, 0.0),
        "over-sampling and aborting rollouts is not built",
    ),
    _only("actor_rollout_ref.rollout.use_fire_sampling", (False,), "FIRE sampling is not built here"),
    _only("actor_rollout_ref.rollout.quantization", (None,), "quantized rollout weights are not built here"),
    _only(
        "actor_rollout_ref.rollout.quantization_config_file", (None,), "quantized rollouts are not built here"
    ),
    _only(
        "actor_rollout_ref.rollout.enable_rollout_routing_replay", (False,), "MoE routing replay is not built"
    ),
    _only(
        "actor_rollout_ref.rollout.disaggregation.enabled",
        (False,),
        "prefill/decode disaggregation: " + SERVER,
    ),
    _only("actor_rollout_ref.actor.router_replay.mode", ("disabled",), "MoE router replay is not built here"),
    _only("actor_rollout_ref.ref.router_replay.mode", ("disabled",), "MoE router replay is not built here"),
    _only("*.qat.enable", (False,), "quantization-aware training is not built here"),
    _only("actor_rollout_ref.actor.policy_loss.dro_beta", (None,), "the DRO loss term is not built here"),
    _only("actor_rollout_ref.actor.optim.optimizer", ("AdamW",), "the optimizer here is torch's AdamW"),
    _only("critic.optim.optimizer", ("AdamW",), "the optimizer here is torch's AdamW"),
    _only("*.optim.optimizer_impl", ("torch.optim",), "the optimizer here is torch.optim.AdamW"),
    _only("*.optim.override_optimizer_config", (None, {}), "optimizer overrides are not built here"),
    _only("*.optim.num_cycles", (0.5,), "the cosine schedule here is a half cycle (verl's default 0.5)"),
    _only(
        "actor_rollout_ref.model.custom_chat_template",
        (None,),
        "a custom chat template is not built here: put it in the tokenizer's tokenizer_config.json",
    ),
    _only("*.hf_config_path", (None,), "the HuggingFace config is read from the model directory here"),
    _rename("actor_rollout_ref.model.lora.merge", "actor_rollout_ref.model.lora_merge"),
    _only("*.model.lora.rank", (0,), "Megatron's LoRA keys: LoRA here is actor_rollout_ref.model.lora_rank"),
    _only(
        "critic.model.lora_rank",
        (0,),
        "LoRA for the critic is not built here (the actor's is: model.lora_rank)",
    ),
    _only("*.mtp.enable", (False,), "multi-token prediction is not built here"),
    _only("data.custom_cls.path", (None,), "a dataset class imported from a file is not built here"),
    _only("data.sampler.class_path", (None,), "a sampler class imported from a file is not built here"),
    _only("data.datagen.path", (None,), "a data generator imported from a file is not built here"),
    _only("data.continuous_token.enable", (False,), "continuous-token inputs are not built here"),
    _only("trainer.default_hdfs_dir", (None,), "copying checkpoints to HDFS is not built here"),
    _only(
        "critic.strategy",
        ("fsdp", "fsdp2", "dp"),
        "the critic follows actor_rollout_ref.actor.strategy; Megatron is not built here",
    ),
    _only(
        "actor_rollout_ref.ref.strategy",
        ("fsdp", "fsdp2", "dp", "${actor_rollout_ref.actor.strategy}"),
        STRATEGY,
    ),
    _only(
        "reward_model.strategy",
        ("fsdp", "fsdp2", "dp"),
        "the reward model runs unsharded in the reward workers here; Megatron is not built",
    ),
    # --- no effect here
    _no("*._target_", TARGET),
    _no("*.rollout_n", DERIVED),
    _no("actor_rollout_ref.rollout.prompt_length", DERIVED + " (data.max_prompt_length)"),
    _no("actor_rollout_ref.rollout.response_length", DERIVED + " (data.max_response_length)"),
    _no("actor_rollout_ref.rollout.n_gpus_per_node", DERIVED + " (trainer.n_gpus_per_node)"),
    _no("critic.loss_scale_factor", DERIVED + " (the critic's loss is a token mean here)"),
    # FSDP2: verl >= 0.8 keeps the critic's engine settings under critic.fsdp
    *(_rename(f"critic.fsdp.{key}", f"critic.model.fsdp_config.{key}") for key in FSDP_KEYS),
    _rename("actor_rollout_ref.actor.fsdp_config.model_dtype", "actor_rollout_ref.model.torch_dtype"),
    _rename("critic.model.fsdp_config.model_dtype", "critic.model.torch_dtype"),
    _rename("critic.fsdp.model_dtype", "critic.model.torch_dtype"),
    _no(
        "actor_rollout_ref.ref.fsdp_config.model_dtype",
        "the reference is a copy of the actor's weights, in their dtype (actor_rollout_ref.model.torch_dtype)",
    ),
    _no("*fsdp_config.dtype", COMPUTE_DTYPE),
    _no("critic.fsdp.dtype", COMPUTE_DTYPE),
    _no(
        "*.forward_prefetch",
        "FSDP1's prefetch switch: FSDP2 gathers the next layer during the current one by itself",
    ),
    _no("*.use_orig_params", "FSDP1's flat-parameter switch: FSDP2 always keeps the original parameters"),
    _no(
        "*fsdp_config.forward_only",
        "marks verl's reference engine as inference-only: it is, here, without one",
    ),
    _no("critic.fsdp.forward_only", "marks an engine as inference-only; the critic trains"),
    _no("*fsdp_config.strategy", STRATEGY),
    _no("critic.fsdp.strategy", STRATEGY),
    _no("*fsdp_config.seed", SEED),
    _no("*fsdp_config*", FSDP),
    _no("critic.fsdp.*", FSDP),
    _no("*profiler*", PROFILER),
    _no("*profile_steps", PROFILER),
    _no("*nsight_options*", PROFILER),
    _no("trainer.npu_profile.*", PROFILER),
    _no("*ulysses_sequence_parallel_size", ULYSSES),
    _no("*.use_torch_compile", KERNELS),
    _no("*.use_fused_kernels", KERNELS),
    _no("*.fused_kernel_options.*", KERNELS),
    _no("*.use_liger", KERNELS),
    _no("*.use_shm", LOADER),
    _no(
        "*.entropy_from_logits_with_chunking",
        KERNELS + " (model.log_prob_chunk_size chunks the LM head here)",
    ),
    _no("*.entropy_from_logits_chunk_size", KERNELS + " (model.log_prob_chunk_size chunks the LM head here)"),
    _no("*.entropy_checkpointing", KERNELS),
    _no("*.pad_to_length*", KERNELS),
    _no("*.enable_activation_offload", KERNELS),
    _no("*.tiled_mlp.*", KERNELS),
    _no("*.use_prefix_grouper", KERNELS + " (model.share_prompts computes each prompt once per group here)"),
    _no("*.calculate_entropy", "entropy is always computed and logged here (actor/entropy)"),
    _no("*.calculate_sum_pi_squared", "a diagnostic verl can log; not computed here"),
    _no("*.freeze_vision_tower", MEDIA),
    _no(
        "*.external_lib",
        "a module verl imports at start-up to register custom code: here the modules (or .py files) listed in "
        "VERL_USE_EXTERNAL_MODULES are imported, in every process, before a loss or estimator name is looked up "
        "(verl.algorithms.external)",
    ),
    _no("*.checkpoint.*", CHECKPOINT),
    _no("*.data_loader_seed", SEED),
    _no("actor_rollout_ref.rollout.seed", SEED),
    _no("*.full_determinism", "runs here are deterministic for a given machine and thread count without it"),
    _no("actor_rollout_ref.nccl_timeout", "collective time-outs of verl's NCCL groups"),
    _no("actor_rollout_ref.ref.model", "the reference is the actor's model here"),
    _no("*.router_replay.*", "MoE router replay files (mode=disabled)"),
    _no("*.qat.*", "quantization-aware training settings (qat.enable=false)"),
    _no("*.mtp.*", "multi-token-prediction settings (mtp.enable=false)"),
    _no("*.mtp", "multi-token-prediction settings (mtp.enable=false)"),
    _no("*.model.lora.*", "Megatron's LoRA settings (lora.rank=0)"),
    _no("critic.model.lora_alpha", "the critic's LoRA settings (critic.model.lora_rank=0)"),
    _no("critic.model.target_modules", "the critic's LoRA settings (critic.model.lora_rank=0)"),
    _no("critic.model.exclude_modules", "the critic's LoRA settings (critic.model.lora_rank=0)"),
    _no("critic.model.lora_adapter_path", "the critic's LoRA settings (critic.model.lora_rank=0)"),
    _no("critic.model.custom_chat_template", "the critic scores token ids; it has no chat template"),
    _no(
        "*.optim.total_training_steps",
        "filled in by verl's trainer; here the schedule runs over the run's steps",
    ),
    _no("*.optim.zero_indexed_step", "the schedule here counts optimizer steps from 0 (verl's default)"),
    _no("actor_rollout_ref.rollout.qat", "quantization-aware training settings (qat.enable=false)"),
    _no(
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode",
        "history is never re-tokenized here (token-in / token-out), so there is nothing to check",
    ),
    _no(
        "actor_rollout_ref.rollout.agent.num_workers",
        "verl's agent-loop worker processes: here every sample's loop is a coroutine of its rollout worker",
    ),
    _no(
        "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts",
        "samples per prompt are actor_rollout_ref.rollout.n",
    ),
    _no(
        "actor_rollout_ref.rollout.multi_turn.completion_callback",
        "verl 0.4's SGLang callback, removed in 0.5",
    ),
    _no("actor_rollout_ref.rollout.nnodes", SERVER),
    _no("actor_rollout_ref.rollout.layered_summon", "LoRA weight sync to an inference server: " + SERVER),
    _no(
        "actor_rollout_ref.rollout.load_format",
        "how vLLM loads its first weights: here it starts from random ones (verl's load_format=dummy) and the "
        "actor's weights are synchronised into it before every generate",
    ),
    _rename(
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        True,
    ),
    _only(
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module",
        (None,),
        "imports a module that registers a backend of one's own in verl's CheckpointEngineRegistry: there is no "
        "such registry here (checkpoint_engine.backend is naive or nccl)",
    ),
    _no("actor_rollout_ref.rollout.checkpoint_engine.*", WEIGHT_SYNC),
    _no("actor_rollout_ref.rollout.router_config_path", ROUTER),
    _no("actor_rollout_ref.rollout.skip*", "rollout replay settings (skip.enable=false)"),
    _no("actor_rollout_ref.rollout.trace.*", "rollout tracing to an external service: " + LOGGING),
    _no("actor_rollout_ref.rollout.prometheus.*", "Prometheus metrics of an inference server: " + SERVER),
    _no(
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval", "MoE load-balance metrics: " + LOGGING
    ),
    _no("actor_rollout_ref.rollout.disaggregation.*", SERVER),
    _no("actor_rollout_ref.rollout.*", SERVER),
    _no("algorithm.rollout_is_*", ROLLOUT_IS_V06),
    _no("algorithm.pf_ppo.*", "PF-PPO settings (use_pf_ppo=false)"),
    _no(
        "algorithm.filter_groups.max_inflight_gen_batches",
        "generation batches run one after another here; the result is the same",
    ),
    _no(
        "data.gen_batch_size",
        "DAPO's generation batch: here each generation batch is data.train_batch_size prompts",
    ),
    _no(
        "data.return_raw_chat",
        "the raw chat is kept for verl's agent loop and reward models; not needed here",
    ),
    _no("data.return_raw_input_ids", "the raw prompt ids are kept for verl's reward models; not needed here"),
    _no("data.return_full_prompt", "the full prompt text is kept for verl's reward models; not needed here"),
    _no("data.return_multi_modal_inputs", MEDIA),
    _no("data.image_key", MEDIA),
    _no("data.video_key", MEDIA),
    _no("data.audio_key", MEDIA),
    _no("data.image_patch_size", MEDIA),
    _no("data.mm_processor_kwargs*", MEDIA),
    _no("data.dataloader_num_workers", LOADER),
    _no("data.filter_overlong_prompts_workers", LOADER),
    _no("data.trust_remote_code", "a data processor's remote code: prompts here use the policy's tokenizer"),
    _no("data.validation_shuffle", "the validation set is read in order here"),
    _no("data.tool_config_path", "tool definitions for multi-turn rollouts (not built here)"),
    _no("data.function_tool_path", "tool definitions for multi-turn rollouts (not built here)"),
    _no("data.custom_cls.*", "dataset class settings (custom_cls.path=null)"),
    _no("data.sampler.*", "sampler class settings (sampler.class_path=null)"),
    _no("data.datagen.*", "data generator settings (datagen.path=null)"),
    _no("data.continuous_token.*", "continuous-token settings (continuous_token.enable=false)"),
    _rename("reward_model.reward_kwargs*", "reward_model.manager_kwargs*"),
    _rename("reward.reward_kwargs*", "reward_model.manager_kwargs*"),
    _no("reward_model.*", REWARD_MODEL),
    _no("reward.reward_manager.module.*", "verl's module.name is unused: the class is reward_manager.name"),
    _no("reward_manager.module.*", "verl's module.name is unused: the class is reward_manager.name"),
    _no("*sandbox_fusion.*", "the sandbox service verl's code scorers call: code tasks are not built here"),
    # distillation: the section is ours (verl.config.schema_distillation) but for where verl runs its teachers
    _no("distillation.n_gpus_per_node", TEACHER_PLACEMENT),
    _no("distillation.nnodes", TEACHER_PLACEMENT),
    _no("distillation.teacher_models.*.num_replicas", TEACHER_PLACEMENT),
    _no("distillation.teacher_models.*.inference.*", TEACHER_SERVER),
    _no("distillation.distillation_loss.use_chunked_topk", CHUNKED_TOPK),
    _no("distillation.distillation_loss.chunked_topk_chunk_size", CHUNKED_TOPK),
    # a teacher entry's key and model_path: read into our free-form distillation.teacher_models as they are
    _rename("distillation.teacher_models.*", "distillation.teacher_models.*"),
    _no(
        "transfer_queue.*",
        "verl's TransferQueue data plane (its V1 trainer always turns it on): data moves between the roles over "
        "Ray / in-process here",
    ),
    _no("skip.*", "rollout replay settings (skip.*.enable=false)"),
    _no("ray_kwargs*", RAY),
    _no("ray_init.*", RAY),
    _no("trainer.esi_redundant_time", "a margin before a cloud job's expiry, for verl's checkpointing"),
    _no(
        "trainer.del_local_ckpt_after_load", "checkpoints here are never deleted except by max_*_ckpt_to_keep"
    ),
    _no("trainer.ray_wait_register_center_timeout", RAY),
    _no("trainer.use_legacy_worker_impl", "selects between verl's worker implementations; there is one here"),
    _no("trainer.v1.sync", "the sync mode's own settings (an empty mapping in verl)"),
    _no(
        "trainer.v1.sampler.custom_sampler.*",
        "a sampler class of one's own for verl's replay buffer: " + ASYNC,
    ),
    _no("trainer.v1.sampler.sampler_kwargs", "arguments of a custom sampler: " + ASYNC),
    _no("trainer.v1.sampler.sync_refill_failed_groups", "failed groups are not refilled: " + ASYNC),
    _no("trainer.v1.separate_async.hybrid_rollout.*", "lending idle trainer GPUs to the rollout: " + ASYNC),
    _only(
        "model_engine",
        ("dp", "fsdp"),
        "Megatron / VeOmni / TorchTitan training is not built here (model_engine=dp)",
    ),
    _no("hydra*", HYDRA),
)
