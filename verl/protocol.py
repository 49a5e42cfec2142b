"""DataProto: the one batch type that flows between workers in an RL step.

A DataProto holds three things:

* ``batch``: ``dict[str, torch.Tensor]``; every tensor shares dim 0, the batch size;
* ``non_tensor_batch``: ``dict[str, np.ndarray]`` of the same length, for python objects
  (strings, dicts, ...) kept in object arrays;
* ``meta_info``: a free-form dict that is not split along the batch (temperature, step, ...).

The API follows verl's DataProto so user code ports unchanged, but ``batch`` is a plain dict instead of a
``tensordict.TensorDict``. Every method here validates what it builds; a plain dict can still be changed
behind our back (``data.batch["x"] = t``), so call :meth:`DataProto.check_consistency` after doing that.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.utils.checkpoint_data import register_data_class

__all__ = ["DataProto", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]

# Anything that selects rows: a slice, a sequence of ints, or a 1-D int / bool array or tensor.
RowIndex = slice | Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor


def _to_object_array(values: Any, key: str) -> np.ndarray:
    """Turn a sequence of python objects into a 1-D object array; ndarrays pass through unchanged.

    ``np.array(values, dtype=object)`` builds a 2-D array when every element is a list of the same length
    (and fails on ragged nesting), so elements are assigned one at a time instead.
    """
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, str | bytes | dict) or not hasattr(values, "__len__"):
        raise TypeError(
            f"non_tensor_batch[{key!r}] must be a list or np.ndarray with one entry per sample, "
            f"got {type(values).__name__}"
        )
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def _normalize_index(index: RowIndex, size: int) -> slice | np.ndarray:
    """Turn a row selector into a slice or a 1-D int64 array, with bounds checked up front.

    Checking here gives the same clear error whether or not the DataProto holds any tensors.
    """
    if isinstance(index, slice):
        return index
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    array = np.asarray(index)
    if array.ndim != 1:
        raise IndexError(f"row index must be 1-D, got shape {array.shape}")
    if array.dtype == np.bool_:
        if len(array) != size:
            raise IndexError(f"boolean mask has length {len(array)} but the batch size is {size}")
        return np.flatnonzero(array)
    if array.size == 0:
        return array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise IndexError(f"row index must hold integers or booleans, got dtype {array.dtype}")
    if array.min() < -size or array.max() >= size:
        raise IndexError(
            f"row index out of range for batch size {size}: min {array.min()}, max {array.max()}"
        )
    return array.astype(np.int64)


def _equal(a: Any, b: Any) -> bool:
    """Exact equality for union conflicts; NaN equals NaN so a batch can be unioned with a copy of itself."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        b = b.to(a.device)
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:  # elements may be arrays or dicts: compare one by one
            return all(_equal(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
        nan_ok = a.dtype.kind in "fc" and b.dtype.kind in "fc"
        return bool(np.array_equal(a, b, equal_nan=nan_ok))
    try:
        return bool(a == b)
    except (ValueError, RuntimeError):  # e.g. dicts holding arrays: ambiguous truth value
        return False


def _key_list(keys: str | Sequence[str] | None) -> list[str] | None:
    """Accept a single key as well as a list, so ``select("x")`` does not iterate over characters."""
    if keys is None:
        return None
    return [keys] if isinstance(keys, str) else list(keys)


def _pick(columns: dict[str, Any], keys: str | Sequence[str] | None, where: str) -> dict[str, Any]:
    """Sub-dict of ``columns`` for ``keys`` (``None`` means all), raising KeyError for missing keys."""
    key_list = _key_list(keys)
    if key_list is None:
        return dict(columns)
    missing = [k for k in key_list if k not in columns]
    if missing:
        raise KeyError(f"{where} has no key(s) {missing}; available: {list(columns)}")
    return {k: columns[k] for k in key_list}


@dataclass(eq=False)
class DataProtoItem:
    """One sample of a DataProto, as returned by ``data[i]``: tensors and objects without the batch dim."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)  # eq would compare dicts of tensors, which is ambiguous; identity is what we want
class DataProto:
    """A batch of samples: tensors and object arrays sharing dim 0, plus batch-wide ``meta_info``.

    ``None`` is accepted for any field and becomes an empty dict. Indexing with an int returns a
    :class:`DataProtoItem` (one sample, batch dim removed, like verl); every other selector returns a
    DataProto. Slices give views of the tensors; index arrays and masks give copies. ``meta_info`` is
    shallow-copied into every derived DataProto, so editing a slice's meta_info leaves the parent alone.
    """

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.batch = {} if self.batch is None else self.batch
        self.non_tensor_batch = {} if self.non_tensor_batch is None else self.non_tensor_batch
        self.meta_info = {} if self.meta_info is None else self.meta_info
        self.check_consistency()

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build from column dicts; lists in ``non_tensors`` become 1-D object arrays."""
        non_tensor_batch = {k: _to_object_array(v, k) for k, v in (non_tensors or {}).items()}
        return cls(dict(tensors or {}), non_tensor_batch, dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Build from one dict: tensors go to ``batch``, everything else to ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, non_tensors, meta_info)

    def check_consistency(self) -> None:
        """Raise if a column has the wrong type or disagrees with the others on dim 0."""
        reference: tuple[str, int] | None = None
        for where, columns, kind in (
            ("batch", self.batch, torch.Tensor),
            ("non_tensor_batch", self.non_tensor_batch, np.ndarray),
        ):
            if not isinstance(columns, dict):
                raise TypeError(f"DataProto.{where} must be a dict, got {type(columns).__name__}")
            for key, value in columns.items():
                name = f"{where}[{key!r}]"
                if not isinstance(value, kind):
                    hint = " (DataProto.from_dict converts lists)" if kind is np.ndarray else ""
                    raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}{hint}")
                if value.ndim == 0:
                    raise ValueError(f"{name} is 0-dimensional; every column needs a batch dimension")
                if reference is None:
                    reference = (name, value.shape[0])
                elif value.shape[0] != reference[1]:
                    raise ValueError(
                        f"{name} has size {value.shape[0]} in dim 0 but {reference[0]} has size "
                        f"{reference[1]}; all columns must share the batch size"
                    )
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")

    def __len__(self) -> int:
        for columns in (self.batch, self.non_tensor_batch):
            for value in columns.values():
                return value.shape[0]
        return 0

    def _has_columns(self) -> bool:
        return bool(self.batch or self.non_tensor_batch)

    def __repr__(self) -> str:
        def describe(columns: dict[str, Any]) -> str:
            parts = []
            for key, value in columns.items():
                dtype = str(value.dtype).removeprefix("torch.")
                device = (
                    f" {value.device}"
                    if isinstance(value, torch.Tensor) and value.device.type != "cpu"
                    else ""
                )
                parts.append(f"{key}: {tuple(value.shape)} {dtype}{device}")
            return "{" + ", ".join(parts) + "}"

        return (
            f"DataProto(batch_size={len(self)}, batch={describe(self.batch)}, "
            f"non_tensor_batch={describe(self.non_tensor_batch)}, meta_info_keys={list(self.meta_info)})"
        )

    def _take(self, rows: slice | np.ndarray) -> DataProto:
        if isinstance(rows, slice):
            batch = {k: v[rows] for k, v in self.batch.items()}
        else:
            index = torch.from_numpy(rows)
            batch = {k: v[index.to(v.device)] for k, v in self.batch.items()}
        non_tensor_batch = {k: v[rows] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch, non_tensor_batch, dict(self.meta_info))

    def __getitem__(self, item: int | RowIndex) -> DataProtoItem | DataProto:
        if isinstance(item, torch.Tensor) and item.ndim == 0:
            item = item.item()
        if isinstance(item, int | np.integer) and not isinstance(item, bool | np.bool_):
            size = len(self)
            if not -size <= item < size:
                raise IndexError(f"index {item} out of range for DataProto of size {size}")
            return DataProtoItem(
                batch={k: v[item] for k, v in self.batch.items()},
                non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                meta_info=dict(self.meta_info),
            )
        return self._take(_normalize_index(item, len(self)))

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def select_idxs(self, idxs: RowIndex) -> DataProto:
        """Rows picked by an index list/array/tensor or a boolean mask (always a new DataProto)."""
        return self._take(_normalize_index(idxs, len(self)))

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """New DataProto with only the given keys (``None`` keeps all); shares tensors unless ``deepcopy``."""
        selected = DataProto(
            _pick(self.batch, batch_keys, "batch"),
            _pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch"),
            _pick(self.meta_info, meta_info_keys, "meta_info"),
        )
        return copy.deepcopy(selected) if deepcopy else selected

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the given keys from self and return them as a new DataProto.

        ``None`` pops nothing (as in verl). All keys are checked before anything is removed, so a KeyError
        leaves self unchanged. The batch size is derived from the columns, so popping every column leaves
        self with length 0.
        """
        picked = [
            (columns, _pick(columns, keys or [], where))
            for columns, keys, where in (
                (self.batch, batch_keys, "batch"),
                (self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch"),
                (self.meta_info, meta_info_keys, "meta_info"),
            )
        ]
        for columns, chosen in picked:
            for key in chosen:
                del columns[key]
        return DataProto(*(chosen for _, chosen in picked))

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename columns in ``batch`` or ``non_tensor_batch`` in place; returns self."""
        old, new = _key_list(old_keys) or [], _key_list(new_keys) or []
        if len(old) != len(new) or len(set(new)) != len(new):
            raise ValueError(f"rename needs as many distinct new keys as old keys, got {old} -> {new}")
        missing = [k for k in old if k not in self.batch and k not in self.non_tensor_batch]
        if missing:
            raise KeyError(f"rename: no column(s) {missing}")
        kept = (set(self.batch) | set(self.non_tensor_batch)) - set(old)
        clash = sorted(kept & set(new))
        if clash:
            raise ValueError(f"rename: column(s) {clash} already exist")
        mapping = dict(zip(old, new, strict=True))
        self.batch = {mapping.get(k, k): v for k, v in self.batch.items()}
        self.non_tensor_batch = {mapping.get(k, k): v for k, v in self.non_tensor_batch.items()}
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other``'s keys into self in place and return self.

        A key present on both sides must hold equal values (it usually means the same column came back
        from two workers); a conflict raises ValueError naming the key, and self is left unchanged.
        """
        if self._has_columns() and other._has_columns() and len(self) != len(other):
            raise ValueError(f"union: batch sizes differ ({len(self)} vs {len(other)})")
        sections = (
            ("batch", self.batch, other.batch),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        )
        for where, mine, theirs in sections:
            for key, value in theirs.items():
                if key in mine and not _equal(mine[key], value):
                    raise ValueError(f"union: {where}[{key!r}] differs between the two DataProtos")
        for _, mine, theirs in sections:
            mine.update(theirs)
        self.check_consistency()
        return self

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts (e.g. one per worker); the size must divide evenly."""
        if chunks <= 0:
            raise ValueError(f"chunks must be positive, got {chunks}")
        size = len(self)
        if size % chunks:
            raise ValueError(
                f"cannot chunk a DataProto of size {size} into {chunks} equal parts; "
                f"pad first with pad_dataproto_to_divisor(data, {chunks})"
            )
        step = size // chunks
        return [self[i * step : (i + 1) * step] for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into parts of ``split_size`` rows; the last may be smaller. An empty batch gives []."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Stack DataProtos along dim 0; all must have the same keys. ``meta_info`` comes from the first."""
        if not data:
            raise ValueError("concat needs at least one DataProto")
        first = data[0]
        for i, item in enumerate(data[1:], start=1):
            for where in ("batch", "non_tensor_batch"):
                expected, got = set(getattr(first, where)), set(getattr(item, where))
                if expected != got:
                    raise ValueError(
                        f"concat: {where} keys of item {i} differ from item 0: "
                        f"missing {sorted(expected - got)}, extra {sorted(got - expected)}"
                    )
        batch, non_tensor_batch = {}, {}
        try:
            for key in first.batch:
                batch[key] = torch.cat([d.batch[key] for d in data])
            for key in first.non_tensor_batch:
                non_tensor_batch[key] = np.concatenate([d.non_tensor_batch[key] for d in data])
        except (RuntimeError, ValueError) as error:
            raise ValueError(f"concat: cannot concatenate column {key!r}: {error}") from error
        return DataProto(batch, non_tensor_batch, dict(first.meta_info))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every sample: ``interleave=True`` gives [a, a, b, b], ``False`` gives [a, b, a, b]."""
        if repeat_times < 0:
            raise ValueError(f"repeat_times must be >= 0, got {repeat_times}")
        rows = np.arange(len(self))
        return self._take(np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times))

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat sample ``i`` ``repeat_times[i]`` times, keeping order: counts [2, 0, 1] on [a, b, c] -> [a, a, c]."""
        if isinstance(repeat_times, torch.Tensor):
            repeat_times = repeat_times.detach().cpu().numpy()
        counts = np.asarray(repeat_times, dtype=np.int64)
        if counts.shape != (len(self),):
            raise ValueError(f"need one repeat count per sample ({len(self)}), got shape {counts.shape}")
        if (counts < 0).any():
            raise ValueError("repeat counts must be >= 0")
        return self._take(np.repeat(np.arange(len(self)), counts))

    def reorder(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> None:
        """Permute the rows in place (e.g. to balance sequence lengths across workers)."""
        if isinstance(indices, slice):
            raise TypeError("reorder needs an index array, not a slice")
        rows = _normalize_index(indices, len(self))
        if not np.array_equal(np.sort(rows % max(len(self), 1)), np.arange(len(self))):
            raise ValueError(
                f"reorder needs a permutation of range({len(self)}), got {rows.tolist()[:10]}..."
            )
        reordered = self._take(rows)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def to(self, device: str | torch.device) -> DataProto:
        """Move tensors to ``device`` in place (non-tensors stay on the host); returns self."""
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        return self

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        shuffle: bool = False,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[DataProto]:
        """Yield mini-batches for ``epochs`` passes over the data.

        ``mini_batch_size`` must divide the batch size so every update sees the same number of samples.
        With ``shuffle`` each epoch draws a fresh permutation from one generator seeded with ``seed``, so a
        fixed seed reproduces the whole sequence. ``dataloader_kwargs={"shuffle": ...}`` is accepted for
        verl compatibility; no other DataLoader options are supported.
        """
        if dataloader_kwargs:
            unsupported = set(dataloader_kwargs) - {"shuffle"}
            if unsupported:
                raise ValueError(f"make_iterator: unsupported dataloader_kwargs {sorted(unsupported)}")
            shuffle = dataloader_kwargs.get("shuffle", shuffle)
        size = len(self)
        if mini_batch_size <= 0 or size % mini_batch_size:
            raise ValueError(
                f"mini_batch_size {mini_batch_size} must be positive and divide batch size {size}"
            )
        if epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {epochs}")
        generator = torch.Generator()
        generator.seed() if seed is None else generator.manual_seed(seed)

        def iterate() -> Iterator[DataProto]:  # a nested generator so the checks above run eagerly
            for _ in range(epochs):
                if shuffle:
                    order = torch.randperm(size, generator=generator).numpy()
                for start in range(0, size, mini_batch_size):
                    end = start + mini_batch_size
                    yield self._take(order[start:end]) if shuffle else self[start:end]

        return iterate()

    def save_to_disk(self, path: str) -> None:
        """Write the batch as data (tensors, numpy arrays as tagged plain values), which
        :meth:`load_from_disk` reads without unpickling code (`verl.utils.checkpoint_data.to_data`)."""
        from verl.utils.checkpoint_data import to_data

        torch.save(to_data(self), path)

    @staticmethod
    def load_from_disk(path: str) -> DataProto:
        """Load a DataProto saved by :meth:`save_to_disk` (or by its older versions, which pickled it whole)
        as data only: a file whose pickle would run code is refused (an InputError), nothing in it runs."""
        from verl.utils.checkpoint_data import load_data

        data = load_data(path)
        if not isinstance(data, DataProto):
            raise TypeError(f"{path} holds a {type(data).__name__}, not a DataProto")
        return data


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` to a multiple of ``size_divisor`` by appending rows copied from the start (wrapping
    around if more padding than rows is needed), as verl does before chunking across workers.

    Returns the padded DataProto and the number of rows added, for :func:`unpad_dataproto`.
    """
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    pad_size = -len(data) % size_divisor
    if pad_size == 0:
        return data, 0
    padding = data.select_idxs(np.arange(pad_size) % len(data))
    return DataProto.concat([data, padding]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if not 0 <= pad_size <= len(data):
        raise ValueError(f"pad_size must be in [0, {len(data)}], got {pad_size}")
    return data[: len(data) - pad_size] if pad_size else data


# checkpoints hold DataProtos (batches in flight of the async modes) as data, not as pickles
register_data_class(DataProto, ("batch", "non_tensor_batch", "meta_info"))
