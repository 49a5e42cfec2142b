"""Saving and resuming an RL run: what the driver adds to the role workers' checkpoint parts.

The workers write their parts (weights, optimizer, RNG) into ``global_step_<N>.tmp/<role>/``; the
driver writes ``trainer_state.pt`` (the trainer's state: step, sampler position, driver RNG, KL controller) and
``config.yaml``, waits for every rank's ``done_rank<r>`` file, renames the directory into place and
moves the "latest" marker (see :mod:`verl.utils.checkpoint` for the layout). With
``trainer.async_save`` the workers copy their state and write it in the background, and the driver
finishes the checkpoint in a thread, so the next step starts at once.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl.errors import InputError, StorageError, UserError, describe_error
from verl.single_controller.base import WorkerGroup
from verl.single_controller.errors import WorkerError
from verl.utils.checkpoint import (
    atomic_write_bytes,
    checkpoint_damage,
    finalize_checkpoint,
    latest_checkpoint,
    latest_checkpoint_or_none,
    load_trainer_state,
    make_readable,
    misnamed,
    prune_checkpoints,
    save_data,
    tmp_step_dir,
    write_checkpoint_info,
)
from verl.utils.checkpoint_data import check_sharded_files

logger = logging.getLogger(__name__)

TRAINED_ROLES = {"actor_rollout": "actor", "critic": "critic"}
"""Roles with state on disk, and the checkpoint subdirectory each writes."""

CRASH_ENV = "VERL_TEST_KILL_DURING_SAVE"
"""Fault injection for tests: SIGKILL this process after the parts of checkpoint <step> are written
and before it is renamed into place, the worst moment for a crash."""


class Checkpointer:
    """Writes checkpoints of a run's trained worker groups plus the driver's state, and finds the one to
    resume from. It is given what it saves: the config and the worker groups by role name, and the id of
    the run (:mod:`verl.trainer.run_dir`), which every checkpoint records and retention respects."""

    def __init__(self, config: Any, groups: Mapping[str, WorkerGroup], run_id: str) -> None:
        cfg = config.trainer
        self.config = config
        self.groups = {role: groups[role] for role in TRAINED_ROLES if role in groups}
        self.root = Path(cfg.default_local_dir).expanduser()
        self.run_id = run_id
        self.background = bool(cfg.async_save)
        caps = [c for c in (cfg.max_actor_ckpt_to_keep, cfg.max_critic_ckpt_to_keep) if c]
        # A checkpoint directory holds both roles, so it stays while either cap still wants it.
        self.keep = max(caps) if caps else None
        self._pending: threading.Thread | None = None
        self._staged: tuple[int, list[Path]] | None = None
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ saving

    def save(self, step: int, driver_state: dict[str, Any]) -> None:
        """Write the checkpoint of the run as it stands after ``step`` (the workers write in the background
        with ``trainer.async_save``); ``driver_state`` is what the trainer adds (sampler position, RNG, ...),
        saved as trainer_state.pt. It counts as a checkpoint only after :meth:`commit`."""
        self.wait()
        tmp = tmp_step_dir(self.root, step)
        shutil.rmtree(tmp, ignore_errors=True)  # an unfinished save of this step: never mixed with this one
        parts: list[Path] = []
        try:
            for role, group in self.groups.items():
                subdir = TRAINED_ROLES[role]
                part_markers = [tmp / subdir / f"done_rank{r}" for r in range(group.world_size)]
                group.save_checkpoint(str(tmp / subdir), background=self.background)
                parts += part_markers
            save_data(
                driver_state, tmp / "trainer_state.pt"
            )  # data only: a resume reads it without unpickling code
            # Private (0600) on purpose: the resolved config holds every override as given, credentials
            # included (an LLM judge's API key in reward_kwargs, a tracker's settings). `verl export` writes
            # the files meant to be handed on, readable.
            atomic_write_bytes(tmp / "config.yaml", OmegaConf.to_yaml(self.config).encode())
        except Exception as error:
            failure = self._discard(step, error, writers=parts)
            if failure is error:
                raise
            raise failure from error
        self._staged = (step, parts)

    def commit(self) -> None:
        """Finish the checkpoint :meth:`save` wrote (blocking unless ``trainer.async_save``). The trainer
        calls it after logging the step's metrics, so a finished checkpoint's step always has its metrics
        line: a run stopped in between resumes from the checkpoint before and runs the step again."""
        if self._staged is None:
            return
        (step, parts), self._staged = self._staged, None
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
                failed = [p.with_name(p.name.replace("done_", "failed_")) for p in parts]
                for marker in failed:
                    if marker.exists():
                        rank = marker.name.removeprefix("failed_rank")
                        raise RuntimeError(f"{marker.parent.name} rank {rank}: {marker.read_text()}")
                time.sleep(0.01)
            write_checkpoint_info(tmp_step_dir(self.root, step), self.run_id, step)
            if os.environ.get(CRASH_ENV) == str(step):
                os.kill(os.getpid(), signal.SIGKILL)
            finalize_checkpoint(self.root, step)
            prune_checkpoints(self.root, self.keep, self.run_id, step)
        except Exception as error:  # surfaced by wait(), in the training thread (Ctrl-C and SIGTERM pass)
            self.error = self._discard(step, error, writers=parts)

    def settle(self, timeout_s: float = 60.0) -> None:
        """On the way out after an error: give a checkpoint being finished in the background up to
        ``timeout_s`` to land, so the run directory is not handed to the next run mid-save. Its errors are
        not raised here (the run already failed)."""
        if self._pending is not None:
            self._pending.join(timeout_s)

    def wait(self) -> None:
        """Block until the last checkpoint is on disk; raise if writing it failed."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self.error is not None:
            error, self.error = self.error, None
            if isinstance(error, StorageError):
                raise error
            raise RuntimeError(f"writing a checkpoint under {self.root} failed: {error}") from error

    def _discard(
        self, step: int, error: BaseException, writers: Sequence[Path] = (), timeout_s: float = 120.0
    ) -> BaseException:
        """After checkpoint ``step`` failed with ``error``: remove its unfinished directory (never loaded, and on
        a full disk it holds the space) and return the error to raise, a StorageError when the file system
        caused it. ``writers`` are the ``done_rank<r>`` markers of parts still being written in the background:
        their writers end first (done or failed), or one would recreate the directory after its removal."""
        deadline = time.monotonic() + timeout_s
        for done in writers:
            failed = done.with_name(done.name.replace("done_", "failed_"))
            while not (done.exists() or failed.exists()) and time.monotonic() < deadline:
                time.sleep(0.01)
        shutil.rmtree(tmp_step_dir(self.root, step), ignore_errors=True)
        return self._storage_error(step, error) or error

    def _storage_error(self, step: int, error: BaseException) -> StorageError | None:
        """The error for a save the file system refused (a full disk, read-only, I/O), said with what is
        left: its unfinished files are removed, the last complete checkpoint intact. None for other failures."""
        cause = _storage_cause(error)
        if cause is None:
            return None
        latest = latest_checkpoint_or_none(self.root)
        kept = (
            f"the last complete checkpoint, {latest}, is intact"
            if latest
            else "there is no earlier checkpoint"
        )
        return StorageError(
            f"the checkpoint of step {step} could not be written under {self.root} ({cause}); its unfinished "
            f"files were removed and {kept}. Free space or fix the file system, then run the same command "
            "again: trainer.resume_mode=auto resumes from the last complete checkpoint"
        )

    # ------------------------------------------------------------------ resuming

    def resume(self, path: Path) -> dict[str, Any]:
        """Restore the worker groups from checkpoint ``path`` and return the driver state saved with it.
        The caller restores its own state from it, the RNG last."""
        damaged = checkpoint_damage(path)
        if damaged is not None:  # changed since the run was planned
            raise InputError(f"checkpoint {path} is damaged, {damaged}; nothing was loaded")
        state = load_trainer_state(path)
        wrong_step = misnamed(path, state["global_step"])
        if wrong_step is not None:
            raise InputError(wrong_step)
        for role, group in self.groups.items():
            subdir = TRAINED_ROLES[role]
            if not (path / subdir).is_dir():
                raise InputError(f"checkpoint {path} has no {subdir}/ part, which this run's {role} needs")
            try:
                group.load_checkpoint(str(path / subdir))
            except WorkerError as error:
                if isinstance(error.__cause__, UserError):  # said by the worker, naming the file: as it is
                    raise error.__cause__ from None
                raise InputError(
                    f"checkpoint {path}: its {subdir}/ part cannot be loaded ({error.cause}); are its files "
                    "whole? Resume from another one with trainer.resume_mode=<a global_step_N directory>"
                ) from error
        logger.info("resumed from %s (step %d)", path, state["global_step"])
        return state


_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}


def _storage_cause(error: BaseException) -> str | None:
    """``[Errno 28] No space left on device`` or the like, when the file system caused ``error``: an OSError
    in its chain, or one a worker reported as text (a WorkerError, a failed background write)."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _STORAGE_ERRNOS:
            return f"[Errno {seen.errno}] {seen.strerror}" + (f": {seen.filename}" if seen.filename else "")
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    found = re.search(r"\[Errno (\d+)\][^\n]*", text)  # Python's OSError, as text
    if found and int(found.group(1)) in _STORAGE_ERRNOS:
        return found.group(0).strip().rstrip(")")
    found = re.search(r"\(os error (\d+)\)", text)  # Rust's (safetensors)
    if found and int(found.group(1)) in _STORAGE_ERRNOS:
        return f"[Errno {found.group(1)}] {os.strerror(int(found.group(1)))}"
    return None


def drop_metrics_after(metrics_path: Path, step: int) -> Path | None:
    """Set aside metrics of steps after ``step``: a killed run logged them after its last checkpoint, and
    the resumed run logs those steps again. They move to ``metrics.after_step_<step>.<time>.jsonl`` (returned)."""
    if not metrics_path.is_file():
        return None
    import json

    kept, dropped = [], []
    for line in metrics_path.read_text().splitlines():
        try:
            record = json.loads(line)
            later = isinstance(record, dict) and record.get("step", 0) > step
        except ValueError:  # a line cut short by the kill: set aside with the others
            later = True
        if line:
            (dropped if later else kept).append(line)
    if not dropped:
        return None
    aside = metrics_path.with_name(f"metrics.after_step_{step}.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    # readable: the metrics the user reads, kept as readable as the tracker wrote them
    atomic_write_bytes(aside, "".join(f"{line}\n" for line in dropped).encode(), readable=True)
    atomic_write_bytes(metrics_path, "".join(f"{line}\n" for line in kept).encode(), readable=True)
    return aside


def export_hf(
    checkpoint: str | Path,
    out_dir: str | Path,
    part: str = "actor",
    overwrite: bool = False,
    adapter: bool = False,
    base_model: str | None = None,
) -> Path:
    """Write a checkpoint's policy (``part="critic"``: the value model) as a HuggingFace directory.

    ``checkpoint`` is a ``global_step_<N>`` directory, or a run directory (its latest checkpoint).
    The result loads with ``AutoModelForCausalLM.from_pretrained`` (or AutoModelForTokenClassification).
    A policy trained with LoRA (its part holds an ``adapter_config.json``) is saved as its adapter weights
    alone: the base weights are read from the run's ``actor_rollout_ref.model.path`` (in the checkpoint's
    ``config.yaml``), or ``base_model`` when given, once checked against the fingerprint of the base the
    checkpoint records (:mod:`verl.models.base_fingerprint`), and the model is written with the adapters
    merged into them, so loading it needs no peft. ``adapter=True`` writes the adapter alone instead, as a
    PEFT adapter directory (``PeftModel.from_pretrained(base, out_dir)`` loads it; its
    ``base_model_name_or_path`` is that base path); a checkpoint without LoRA has none to write (InputError).
    A non-empty ``out_dir`` is refused unless ``overwrite``; then only the files the export writes are
    replaced, and any other file there stays (the model is written to a temporary sibling first, so an
    interrupted export leaves ``out_dir`` as it was).

    A checkpoint may come from anyone, so the export runs none of its code: weights are safetensors, the
    sharded layout's pickles are checked first (`verl.utils.checkpoint_data.check_sharded_files`), and no model
    or tokenizer code is trusted (``trust_remote_code`` is off, whatever the checkpoint's config.yaml says).
    """
    from transformers import AutoTokenizer

    from verl.models.lora import ADAPTER_CONFIG, peft_available, peft_missing_message
    from verl.workers.engine.sharded_checkpoint import SHARDED_DIR, has_sharded_state

    path = _checkpoint_dir(checkpoint)
    damaged = checkpoint_damage(path)
    if damaged is not None:
        raise InputError(f"checkpoint {path} is damaged, {damaged}; nothing was exported")
    source = path / part
    check_sharded_files(source)  # before torch's DCP reader unpickles them
    sharded = has_sharded_state(source)
    weights_file = source / (SHARDED_DIR if sharded else "model.safetensors")
    if not sharded and not weights_file.is_file():
        raise InputError(
            f"{source} has no model.safetensors nor {SHARDED_DIR}/: is {path} a complete checkpoint with a {part}?"
        )
    out = _export_target(out_dir, overwrite)
    if not (source / "huggingface" / "config.json").is_file():
        raise InputError(f"{source / 'huggingface'} has no config.json: is {path} a complete checkpoint?")
    lora = (source / ADAPTER_CONFIG).is_file()
    if not lora and (adapter or base_model is not None):
        option = "--adapter" if adapter else "--base-model"
        raise InputError(
            f"{option}: {source} was not trained with LoRA (it has no {ADAPTER_CONFIG}; "
            "actor_rollout_ref.model.lora_rank was 0), so it has no adapter; export it without that option"
        )
    if lora and not peft_available():
        raise InputError(peft_missing_message(f"exporting {source}, which was trained with LoRA,"))
    try:
        model = _lora_export(path, source, adapter, base_model) if lora else _full_export(source, part)
    except UserError:
        raise
    except Exception as error:  # corrupt or mismatched files: the checkpoint's fault, said in one line
        raise InputError(
            f"checkpoint {path}: {weights_file} cannot be read; is it whole? ({describe_error(error)})"
        ) from error
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        model.save_pretrained(staging)
        if not adapter and (source / "huggingface" / "tokenizer_config.json").is_file():
            AutoTokenizer.from_pretrained(source / "huggingface", trust_remote_code=False).save_pretrained(
                staging
            )
        out.mkdir(exist_ok=True)
        for item in staging.iterdir():
            # readable like any file the user writes (save_pretrained's weights file comes out 0600)
            make_readable(item)
            os.replace(item, out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _checkpoint_dir(checkpoint: str | Path) -> Path:
    """``checkpoint`` as a ``global_step_<N>`` directory: itself, or a run directory's latest checkpoint."""
    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise InputError(f"checkpoint {path} does not exist")
    if (path / "trainer_state.pt").is_file():
        return path
    try:
        latest = latest_checkpoint(path)
    except (ValueError, FileNotFoundError) as e:
        raise InputError(f"{path}: {e}") from None
    if latest is None:
        raise InputError(f"{path} is neither a checkpoint (global_step_<N>) nor a run directory with one")
    return latest


def _export_target(out_dir: str | Path, overwrite: bool) -> Path:
    """``out_dir``, refused when it is a file, or a non-empty directory without ``overwrite``."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file; give a directory to write the model to")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise InputError(
            f"{out} is not empty ({shown}); give a new directory, or --overwrite to replace the model "
            "files there (other files are kept)"
        )
    return out


def _full_export(source: Path, part: str) -> Any:
    """The model of a checkpoint part that holds every weight (trained without LoRA)."""
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from verl.workers.engine.sharded_checkpoint import has_sharded_state, load_sharded

    config = AutoConfig.from_pretrained(source / "huggingface", trust_remote_code=False)
    model_cls = AutoModelForCausalLM if part == "actor" else AutoModelForTokenClassification
    model = model_cls.from_config(config)
    if has_sharded_state(source):  # every rank's shards, assembled in this process
        load_sharded(model, None, source)
    else:
        load_model(model, str(source / "model.safetensors"))
    return model


def _lora_export(checkpoint: Path, source: Path, adapter: bool, base_model: str | None) -> Any:
    """What `export_hf` saves for a LoRA checkpoint part: the PEFT adapter (``adapter``), or the merged model,
    its base read from ``base_model`` or the run's ``actor_rollout_ref.model.path`` once its fingerprint
    matches the one the part records."""
    from transformers import AutoConfig

    from verl.models import load_hf_model
    from verl.models.base_fingerprint import base_fingerprint, check_same_base
    from verl.models.lora_files import adapter_export, merged_export
    from verl.workers.engine.sharded_checkpoint import read_weights

    run_model = None
    if (checkpoint / "config.yaml").is_file():
        run_model = OmegaConf.select(OmegaConf.load(checkpoint / "config.yaml"), "actor_rollout_ref.model")
    key = "--base-model" if base_model is not None else "actor_rollout_ref.model.path"
    base_path = base_model if base_model is not None else (run_model.path if run_model is not None else None)
    hf_config = AutoConfig.from_pretrained(source / "huggingface", trust_remote_code=False)
    weights = read_weights(source)
    if adapter:
        return adapter_export(source, hf_config, weights, None if base_path is None else str(base_path))

    def load_base() -> Any:
        if base_path is None:
            raise InputError(
                f"{source} holds the LoRA adapter without the base weights, and {checkpoint} names no base "
                "model (no config.yaml with actor_rollout_ref.model.path): give it with --base-model"
            )
        check_same_base(source, base_fingerprint(base_path), key, base_path)
        return load_hf_model(
            base_path,
            torch_dtype=run_model.torch_dtype if run_model is not None else "float32",
            # Never on the checkpoint's word: its config.yaml could name a base whose code it planted.
            trust_remote_code=False,
            key=key,
            config=hf_config,
        )

    return merged_export(source, hf_config, weights, load_base)
