"""Checkpoint files as data, never code: what the ``.pt`` files may hold and how they are read back.

Unpickling a file can call any function the file names, so a
checkpoint handed on, copied in or edited could run code on resume; its checksums do not help (whoever
plants the code writes them). So the ``.pt`` files hold only tensors and plain containers (dicts, lists,
tuples, strings, numbers: :func:`to_data` turns numpy arrays and DataProtos into those) and are read with
``torch.load(weights_only=True)``, whose unpickler builds nothing but those (:func:`load_data`). A file
from before that (numpy arrays pickled as they are) is read through the same unpickler with numpy's array
reconstruction allowed, which builds arrays and calls nothing else; a file naming any other function is
refused, and nothing in it runs.

The sharded (DCP) layout's pickles get the same treatment before torch's DCP reader sees them
(:func:`check_sharded_files`). Writing is `verl.utils.checkpoint.save_data` (to_data, then a crash-safe save).
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.errors import InputError, describe_error

DATA_TAG = "__verl_data__"
"""the key of a mapping that stands for a value ``torch.load(weights_only=True)`` cannot build itself"""


def to_data(obj: Any, where: str = "state") -> Any:
    """``obj`` as plain data that ``torch.load(weights_only=True)`` reads back: tensors, numbers, strings,
    bytes, None and dicts / lists / tuples of them as they are (a subclass as its base: an OrderedDict as a
    dict); numpy arrays and scalars, sets and DataProtos as tagged mappings (:func:`from_data` rebuilds them).
    Anything else is a TypeError naming where it is, so a state that would need code to load is caught when
    it is saved, not when it is resumed."""
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
