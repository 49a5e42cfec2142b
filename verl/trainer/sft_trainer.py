"""Supervised fine-tuning: teach a model the task's answers before RL (the warm start).

Cross-entropy on the response tokens only (prompt tokens are context, not targets). The
held-out split is never read here: only ``data.train_files`` is trained on.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from verl.config import ConfigError, as_file_list
from verl.data import EpochSampler, SFTDataset, collate_sft, iterate_batches
from verl.data.io import check_data_files
from verl.errors import RunDirError
from verl.models import load_hf_model, tokenizer_for
from verl.models.loading import check_fits_model, check_model_dir, resolve_dtype
from verl.models.lora import apply_lora, merged_copy
from verl.trainer.run_dir import RunDirectory
from verl.utils.checkpoint import make_readable
from verl.utils.seeding import set_seed
from verl.utils.threads import choose_torch_threads, configure_torch_threads
from verl.utils.tracking import Tracking
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer
from verl.workers.worker_setup import attention_for

logger = logging.getLogger(__name__)


def sft_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the tokens whose ``loss_mask`` is 1."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).logits
    # Token t is predicted from the logits at t-1.
    targets = batch["input_ids"][:, 1:]
    mask = batch["loss_mask"][:, 1:].float()
    losses = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets, reduction="none")
    return (losses * mask).sum() / mask.sum().clamp_min(1.0)


def check_sft_inputs(config: Any) -> None:
    """The data files and the model the SFT config names, checked before anything is loaded: each problem
    is a ConfigError / InputError naming the key (``data.train_files``, ``model.path``, ...)."""
    missing = [
        key
        for key, value in (("model.path", config.model.path), ("data.train_files", config.data.train_files))
        if value is None or not str(value).strip() or value == []
    ]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} not set: verl sft needs a model and the data to train on, e.g. "
            "`verl sft model.path=MODEL_DIR data.train_files=TRAIN.parquet` (or a list: data.train_files=[a,b])"
        )
    check_data_files(config.data.train_files, "data.train_files")
    resolve_dtype(config.model.torch_dtype, "model.torch_dtype")
    model = config.model
    if model.tokenizer_path:
        check_model_dir(model.tokenizer_path, "model.tokenizer_path", need_config=False, need_tokenizer=True)
    check_model_dir(
        model.path,
        "model.path",
        need_tokenizer=not model.tokenizer_path,
        tokenizer_key="model.tokenizer_path",
    )
    check_fits_model(model.path, config.data.max_length, "data.max_length")


def run_sft(config: Any) -> Path:
    """Train ``config.model.path`` on ``config.data.train_files``; save an HF dir to ``trainer.default_local_dir``
    (which must be empty, or ``trainer.on_existing_run=move_aside``; it is locked while the run writes)."""
    check_sft_inputs(config)
    out_dir = Path(config.trainer.default_local_dir).expanduser()
    inputs = [config.model.path, config.model.tokenizer_path, *as_file_list(config.data.train_files)]
    inside = [
        str(i) for i in inputs if i and Path(i).expanduser().resolve().is_relative_to(out_dir.resolve())
    ]
    if inside:  # moving the output directory aside would move the run's own inputs with it
        raise RunDirError(
            f"trainer.default_local_dir={out_dir} holds this run's inputs ({', '.join(inside)}); write the "
            "model to a directory of its own"
        )
    output = RunDirectory(out_dir)
    output.claim_empty(config.trainer.on_existing_run)
    try:
        _train(config, out_dir)
    finally:
        output.release()
    return out_dir


def _train(config: Any, out_dir: Path) -> None:
    trainer_cfg = config.trainer
    threads = choose_torch_threads(trainer_cfg.torch_threads, model_path=config.model.path)
    configure_torch_threads(threads)
    logger.info(threads.describe())
    set_seed(trainer_cfg.seed)
    tokenizer = tokenizer_for(config.model, "model")
    dataset = SFTDataset(
        config.data.train_files,
        tokenizer,
        prompt_key=config.data.prompt_key,
        response_key=config.data.response_key,
        max_length=config.data.max_length,
        truncation=config.data.truncation,
        max_samples=config.data.train_max_samples,
        chat_template_kwargs=_plain_dict(config.data.apply_chat_template_kwargs),
        files_key="data.train_files",
        messages_key=config.data.messages_key,
        tools_key=config.data.tools_key,
        enable_thinking_key=config.data.enable_thinking_key,
    )
    sampler = EpochSampler(len(dataset), config.data.train_batch_size, shuffle=True, seed=trainer_cfg.seed)
    # The model last: a bad row or a batch the data cannot fill fails before a large model is loaded.
    model = load_hf_model(
        config.model.path,
        torch_dtype=config.model.torch_dtype,
        attn_implementation=attention_for(config.model.attn_implementation, remove_padding=False),
        trust_remote_code=config.model.trust_remote_code,
        key="model.path",
        override_config=OmegaConf.to_container(config.model.override_config),
        override_key="model.override_config",
    )
    # LoRA (model.lora_rank > 0): adapters injected in place, only they train; the optimizer gets only them.
    model = apply_lora(model, _lora_settings(config.model), section="model")
    total_steps = trainer_cfg.total_training_steps or len(sampler) * trainer_cfg.total_epochs
    optimizer = build_optimizer(model.parameters(), config.optim)
    scheduler = build_lr_scheduler(optimizer, config.optim, total_steps)
    tracking = Tracking(
        list(trainer_cfg.logger),
        out_dir,
        total_steps,
        project_name=trainer_cfg.get("project_name", "verl"),
        experiment_name=trainer_cfg.get("experiment_name", "sft"),
        config=OmegaConf.to_container(config, resolve=True),
        desc="sft",
    )
    batches = iterate_batches(
        dataset, sampler, lambda items: collate_sft(items, tokenizer.pad_token_id), num_epochs=None
    )
    model.train()
    start = time.perf_counter()
    with tracking:  # flushed and closed however the loop ends
        for step in range(1, total_steps + 1):
            batch = next(batches)
            loss = sft_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
            optimizer.step()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            metrics = {"train/loss": loss.item(), "train/grad_norm": grad_norm.item(), "train/lr": lr}
            tracking.log(metrics, step)
        tracking.write(
            f"SFT: {total_steps} steps in {time.perf_counter() - start:.0f}s, final loss {loss.item():.4f}"
        )
    # A plain transformers model (LoRA adapters merged into the weights): RL starts from it without peft.
    merged_copy(model).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    make_readable(Path(out_dir))  # (safetensors writes the weights 0600)


def _plain_dict(value: Any) -> dict[str, Any]:
    """A config mapping (``data.apply_chat_template_kwargs``) as a plain dict, for jinja."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)  # type: ignore[return-value]
    return dict(value or {})


def _lora_settings(model_cfg: Any) -> SimpleNamespace:
    """The LoRA keys of the SFT ``model`` section, in the form :func:`apply_lora` reads (verl sft has no
    gradient checkpointing)."""
    return SimpleNamespace(
        lora_rank=model_cfg.lora_rank,
        lora_alpha=model_cfg.lora_alpha,
        target_modules=model_cfg.target_modules,
        exclude_modules=model_cfg.exclude_modules,
        enable_gradient_checkpointing=False,
    )


if __name__ == "__main__":  # verl's launch command since verl 0.7: `python -m verl.trainer.sft_trainer`
    import sys

    from verl.trainer.sft_entry import run_verl_sft

    sys.exit(run_verl_sft(sys.argv[1:], "sft_trainer"))
