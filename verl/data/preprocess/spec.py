"""What a dataset preprocessor is: the hub dataset it reads, the columns it needs and how it turns one row
into a row of verl's schema. Kept apart from the pipeline so each dataset module only declares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.data.io import DatasetError

Row = dict[str, Any]

RowMaker = Callable[[Row, str, int, str], Row]
"""``make_row(raw, split, index, where) -> row``; ``where`` ("file row N") goes into every error."""


@dataclass(frozen=True)
class DatasetSpec:
    """One hub dataset the ``verl.data.preprocess`` command knows.

    ``data_source`` is the hub id verl writes into every row (the reward manager picks the scorer by it);
    ``columns`` are the raw columns ``make_row`` consumes (checked on every row, and not passed through);
    ``hub_subdirs`` are the folders of the hub snapshot that hold the split files (``main/`` for GSM8K).
    """

    name: str
    data_source: str
    columns: tuple[str, ...]
    make_row: RowMaker
    default_save_dir: str
    hub_subdirs: tuple[str, ...] = ()

    def layout(self) -> str:
        """The accepted input layouts, for error messages."""
        subdirs = "".join(f" or {sub}/train-*.parquet + {sub}/test-*.parquet" for sub in self.hub_subdirs)
        return (
            f"a local copy of the {self.data_source} hub dataset: one .parquet / .jsonl file, or a directory "
            f"holding train.* and test.* files{subdirs}, whose rows have the columns {', '.join(self.columns)}"
        )


def text_column(raw: Row, column: str, where: str, columns: tuple[str, ...]) -> str:
    """``raw[column]`` as a string; a missing, empty or non-string value is an error naming ``where``."""
    if column not in raw or raw[column] is None:
        already = "prompt" in raw and "reward_model" in raw
        hint = "; it looks like a file already in verl's format (give the raw hub dataset)" if already else ""
        raise DatasetError(
            f"{where}: missing column {column!r} (rows need the columns {', '.join(columns)}); "
            f"the row has {sorted(raw)}{hint}"
        )
    value = raw[column]
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: column {column!r} must be non-empty text, got {value!r:.80}")
    return value


def passthrough(raw: Row, consumed: tuple[str, ...]) -> Row:
    """The raw columns a preprocessor does not consume, kept as they are (``level`` and ``type`` of MATH).

    verl's scripts build rows with ``datasets.map``, which keeps every column the map function did not pop:
    so its MATH files carry ``level`` and ``type`` next to the verl columns, and these do too.
    """
    return {key: value for key, value in raw.items() if key not in consumed}
