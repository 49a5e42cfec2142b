"""Saving and resuming an RL run: what the driver adds to the role workers' checkpoint parts.

The workers write their parts (weights, optimizer, RNG) into ``global_step_<N>.tmp/<role>/``; the
driver writes ``trainer_state.pt`` (the trainer's state: step, sampler position, driver RNG, KL controller) and
``config.yaml``, waits for every rank's ``done_rank<r>`` file, renames the directory into place and
moves the "latest" marker (see :mod:`verl.utils.checkpoint` for the layout). With
``trainer.async_save`` the workers copy their state and write it in the background, and the driver
finishes the checkpoint in a thread, so the next step starts at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from verl.single_controller.base import WorkerGroup
from verl.utils.checkpoint import (
    atomic_torch_save,
    atomic_write_bytes,
    finalize_checkpoint,
    latest_checkpoint,
    prune_checkpoints,
    remove_unfinished,
    tmp_step_dir,
)

logger = logging.getLogger(__name__)

TRAINED_ROLES = {"actor_rollout": "actor", "critic": "critic"}
"""Roles with state on disk, and the checkpoint subdirectory each writes."""

CRASH_ENV = "VERL_TEST_KILL_DURING_SAVE"
"""Fault injection for tests: SIGKILL this process after the parts of checkpoint <step> are written
and before it is renamed into place, the worst moment for a crash."""


class Checkpointer:
    """Writes checkpoints of a run's trained worker groups plus the driver's state, and finds the one to
    resume from. It is given what it saves: the config and the worker groups by role name."""

    def __init__(self, config: Any, groups: Mapping[str, WorkerGroup]) -> None:
        cfg = config.trainer
        self.config = config
        self.groups = {role: groups[role] for role in TRAINED_ROLES if role in groups}
        self.root = Path(cfg.default_local_dir).expanduser()
        self.resume_mode = str(cfg.resume_mode)
        self.background = bool(cfg.async_save)
        caps = [c for c in (cfg.max_actor_ckpt_to_keep, cfg.max_critic_ckpt_to_keep) if c]
        # A checkpoint directory holds both roles, so it stays while either cap still wants it.
        self.keep = max(caps) if caps else None
        self._pending: threading.Thread | None = None
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ saving

    def save(self, step: int, driver_state: dict[str, Any]) -> None:
        """Checkpoint the run as it stands after ``step`` (blocking unless ``trainer.async_save``);
        ``driver_state`` is what the trainer adds (sampler position, RNG, ...), saved as trainer_state.pt."""
        self.wait()
        removed = remove_unfinished(self.root)
        if removed:
            logger.warning("removed unfinished checkpoint(s) left by an earlier crash: %s", removed)
        tmp = tmp_step_dir(self.root, step)
        parts = []
        for role, group in self.groups.items():
            subdir = TRAINED_ROLES[role]
            group.save_checkpoint(str(tmp / subdir), background=self.background)
            parts += [tmp / subdir / f"done_rank{r}" for r in range(group.world_size)]
        atomic_torch_save(driver_state, tmp / "trainer_state.pt")
        atomic_write_bytes(tmp / "config.yaml", OmegaConf.to_yaml(self.config).encode())
        if self.background:
            self._pending = threading.Thread(
                target=self._finish, args=(step, parts), name="verl-ckpt", daemon=True
            )
            self._pending.start()
        else:
            self._finish(step, parts)

    def _finish(self, step: int, parts: list[Path]) -> None:
        try:
            while not all(p.exists() for p in parts):  # the workers' background writers
                time.sleep(0.01)
            if os.environ.get(CRASH_ENV) == str(step):
                os.kill(os.getpid(), signal.SIGKILL)
            finalize_checkpoint(self.root, step)
            prune_checkpoints(self.root, self.keep)
        except BaseException as error:  # surfaced by wait(), in the training thread
            self.error = error

    def wait(self) -> None:
        """Block until the last checkpoint is on disk; raise if writing it failed."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError(f"writing a checkpoint under {self.root} failed: {error}") from error

    # ------------------------------------------------------------------ resuming

    def find_resume_point(self) -> Path | None:
        """``trainer.resume_mode``: auto (the latest checkpoint, if any), disable, or a checkpoint path."""
        mode = self.resume_mode
        if mode == "disable":
            return None
        if mode == "auto":
            return latest_checkpoint(self.root)
        path = Path(mode).expanduser()
        if not (path / "trainer_state.pt").is_file():
            raise FileNotFoundError(
                f"trainer.resume_mode={mode}: not a checkpoint (no trainer_state.pt); expected a "
                f"global_step_<N> directory, e.g. {self.root}/global_step_100"
            )
        return path

    def resume(self) -> dict[str, Any] | None:
        """Restore the worker groups from the resume point and return the driver state saved with it
        (None: nothing to resume). The caller restores its own state from it, the RNG last."""
        path = self.find_resume_point()
        if path is None:
            return None
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        for role, group in self.groups.items():
            subdir = TRAINED_ROLES[role]
            if not (path / subdir).is_dir():
                raise FileNotFoundError(
                    f"checkpoint {path} has no {subdir}/ part, which this run's {role} needs"
                )
            group.load_checkpoint(str(path / subdir))
        logger.info("resumed from %s (step %d)", path, state["global_step"])
        return state


def drop_metrics_after(metrics_path: Path, step: int) -> None:
    """Forget metrics of steps after ``step``: a killed run logged them after its last checkpoint, and
    the resumed run logs those steps again."""
    if not metrics_path.is_file():
        return
    import json

    kept = [
        line
        for line in metrics_path.read_text().splitlines()
        if line and json.loads(line).get("step", 0) <= step
    ]
    atomic_write_bytes(metrics_path, "".join(f"{line}\n" for line in kept).encode())


def export_hf(checkpoint: str | Path, out_dir: str | Path, part: str = "actor") -> Path:
    """Write a checkpoint's policy (``part="critic"``: the value model) as a HuggingFace directory.

    ``checkpoint`` is a ``global_step_<N>`` directory, or a run directory (its latest checkpoint).
    The result loads with ``AutoModelForCausalLM.from_pretrained`` (or AutoModelForTokenClassification).
    """
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    path = Path(checkpoint).expanduser()
    if not (path / "trainer_state.pt").is_file():
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(
                f"{path} is neither a checkpoint (global_step_<N>) nor a run directory with one"
            )
        path = latest
    source = path / part
    if not (source / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{source} has no model.safetensors: is {path} a complete checkpoint with a {part}?"
        )
    config = AutoConfig.from_pretrained(source / "huggingface")
    model_cls = AutoModelForCausalLM if part == "actor" else AutoModelForTokenClassification
    model = model_cls.from_config(config)
    load_model(model, str(source / "model.safetensors"))
    out = Path(out_dir).expanduser()
    model.save_pretrained(out)
    if (source / "huggingface" / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(source / "huggingface").save_pretrained(out)
    return out
