"""The files a trained role writes and reads: its part of a checkpoint (`save_role_checkpoint`, with the
HuggingFace config and tokenizer from rank 0), the parts a resume loads (`load_contents`), and the whole
model as a HuggingFace directory (`write_hf_model`, LoRA adapters merged; `save_hf_metadata`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from verl.models.lora import merged_copy, plain_model_with
from verl.workers.engine.sharded_checkpoint import full_weights_on_rank0
from verl.workers.engine.trained import TrainedModel


def save_hf_metadata(hf_model: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """What a HuggingFace model directory holds besides the weights: config, generation config, tokenizer."""
    hf_model.config.save_pretrained(path)
    if getattr(hf_model, "generation_config", None) is not None:
        hf_model.generation_config.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def write_hf_model(role: TrainedModel, rank: int, path: str | Path) -> None:
    """The role's whole model as a HuggingFace directory (weights and config), written by rank 0, LoRA
    adapters merged into the weights; sharded, the weights are gathered first (a collective)."""
    if role.sharded:
        with role.resident():
            weights = full_weights_on_rank0(role.hf_model)
        if rank == 0:
            plain_model_with(role.hf_model, weights).save_pretrained(path)
    elif rank == 0:
        merged_copy(role.hf_model).save_pretrained(path)


def save_role_checkpoint(
    role: TrainedModel, checkpoint_cfg: Any, tokenizer: Any, rank: int, path: str, background: bool
) -> threading.Thread | None:
    """This rank's part of a checkpoint (see verl.utils.checkpoint), the parts ``checkpoint.save_contents``
    names, plus, from rank 0, the HF config and tokenizer that ``verl export`` turns it into a model directory
    with (and, with ``hf_model``, the whole model there already)."""
    contents = list(checkpoint_cfg.save_contents)
    hf_dir = Path(path) / "huggingface"
    if "hf_model" in contents:
        write_hf_model(role, rank, hf_dir)
    if rank == 0:
        save_hf_metadata(role.hf_model, tokenizer, hf_dir)
    return role.save_checkpoint(path, rank, background, contents)


def load_contents(checkpoint_cfg: Any) -> list[str]:
    """``checkpoint.load_contents``, which defaults to what is saved (verl's ``${.save_contents}``)."""
    contents = checkpoint_cfg.load_contents
    return list(checkpoint_cfg.save_contents if contents is None else contents)
