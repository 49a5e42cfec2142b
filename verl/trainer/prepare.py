"""Create what a recipe needs but the machine does not have yet: task data, a tiny model, its SFT warm start.

This is what makes ``verl run`` work on a fresh machine with no downloads. Every artifact is
written under a temporary name and renamed into place, so an interrupted run never leaves a
half-written model behind for the next one to load.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl.config import SFTConfig, as_file_list, load_config, sft_overrides
from verl.data import prepare_task
from verl.models import make_tiny_model

logger = logging.getLogger(__name__)


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").exists()


def prepare_inputs(config: Any, log=print) -> None:
    """Write missing task files and build + warm-start the model at ``actor_rollout_ref.model.path``."""
    prep = config.prepare
    if not prep.enable:
        return
    train_files, val_files = as_file_list(config.data.train_files), as_file_list(config.data.val_files)
    if prep.task:
        if len(train_files) != 1 or len(val_files) != 1:
            raise ValueError("prepare.task writes one train file and one val file; give one path for each")
        prepare_task(prep.task, train_files[0], val_files[0], **OmegaConf.to_container(prep.task_kwargs))

    model_path = Path(config.actor_rollout_ref.model.path).expanduser()
    if _is_model_dir(model_path):
        return
    if not prep.tiny_model:
        raise FileNotFoundError(
            f"actor_rollout_ref.model.path={model_path} is not a model directory, and prepare.tiny_model is "
            "empty so none can be built; point model.path at a HuggingFace model directory"
        )
    base = model_path.with_name(model_path.name + "-init")
    if not _is_model_dir(base):
        log(f"[prepare] building a tiny model at {base}")
        tmp = base.with_name(base.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        make_tiny_model(tmp, seed=config.trainer.seed, **OmegaConf.to_container(prep.tiny_model))
        tmp.rename(base)
    if not prep.sft:
        shutil.copytree(base, model_path)
        return
    log(f"[prepare] SFT warm start of {base} -> {model_path}")
    from verl.trainer.sft_trainer import run_sft

    tmp = model_path.with_name(model_path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    overrides = [
        f"model.path={base}",
        f"data.train_files={train_files}",
        f"trainer.default_local_dir={tmp}",
        f"trainer.seed={config.trainer.seed}",
    ]
    if config.trainer.torch_threads:
        overrides.append(f"trainer.torch_threads={config.trainer.torch_threads}")
    sft_config = load_config(
        None, overrides + sft_overrides(OmegaConf.to_container(prep.sft)), schema=SFTConfig
    )
    run_sft(sft_config)
    tmp.rename(model_path)
