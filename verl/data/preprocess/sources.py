"""Finding the raw split files of a local hub dataset copy: one file, a directory of ``train.*`` / ``test.*``
files, or a hub snapshot whose splits are sharded under a config folder (``main/train-00000-of-00001.parquet``).

Nothing is downloaded: the command works on machines without internet, and a dataset that is read is
one the user can see and keep.
"""

from __future__ import annotations

import re
from pathlib import Path

from verl.data.io import SUPPORTED_EXTENSIONS, DataFileNotFoundError, DatasetError, check_data_file
from verl.data.preprocess.spec import DatasetSpec
from verl.utils.paths import missing_path_hint, path_exists

SPLITS = ("train", "test")

SplitFiles = dict[str, list[Path]]
"""split name -> its files, in shard order"""

_NAME_TOKENS = re.compile(r"[^a-z0-9]+")


def find_split_files(path: str | Path, spec: DatasetSpec, split: str | None = None) -> SplitFiles:
    """The input files of each split found at ``path`` (a file, or a directory in one of the hub layouts).

    A single file holds one split: ``split`` when given, else the one its name says (``train.parquet``,
    ``gsm8k_test.jsonl``). A directory yields every split it holds; none at all is an error naming the
    expected layout.
    """
    source = Path(path).expanduser()
    label = f"--local_dataset_path {source}"
    if not path_exists(source, label, DatasetError):
        hint = missing_path_hint(source, SUPPORTED_EXTENSIONS)
        raise DataFileNotFoundError(f"{label} does not exist{hint}; expected {spec.layout()}")
    if source.is_dir():
        if split is not None:
            raise DatasetError(f"--split {split} is for a single file; {source} is a directory")
        return _files_in_directory(source, spec)
    check_data_file(source, "--local_dataset_path")
    return {split or split_from_name(source): [source]}


def split_from_name(path: Path) -> str:
    """The split a file's name says it holds: the one of ``train`` / ``test`` among the words of its name."""
    words = set(_NAME_TOKENS.split(path.name.lower()))
    named = [split for split in SPLITS if split in words]
    if len(named) != 1:
        raise DatasetError(
            f"--local_dataset_path {path}: cannot tell from the file name whether it holds the train or the "
            "test split; give --split train or --split test (or name the file train.* / test.*)"
        )
    return named[0]


def _split_of(file: Path) -> str | None:
    """``train`` for ``train.parquet`` or ``train-00000-of-00002.parquet``: the name's first word."""
    first_word = _NAME_TOKENS.split(file.name.lower(), maxsplit=1)[0]
    return first_word if first_word in SPLITS else None


def _files_in_directory(directory: Path, spec: DatasetSpec) -> SplitFiles:
    """Split files in ``directory`` itself, else in its first hub config folder that holds any."""
    searched = [directory, *(directory / sub for sub in spec.hub_subdirs)]
    for folder in searched:
        found = _split_files_in(folder) if folder.is_dir() else {}
        if found:
            return found
    looked = ", ".join(str(folder) for folder in searched)
    raise DatasetError(
        f"--local_dataset_path {directory}: no train.* or test.* dataset files ({', '.join(SUPPORTED_EXTENSIONS)}) "
        f"in {looked}; expected {spec.layout()}"
    )


def _split_files_in(folder: Path) -> SplitFiles:
    """Dataset files of each split directly in ``folder``; one split written in two formats is refused."""
    found: SplitFiles = {}
    for file in sorted(folder.iterdir()):
        split = _split_of(file)
        if split and file.is_file() and file.suffix.lower() in SUPPORTED_EXTENSIONS:
            found.setdefault(split, []).append(file)
    for split, files in found.items():
        formats = sorted({file.suffix.lower() for file in files})
        if len(formats) > 1:
            raise DatasetError(
                f"--local_dataset_path {folder}: the {split} split is there as {' and '.join(formats)} files "
                f"({', '.join(file.name for file in files)}); keep one format, or give one file"
            )
    return {split: found[split] for split in SPLITS if split in found}
