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

Checkpoints are data, never code. Unpickling a file can call any function the file names, so a
checkpoint handed on, copied in or edited could run code on resume; its checksums do not help (whoever
plants the code writes them). So the ``.pt`` files hold only tensors and plain containers (dicts, lists,
tuples, strings, numbers: :func:`to_data` turns numpy arrays and DataProtos into those) and are read with
``torch.load(weights_only=True)``, whose unpickler builds nothing but those (:func:`load_data`). A file
from before that (numpy arrays pickled as they are) is read through the same unpickler with numpy's array
reconstruction allowed, which builds arrays and calls nothing else; a file naming any other function is
refused, and nothing in it runs.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import shutil
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.errors import InputError, describe_error
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


# ---------------------------------------------------------------------------------------- data, not code

DATA_TAG = "__verl_data__"
"""the key of a mapping that stands for a value ``torch.load(weights_only=True)`` cannot build itself"""


def to_data(obj: Any, where: str = "state") -> Any:
    """``obj`` as plain data that ``torch.load(weights_only=True)`` reads back: tensors, numbers, strings,
    bytes, None and dicts / lists / tuples of them as they are (a subclass as its base: an OrderedDict as a
    dict); numpy arrays and scalars, sets and DataProtos as tagged mappings (:func:`from_data` rebuilds them). Anything else is a TypeError naming where it is, so a
    state that would need code to load is caught when it is saved, not when it is resumed."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor, torch.dtype)):
        return obj
    if isinstance(obj, dict):
        return {k: to_data(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, torch.Size):
        return obj
    if isinstance(obj, (list, tuple)):
        items = [to_data(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, (set, frozenset)):
        items = [to_data(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return {DATA_TAG: "set", "frozen": isinstance(obj, frozenset), "items": items}
    if isinstance(obj, np.ndarray):
        return _array_to_data(obj, where)
    if isinstance(obj, np.generic):
        return {DATA_TAG: "numpy_scalar", "dtype": obj.dtype.str, "bytes": obj.tobytes()}
    for name, (cls, fields) in DATA_CLASSES.items():
        if isinstance(obj, cls):
            return {DATA_TAG: name, **{f: to_data(getattr(obj, f), f"{where}.{f}") for f in fields}}
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which a checkpoint cannot hold as data"
    )


DATA_CLASSES: dict[str, tuple[type, tuple[str, ...]]] = {}
"""Dataclasses a checkpoint holds as tagged mappings of their fields, by tag: registered by their own module
(``verl.protocol`` registers DataProto), so this module imports none of them."""


def register_data_class(cls: type, fields: tuple[str, ...]) -> type:
    """Let checkpoints hold ``cls`` as data: :func:`to_data` writes ``fields``, :func:`from_data` calls
    ``cls(**fields)``, and older checkpoints that pickled it whole may name it."""
    DATA_CLASSES[cls.__name__] = (cls, fields)
    return cls


def _array_to_data(array: np.ndarray, where: str) -> dict[str, Any]:
    """A numpy array as a tagged mapping: its bytes, or with dtype object its items one by one."""
    if array.dtype.hasobject:
        items = [to_data(v, f"{where}[{i}]") for i, v in enumerate(array.reshape(-1))]
        return {DATA_TAG: "numpy_objects", "shape": list(array.shape), "items": items}
    if array.dtype.fields is not None:
        raise TypeError(f"{where} is a structured numpy array, which a checkpoint cannot hold as data")
    data = np.ascontiguousarray(array).tobytes()
    return {DATA_TAG: "numpy", "dtype": array.dtype.str, "shape": list(array.shape), "bytes": data}


def from_data(obj: Any) -> Any:
    """The value :func:`to_data` turned into ``obj``."""
    if isinstance(obj, dict):
        kind = obj.get(DATA_TAG)
        if kind is None:
            return {k: from_data(v) for k, v in obj.items()}
        return _from_tagged(kind, obj)
    if isinstance(obj, list):
        return [from_data(v) for v in obj]
    if isinstance(obj, tuple) and type(obj) is tuple:
        return tuple(from_data(v) for v in obj)
    return obj


def _from_tagged(kind: str, obj: dict[str, Any]) -> Any:
    if kind == "numpy":
        return np.frombuffer(obj["bytes"], dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    if kind == "numpy_scalar":
        return np.frombuffer(obj["bytes"], dtype=np.dtype(obj["dtype"]))[0]
    if kind == "numpy_objects":
        items = [from_data(v) for v in obj["items"]]
        array = np.empty(len(items), dtype=object)
        for i, item in enumerate(items):  # one by one: a list item must stay one element
            array[i] = item
        return array.reshape(obj["shape"])
    if kind == "set":
        items = [from_data(v) for v in obj["items"]]
        return frozenset(items) if obj["frozen"] else set(items)
    if kind in DATA_CLASSES:
        cls, fields = DATA_CLASSES[kind]
        return cls(**{f: from_data(obj[f]) for f in fields})
    raise ValueError(f"unknown tagged value {kind!r}")


def save_data(obj: Any, path: Path) -> None:
    """Write ``obj`` as data (:func:`to_data`) with :func:`atomic_torch_save`; :func:`load_data` reads it."""
    atomic_torch_save(to_data(obj), path)


def _old_format_globals() -> list[Any]:
    """What an older checkpoint's pickles may name besides tensors: numpy's array and scalar reconstruction
    (under numpy 2's module names and numpy 1's) and the DataProto dataclass. Each only builds a value: the
    weights-only unpickler calls nothing that is not listed here or in torch's own list."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    dtypes = {type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGSUOVMm"}
    allowed: list[Any] = [
        multiarray._reconstruct,
        multiarray.scalar,
        np.ndarray,
        np.dtype,
        *(cls for cls, _ in DATA_CLASSES.values()),
        *dtypes,
    ]
    for name in ("_reconstruct", "scalar"):
        allowed += [(getattr(multiarray, name), f"numpy.core.multiarray.{name}")]
        allowed += [(getattr(multiarray, name), f"numpy._core.multiarray.{name}")]
    allowed += [(t, f"numpy.dtypes.{t.__name__}") for t in dtypes if t.__module__ != "numpy.dtypes"]
    return allowed


def _global_name(entry: Any) -> str:
    return entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}"


def _code_globals(path: Path, allowed: list[Any]) -> list[str]:
    """The functions and classes ``path``'s pickle names that the data-only unpickler may not build,
    found by reading its opcodes (nothing is unpickled); [] when there are none, or the file is not a
    zip-format torch file (then the unpickler itself refuses them)."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a zip file, truncated: torch.load says what is wrong
        return []
    names = {_global_name(entry) for entry in allowed}
    return [name for name in found if name not in names]


_UNSUPPORTED = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")
"""how torch's weights-only unpickler (and :class:`_DataUnpickler`) name a global they refused"""


def load_data(path: Path) -> Any:
    """A checkpoint file read as data: tensors and plain containers (:func:`to_data`'s), or an older file's
    numpy arrays. A file whose pickle names any other function or class could run code when unpickled: it
    is refused (InputError naming the file and what it calls) and nothing in it runs; a file that cannot be
    read at all (truncated, not a torch zip file) is an InputError too."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} is missing or not a file")
    if not zipfile.is_zipfile(path):  # verl's torch has always written zip files: this one is cut or replaced
        raise InputError(
            f"{path} is not a whole checkpoint file (a torch zip archive); truncated or replaced?"
        )
    allowed = _old_format_globals()
    code = _code_globals(path, allowed)
    if code:
        raise _code_error(path, code)
    try:
        with torch.serialization.safe_globals(allowed):
            raw = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        raise _unpickling_error(path, e, f"cannot be read as checkpoint data ({_torch_reason(e)})") from None
    except Exception as e:
        raise InputError(f"{path} cannot be read ({_torch_reason(e)}); is it whole?") from None
    try:
        return from_data(raw)
    except Exception as e:
        raise InputError(f"{path} holds malformed checkpoint data ({describe_error(e)})") from None


_TORCH_BOILERPLATE = ("Weights only load failed", "In PyTorch 2.6", "Check the documentation", "Re-running")


def _torch_reason(error: BaseException) -> str:
    """What torch.load says went wrong, without its advice to load with ``weights_only=False`` (which would
    run whatever the file holds)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith(_TORCH_BOILERPLATE)]
    if not reasons and lines:  # one long line: its first sentence
        reasons = [lines[0].split(". In PyTorch")[0]]
    return f"{type(error).__name__}: {reasons[0]}" if reasons else type(error).__name__


def _unpickling_error(path: Any, error: pickle.UnpicklingError, otherwise: str) -> InputError:
    """A refused global named in ``error`` is code the file would run (:func:`_code_error`); any other
    unpickling error is ``path`` plus ``otherwise``."""
    found = _UNSUPPORTED.search(str(error))
    return _code_error(path, [found.group(1)]) if found else InputError(f"{path} {otherwise}")


def _code_error(path: Path, names: list[str]) -> InputError:
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return InputError(
        f"{path} holds a pickle that could run code when loaded (it names {shown}); refused, nothing in it "
        "was run or loaded. A checkpoint holds data only: was this file written by verl, or planted?"
    )


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


# ------------------------------------------------------------------ the sharded layout's pickles (DCP)

SHARDED_METADATA = Path("model_optim") / ".metadata"
"""the index of a part's sharded (DCP) files: a pickle, which torch's DCP reader unpickles in full"""


def _dcp_metadata_classes() -> dict[str, Any]:
    """What a DCP ``.metadata`` pickle may name: DCP's metadata dataclasses, torch.Size, dtypes, layouts
    and the path of the checkpoint (what torch itself writes there); each only builds a value."""
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata

    allowed: dict[str, Any] = {
        f"{metadata.__name__}.{name}": cls
        for name, cls in vars(metadata).items()
        if isinstance(cls, type) and cls.__module__ == metadata.__name__
    }
    allowed[f"{filesystem.__name__}._StorageInfo"] = filesystem._StorageInfo
    allowed["torch.Size"] = torch.Size
    allowed["torch.serialization._get_layout"] = torch.serialization._get_layout
    allowed.update({f"pathlib.{name}": getattr(pathlib, name) for name in ("PosixPath", "PurePosixPath")})
    allowed.update({f"torch.{n}": v for n, v in vars(torch).items() if isinstance(v, torch.dtype)})
    allowed["collections.OrderedDict"] = __import__("collections").OrderedDict
    return allowed


class _DataUnpickler(pickle.Unpickler):
    """An unpickler that builds only the classes in ``allowed``: naming anything else is an UnpicklingError
    (``find_class`` is the only way a pickle reaches a function, so nothing else can be called)."""

    def __init__(self, file: Any, allowed: dict[str, Any]) -> None:
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get(f"{module}.{name}")
        if found is None:
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")
        return found


def check_sharded_files(part: Path) -> None:
    """Refuse a part whose sharded (DCP) files would run code when torch's DCP reader loads them: it unpickles
    ``model_optim/.metadata`` in full, and each non-tensor value (the optimizer's hyperparameters) with
    ``torch.load(weights_only=False)``. Here the index is read with an unpickler that builds DCP's metadata
    classes alone, and each such value with ``weights_only=True``; anything else is an InputError naming the
    file, and nothing in it runs. A part without that layout passes."""
    index = Path(part) / SHARDED_METADATA
    if not index.is_file():
        return
    try:
        with open(index, "rb") as f:
            metadata = _DataUnpickler(f, _dcp_metadata_classes()).load()
        items = [(info, metadata.state_dict_metadata[i.fqn]) for i, info in metadata.storage_data.items()]
    except pickle.UnpicklingError as e:
        raise _unpickling_error(index, e, f"cannot be read ({describe_error(e)}); is it whole?") from None
    except Exception as e:
        raise InputError(f"{index} cannot be read ({describe_error(e)}); is it whole?") from None
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    for info, meta in items:
        if isinstance(meta, BytesStorageMetadata):
            _check_sharded_value(index.parent, info)


def _check_sharded_value(directory: Path, info: Any) -> None:
    """One non-tensor value of a DCP checkpoint (a ``torch.save`` blob inside a ``.distcp`` file), read as
    data: what DCP would otherwise unpickle in full."""
    path = directory / str(info.relative_path)
    if getattr(info, "transform_descriptors", None):  # verl writes none; DCP would decode, then unpickle
        raise InputError(
            f"{path} holds an encoded value (transforms {info.transform_descriptors}); verl writes none"
        )
    try:
        with open(path, "rb") as f:
            f.seek(int(info.offset))
            blob = f.read(int(info.length))
        torch.load(io.BytesIO(blob), weights_only=True)
    except pickle.UnpicklingError as e:
        found = _UNSUPPORTED.search(str(e))
        raise (
            _code_error(path, [found.group(1)])
            if found
            else InputError(f"{path} cannot be read as checkpoint data ({_torch_reason(e)})")
        ) from None
    except (OSError, RuntimeError, ValueError, EOFError) as e:
        raise InputError(f"{path} cannot be read ({_torch_reason(e)}); is it whole?") from None
