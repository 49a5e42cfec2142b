"""The rules for the original verl's SFT trainer keys (``verl_keys/sft_trainer.json``), as ``verl sft`` reads
them. Pure data (:mod:`verl.config.verl_rules`).
"""

from __future__ import annotations

from verl.config.verl_rules_common import (
    HYDRA,
    KERNELS,
    LOADER,
    PROFILER,
    TARGET,
    ULYSSES,
    Rule,
    _deferred,
    _no,
    _only,
    _rename,
)

SFT_FSDP = (
    "FSDP settings of verl's SFT engine: verl sft trains in one process here (under torchrun, rank 0 trains); "
    "sharded SFT is not built"
)
SFT_ONE_PASS = (
    "micro-batching of verl's GPU workers: each optimizer step here takes one token mean over the whole "
    "data.train_batch_size batch (verl's fsdp_sft_trainer averaged per-micro-batch token means, which weighs "
    "tokens a little differently when lengths vary)"
)
SFT_SAVE = "verl sft here saves the fine-tuned model once, at the end (a plain HuggingFace directory)"

# verl's SFT keys (fsdp_sft_trainer until v0.7, the engine-based sft_trainer since), read by `verl sft`.
SFT_RULES: tuple[Rule, ...] = (
    _rename("model.partial_pretrain", "model.path", deprecated=True),
    _rename("optim.clip_grad", "optim.grad_clip"),
    _rename("optim.warmup_steps_ratio", "optim.lr_warmup_steps_ratio", deprecated=True),
    _rename("optim.lr_scheduler", "optim.lr_scheduler_type", deprecated=True),
    _rename("optim.warmup_style", "optim.lr_scheduler_type", deprecated=True),
    _deferred("data.prompt_dict_keys", "fields inside data.prompt_key: here prompt_key=<column>.<field>"),
    _deferred(
        "data.response_dict_keys", "fields inside data.response_key: here response_key=<column>.<field>"
    ),
    _deferred("data.multiturn.enable", "multi-turn rows: here data.messages_key=<column>"),
    _deferred("data.multiturn.messages_key", "multi-turn rows: here data.messages_key=<column>"),
    _only("engine", ("fsdp", "fsdp2", "dp"), "the training engine here is one process (no Megatron)"),
    _only("model", ("hf_model",), "the model here is a HuggingFace model (model=hf_model)"),
    _only("optim", ("fsdp",), "the optimizer here is torch's AdamW (optim=fsdp)"),
    _no("profiler", PROFILER),
    _no("hydra*", HYDRA),
    _only("model.strategy", ("fsdp", "fsdp2", "dp"), "the training engine here is one process (no Megatron)"),
    _only("data.custom_cls.path", (None,), "a dataset class imported from a file is not built here"),
    _only(
        "data.chat_template", (None,), "a custom chat template: put it in the tokenizer_config.json instead"
    ),
    _only("model.custom_chat_template", (None,), "a custom chat template: put it in tokenizer_config.json"),
    _only("model.hf_config_path", (None,), "the HuggingFace config is read from the model directory here"),
    _only("model.lora_adapter_path", (None,), "starting from a saved LoRA adapter is not built here"),
    _only("model.lora.rank", (0,), "Megatron's LoRA keys: LoRA here is model.lora_rank"),
    _only("model.mtp.enable", (False,), "multi-token prediction is not built here"),
    _only("optim.optimizer", ("AdamW",), "the optimizer here is torch's AdamW"),
    _only("optim.optimizer_impl", ("torch.optim",), "the optimizer here is torch.optim.AdamW"),
    _only("optim.override_optimizer_config", (None, {}), "optimizer overrides are not built here"),
    _only("optim.num_cycles", (0.5,), "the cosine schedule here is a half cycle (verl's default 0.5)"),
    _only("trainer.default_hdfs_dir", (None,), "copying checkpoints to HDFS is not built here"),
    _only("trainer.resume_from_path", (None,), "resuming an SFT run is not built here; a run starts afresh"),
    _only("trainer.resume_path", (None,), "resuming an SFT run is not built here; a run starts afresh"),
    _no(
        "trainer.resume_mode",
        "resuming an SFT run is not built here: a run starts afresh, into an empty directory",
    ),
    _no("*._target_", TARGET),
    _no("data.micro_batch_size*", SFT_ONE_PASS),
    _no("data.max_token_len_per_gpu", SFT_ONE_PASS),
    _no("data.use_dynamic_bsz", SFT_ONE_PASS),
    _no("data.pad_mode", "sequences are right-padded to the longest in the batch here"),
    _no("data.balance_dp_token", "one process: nothing to balance"),
    _no("data.num_workers", LOADER),
    _no("data.use_shm", LOADER),
    _no("data.custom_cls.*", "dataset class settings (custom_cls.path=null)"),
    _rename("data.multiturn.tools_key", "data.tools_key", deprecated=True),
    _rename("data.multiturn.enable_thinking_key", "data.enable_thinking_key", deprecated=True),
    _only(
        "data.enable_thinking_default",
        ("none", None),
        "an enable_thinking for rows without the column: set data.apply_chat_template_kwargs.enable_thinking",
    ),
    _no("data.ignore_input_ids_mismatch", "a template that does not render incrementally is a bad row here"),
    _no("data.val_max_samples", "verl sft here has no validation pass"),
    _no("model.fsdp_config.*", SFT_FSDP),
    _no("engine.*", SFT_FSDP),
    _no("model.enable_gradient_checkpointing", KERNELS),
    _no("model.enable_activation_offload", KERNELS),
    _no("model.use_liger", KERNELS),
    _no("model.use_fused_kernels", KERNELS),
    _no("model.fused_kernel_options.*", KERNELS),
    _no("model.tiled_mlp.*", KERNELS),
    _no("model.use_remove_padding", KERNELS),
    _no("use_remove_padding", KERNELS),
    _no("ulysses_sequence_parallel_size", ULYSSES),
    _no("model.use_shm", LOADER),
    _no(
        "model.external_lib",
        "a module verl imports at start-up to register custom code: here the modules (or .py files) listed in "
        "VERL_USE_EXTERNAL_MODULES are imported, in every process, before a loss or estimator name is looked up "
        "(verl.algorithms.external)",
    ),
    _no("model.mtp.*", "multi-token-prediction settings (mtp.enable=false)"),
    _no("model.lora.*", "Megatron's LoRA settings (lora.rank=0)"),
    _no(
        "optim.total_training_steps",
        "filled in by verl's trainer; the schedule here runs over the run's steps",
    ),
    _no("optim.zero_indexed_step", "the schedule here counts optimizer steps from 0 (verl's default)"),
    _no("*profiler*", PROFILER),
    _no("trainer.profile_interval", PROFILER),
    _no("checkpoint.*", SFT_SAVE),
    _no("trainer.checkpoint.*", SFT_SAVE),
    _no("trainer.save_freq", SFT_SAVE),
    _no("trainer.max_ckpt_to_keep", SFT_SAVE),
    _no("trainer.device", "verl sft runs on the CPU here"),
    _no("trainer.nnodes", "verl sft trains in one process here; data.train_batch_size is global, as in verl"),
    _no(
        "trainer.n_gpus_per_node",
        "verl sft trains in one process here; data.train_batch_size is global, as in verl",
    ),
    _no("trainer.balance_batch", "one process: nothing to balance"),
)
"""verl's SFT keys (``verl_keys/sft_trainer.json``) as ``verl sft`` reads them"""
