"""Checkpoints on disk: the layout, crash-safe writes, the "latest" marker, pruning, RNG state.

Layout of ``<default_local_dir>``::

    latest_checkpointed_iteration.txt     the step of the newest complete checkpoint (verl's name)
    global_step_<N>/
        trainer_state.pt                  step, sampler position, driver RNG, KL controller
        config.yaml                       the run's resolved config
        checkpoint.json                   the id of the run that wrote it, the step, when
        actor/  critic/                   written by the role's workers:
            model.safetensors             weights (rank 0); with LoRA the adapter weights alone, under
                                          peft's layer names (``...q_proj.lora_A.default.weight``): the
                                          frozen base is read from ``model.path`` at resume and export
            model_optim/                  with fsdp2, instead: every rank's weight and optimizer shards (DCP)
            adapter_config.json           the actor's LoRA config, in peft's format (only with LoRA:
                                          ``verl export`` rebuilds the adapters from it)
            base_model.json               only with LoRA: a fingerprint of model.path's files, which a
                                          resume or export checks (``verl.models.base_fingerprint``)
            optim.pt                      optimizer + LR schedule (rank 0)
            rng_rank<r>.pt                each rank's RNG states and shuffle generator
            huggingface/                  HF config, generation config, tokenizer (rank 0)

A checkpoint is written under ``global_step_<N>.tmp`` and renamed to its final name only once every
part is there; the marker is written after that, also through a rename. A crash at any moment leaves
the previous checkpoint whole and the marker pointing at it.

Checkpoints are data, never code: the ``.pt`` files are written and read by `verl.utils.checkpoint_data`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.errors import InputError, describe_error
from verl.utils.checkpoint_data import load_data, to_data
from verl.utils.checkpoint_integrity import MANIFEST_KEY, damage, manifest_of

LATEST = "latest_checkpointed_iteration.txt"
PREFIX = "global_step_"
TMP_SUFFIX = ".tmp"
CHECKPOINT_INFO = "checkpoint.json"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root).expanduser() / f"{PREFIX}{step}"


def tmp_step_dir(root: str | Path, step: int) -> Path:
    """Where checkpoint ``step`` is assembled before it is renamed into place."""
    return Path(root).expanduser() / f"{PREFIX}{step}{TMP_SUFFIX}"


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``); elsewhere
    set and restored at once (a thread creating a file in between would get the wrong mode)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def readable_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the umask (0644 under the usual umask 022)."""
    return 0o666 & ~current_umask()


def make_readable(root: Path) -> None:
    """Give ``root`` and every file under it the mode an ordinary new file (directory) gets under the umask.

    For files a user opens or hands on, written by code that creates them private: ``tempfile.mkstemp``
    (0600), and safetensors' ``save_file`` (0600 with safetensors 0.8), which transformers' ``save_pretrained``
    uses for the weights. Symbolic links are left alone (chmod would change what they point at)."""
    file_mode = readable_file_mode()
    dir_mode = 0o777 & ~current_umask()
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        if path.is_symlink():
            continue
        os.chmod(path, dir_mode if path.is_dir() else file_mode)


def atomic_write_bytes(path: Path, data: bytes, *, readable: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename. The file is
    private (mkstemp's 0600) unless ``readable``: then it keeps the mode of the file it replaces, or gets an
    ordinary new file's (0o666 less the umask: 0644 under umask 022), for files people open (pages,
    generations, metrics)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if readable:
            os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else readable_file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` that never leaves a half-written file at ``path``, nor its temporary file (a full disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:  # a Python file: its write reports a full disk as an OSError
            try:
                torch.save(obj, f)
            except RuntimeError as e:
                # torch's zip writer turns that OSError into "enforce fail ... unexpected pos": the disk's error
                # is the one to report.
                if isinstance(e.__context__, OSError):
                    raise OSError(e.__context__.errno, e.__context__.strerror, str(path)) from e
                raise
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_checkpoint_info(checkpoint: Path, run_id: str, step: int) -> None:
    """Record which run wrote a checkpoint (retention only ever deletes the current run's own) and the
    checksums of its files; written last, once every part is on disk."""
    info = {"run_id": run_id, "step": step, "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    info[MANIFEST_KEY] = manifest_of(checkpoint, skip=(CHECKPOINT_INFO,))
    data = (json.dumps(info, indent=1) + "\n").encode()
    atomic_write_bytes(
        checkpoint / CHECKPOINT_INFO, data, readable=True
    )  # ids and checksums: nothing private


def checkpoint_damage(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` must not be loaded: a file missing, truncated or altered since it was saved (named),
    or a ``checkpoint.json`` that cannot be read; None when it is whole, or was saved without checksums."""
    linked = _link_outside(Path(checkpoint))
    if linked is not None:
        return linked
    path = Path(checkpoint) / CHECKPOINT_INFO
    if not path.is_file():
        return None  # saved before checkpoints recorded their files
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"{path} cannot be read ({describe_error(e)})"
    manifest = info.get(MANIFEST_KEY, {}) if isinstance(info, dict) else None
    if not isinstance(manifest, dict):
        return f"{path} is not a checkpoint record (an object with {MANIFEST_KEY!r})"
    return damage(Path(checkpoint), manifest)


def _link_outside(checkpoint: Path) -> str | None:
    """A symbolic link in ``checkpoint`` that points outside it, said as damage: verl writes none, and one
    makes a resume read whatever file it names (its checksum matches when the file's content does)."""
    base = checkpoint.resolve()
    for path in sorted(checkpoint.rglob("*")):  # links to directories are listed, not followed
        if path.is_symlink() and not path.resolve().is_relative_to(base):
            return (
                f"{path} is a symbolic link to {path.resolve()}, outside the checkpoint (a checkpoint's files "
                "are its own: copy the file in instead)"
            )
    return None


def read_run_id(checkpoint: Path) -> str | None:
    """The id of the run that wrote ``checkpoint`` (None: written before checkpoints recorded it)."""
    path = Path(checkpoint) / CHECKPOINT_INFO
    try:
        info = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None  # unreadable: not known to be the current run's, so never pruned
    return info.get("run_id") if isinstance(info, dict) else None


def checkpoint_steps(root: str | Path) -> list[int]:
    """The steps of the ``global_step_<N>`` directories under ``root``, ascending (unfinished ``.tmp`` ones not)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return []
    return sorted(
        int(p.name[len(PREFIX) :]) for p in root.glob(f"{PREFIX}*") if p.name[len(PREFIX) :].isdigit()
    )


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.pt``, read as data (:func:`load_data`); one that cannot be read
    (truncated, not a torch file, a pickle that calls code) is an InputError naming it."""
    state = load_data(checkpoint / "trainer_state.pt")
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise InputError(
            f"checkpoint {checkpoint}: trainer_state.pt holds no trainer state (a mapping with the integer "
            "global_step); was it written by verl?"
        )
    return state


def step_in_name(checkpoint: Path) -> int | None:
    """The step a ``global_step_<N>`` directory's name says it holds (None: another name)."""
    digits = Path(checkpoint).name[len(PREFIX) :] if Path(checkpoint).name.startswith(PREFIX) else ""
    return int(digits) if digits.isdigit() else None


def read_checkpoint_info(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's ``checkpoint.json`` (``{}`` when it has none or it cannot be read: damage is
    :func:`checkpoint_damage`'s to report)."""
    try:
        info = json.loads((Path(checkpoint) / CHECKPOINT_INFO).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def misnamed(checkpoint: Path, recorded_step: Any) -> str | None:
    """Why ``checkpoint`` must not be resumed when it records ``recorded_step`` and its name says another
    (directories renamed into each other: resuming one would retrain steps and then meet its own later
    checkpoint); None when they agree or either is unknown."""
    named = step_in_name(checkpoint)
    if named is None or not isinstance(recorded_step, int) or recorded_step == named:
        return None
    return (
        f"checkpoint {checkpoint} holds step {recorded_step}, not step {named} as its name says (renamed or "
        f"swapped with another?); rename it back to {PREFIX}{recorded_step}, or remove it; nothing was loaded"
    )


def save_data(obj: Any, path: Path) -> None:
    """Write ``obj`` as data (:func:`to_data`) with :func:`atomic_torch_save`; :func:`load_data` reads it."""
    atomic_torch_save(to_data(obj), path)


def finalize_checkpoint(root: str | Path, step: int) -> Path:
    """Rename the assembled ``global_step_<step>.tmp`` into place, then point the marker at it."""
    final, tmp = step_dir(root, step), tmp_step_dir(root, step)
    if final.exists():
        # The run directory's rules (verl.trainer.run_dir) never let a run reach a step that is on disk.
        raise FileExistsError(f"{final} exists already; a checkpoint is never written over another")
    os.replace(tmp, final)
    # readable: verl's marker, which scripts read to find the newest checkpoint
    atomic_write_bytes(Path(root).expanduser() / LATEST, f"{step}\n".encode(), readable=True)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (from the marker), or None."""
    marker = Path(root).expanduser() / LATEST
    if not marker.is_file():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{marker} should hold a step number, found {text!r}")
    path = step_dir(root, int(text))
    if not (path / "trainer_state.pt").is_file():
        raise FileNotFoundError(f"{marker} points at step {text}, but {path} is missing or incomplete")
    return path


def latest_checkpoint_or_none(root: str | Path) -> Path | None:
    """`latest_checkpoint`, or None when the marker is unreadable or points at nothing."""
    try:
        return latest_checkpoint(root)
    except (ValueError, FileNotFoundError):
        return None


def prune_checkpoints(root: str | Path, keep: int | None, run_id: str, current: int) -> list[Path]:
    """Keep the ``keep`` newest checkpoints of run ``run_id`` up to step ``current`` (None or <= 0: keep
    all); returns the removed ones. Another run's checkpoints, and any after ``current``, are never touched."""
    if not keep or keep <= 0:
        return []
    root = Path(root).expanduser()
    ours = [s for s in checkpoint_steps(root) if s <= current and read_run_id(step_dir(root, s)) == run_id]
    removed = [step_dir(root, s) for s in ours[:-keep]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def rng_state() -> dict[str, Any]:
    """Every global random number generator a process uses: python, numpy, torch (and CUDA if present)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
