"""Raw hub rows in, verl-schema ``train.parquet`` / ``test.parquet`` out, refusing anything that could lose data.

Every split is read and converted before the first file is written, so a bad row in ``test`` never
leaves a new ``train.parquet`` next to an old ``test.parquet``. Existing output files are kept unless
``overwrite`` is set, and an output file is never one of the input files, ``overwrite`` or not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from verl.data.io import BadRows, DatasetError, read_files, write_rows
from verl.data.preprocess import gsm8k, math
from verl.data.preprocess.sources import SPLITS, SplitFiles, find_split_files
from verl.data.preprocess.spec import DatasetSpec, Row
from verl.errors import InputError

DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (gsm8k.SPEC, math.SPEC)}

OUTPUT_NAMES = {split: f"{split}.parquet" for split in SPLITS}


@dataclass(frozen=True)
class WrittenSplit:
    """One output file: which split, where, how many rows, and how many bad rows were skipped."""

    split: str
    path: Path
    rows: int
    skipped: int = 0


def get_spec(dataset: str) -> DatasetSpec:
    """The spec registered as ``dataset``; an unknown name lists the known ones."""
    try:
        return DATASETS[dataset]
    except KeyError:
        if dataset == "reasoning_gym":
            raise InputError(
                "reasoning_gym rows are generated, not read from a file: call "
                "verl.data.preprocess.preprocess_reasoning_gym(task, size, seed, save_dir)"
            ) from None
        raise InputError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}") from None


def preprocess(
    dataset: str,
    local_dataset_path: str | os.PathLike | None,
    local_save_dir: str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
    split: str | None = None,
    bad_rows: str = "fail",
) -> list[WrittenSplit]:
    """Convert a local copy of ``dataset`` (``gsm8k`` or ``math``) into verl's format under ``local_save_dir``.

    Writes ``<split>.parquet`` for each split found (see :func:`find_split_files`) and returns what was
    written. ``local_save_dir`` defaults to verl's (``~/data/gsm8k``, ``~/data/math``). ``bad_rows="skip"``
    drops (and counts) rows that cannot be converted instead of failing on the first one.
    Raises :class:`~verl.errors.InputError` subclasses naming the file, row and column to fix.
    """
    spec = get_spec(dataset)
    if local_dataset_path is None:
        raise InputError(no_local_dataset_message(spec))
    save_dir = Path(local_save_dir or spec.default_save_dir).expanduser()
    inputs = find_split_files(local_dataset_path, spec, split)
    check_outputs(save_dir, inputs, overwrite)
    converted = {name: convert_split(spec, name, files, BadRows(bad_rows)) for name, files in inputs.items()}
    return [
        WrittenSplit(name, write_split(save_dir / OUTPUT_NAMES[name], rows), len(rows), skipped)
        for name, (rows, skipped) in converted.items()
    ]


def no_local_dataset_message(spec: DatasetSpec) -> str:
    """Why there is no download, and what to give instead."""
    return (
        f"the {spec.name} dataset must be given as a local file or directory with --local_dataset_path "
        f"(this command never downloads): {spec.layout()}. On a machine with internet, e.g. "
        f"`huggingface-cli download {spec.data_source} --repo-type dataset --local-dir DIR`, then "
        f"--local_dataset_path DIR"
    )


def check_outputs(save_dir: Path, inputs: SplitFiles, overwrite: bool) -> None:
    """Refuse a save dir that is a file, one that already holds train/test files (unless ``overwrite``), and
    any output that is one of the inputs (always: converting a file onto itself destroys the raw data)."""
    if save_dir.exists() and not save_dir.is_dir():
        raise InputError(f"--local_save_dir {save_dir} is a file; give a directory")
    sources = {file.resolve() for files in inputs.values() for file in files}
    for name in inputs:
        target = save_dir / OUTPUT_NAMES[name]
        if target.resolve() in sources:
            raise InputError(
                f"--local_save_dir {save_dir}: writing {target.name} would replace the input file {target}; "
                "give another --local_save_dir"
            )
    existing = [save_dir / out for out in OUTPUT_NAMES.values() if (save_dir / out).exists()]
    if existing and not overwrite:
        names = ", ".join(file.name for file in existing)
        raise InputError(
            f"--local_save_dir {save_dir} already holds {names}; refusing to replace them. Give another "
            "--local_save_dir, or --overwrite to replace the files this run writes"
        )


def convert_split(
    spec: DatasetSpec, split: str, files: list[Path], bad_rows: BadRows
) -> tuple[list[Row], int]:
    """Read one split's files (in shard order) and convert every row; returns the rows and the skip count.

    ``extra_info.index`` counts rows across the split's shards, as the hub's split does; a skipped row
    keeps its number, so an index always points back at the same raw row.
    """
    records = read_files(files, key="--local_dataset_path", bad_rows=bad_rows)
    rows = []
    for index, (path, row_in_file, raw) in enumerate(records):
        try:
            rows.append(spec.make_row(raw, split, index, f"{path} row {row_in_file}"))
        except DatasetError as error:
            bad_rows.handle(error)
    if not rows:
        raise DatasetError(f"no usable rows for the {split} split in {', '.join(map(str, files))}")
    return rows, bad_rows.count


def write_split(path: Path, rows: list[Row]) -> Path:
    """Write ``rows`` as parquet (atomically, via :func:`verl.data.io.write_rows`).

    Every row gets every column (None where a JSON lines row lacked a passed-through one): pyarrow takes
    the columns from the first row only and would otherwise drop the others without a word.
    """
    import pyarrow as pa

    columns = list(dict.fromkeys(key for row in rows for key in row))
    full = [{key: row.get(key) for key in columns} for row in rows]
    try:
        return write_rows(path, full)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        raise DatasetError(
            f"cannot write {path}: a column holds values of different types ({error})"
        ) from error
