"""Reading and writing dataset rows (parquet / JSON lines) with errors that point at the bad file and line.

Rows are plain dicts in verl's schema (``data_source``, ``prompt``, ``ability``, ``reward_model``,
``extra_info``). Every error names the file, because a run that dies with "KeyError: 'prompt'"
twenty minutes into loading a cluster job is the thing this module exists to prevent.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from verl.errors import InputError
from verl.utils.paths import _list_dir, missing_path_hint, path_exists

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike

SUPPORTED_EXTENSIONS = (".parquet", ".jsonl", ".json")

BAD_ROW_POLICIES = ("fail", "skip")

MISSING = object()
"""What :func:`get_dotted` returns for an absent field (``None`` can be a real value)."""


class DatasetError(InputError):
    """A dataset file or row is missing, malformed, or does not fit the configured limits."""


class DataFileNotFoundError(DatasetError, FileNotFoundError):
    """A dataset file the config names does not exist (also a FileNotFoundError, as it always was)."""


class BadRows:
    """``data.bad_rows``: what happens to a malformed row, ``fail`` (raise its error) or ``skip``.

    Skipping exists for large scraped datasets where a handful of broken rows should not cost a run.
    Each skipped row is logged once, with its file and row, and counted, so a dataset that silently
    shrinks still shows up (the trainer reports :attr:`count` as ``data/skipped_rows``).
    """

    def __init__(self, policy: str = "fail") -> None:
        if policy not in BAD_ROW_POLICIES:
            raise ValueError(f"data.bad_rows={policy!r} is not one of {BAD_ROW_POLICIES}")
        self.policy = policy
        self.skipped: list[str] = []
        """one message per skipped row (file, row, reason)"""

    @property
    def count(self) -> int:
        return len(self.skipped)

    def handle(self, error: DatasetError) -> None:
        """Raise ``error`` (fail), or log and count it (skip)."""
        if self.policy == "fail":
            raise error
        self.skipped.append(str(error))
        logger.warning("skipping a bad row (data.bad_rows=skip): %s", error)


def get_dotted(row: dict[str, Any], dotted: str) -> Any:
    """``get_dotted(row, "reward_model.ground_truth")`` -> ``row["reward_model"]["ground_truth"]``, or MISSING."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def check_required(row: dict[str, Any], fields: Iterable[str], where: str) -> None:
    """Raise a DatasetError naming ``where`` and the field when a (dotted) required field is absent or None.

    A parent that is not a dict is named with its type (``'reward_model' must be a dict ..., got str``),
    the usual cause of a nested field gone missing.
    """
    for dotted in fields:
        parts = dotted.split(".")
        value: Any = row
        for depth, part in enumerate(parts):
            if not isinstance(value, dict):
                parent = ".".join(parts[:depth])
                raise DatasetError(
                    f"{where}: field {parent!r} must be a dict holding {dotted!r}, got {type(value).__name__}"
                )
            value = value.get(part)
            if value is None:
                raise DatasetError(f"{where}: missing field {dotted!r}; row has {sorted(row)}")


IndexedRows = list[tuple[int, dict[str, Any]]]


def _label(path: Path, key: str | None) -> str:
    """``path`` plus the config key that named it, so the message says which setting to fix."""
    return f"{path} ({key})" if key else str(path)


def _check_extension(path: Path, key: str | None = None) -> str:
    ext = path.suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise DatasetError(
            f"{_label(path, key)}: unsupported dataset file extension {ext!r}; "
            f"use one of {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    return ext


def check_data_file(path: PathLike, key: str | None = None) -> str:
    """Check that ``path`` is an existing regular file with a dataset extension (without reading it);
    returns the extension. The errors name the path and ``key``, and suggest the nearest existing file."""
    p = Path(path).expanduser()
    label = _label(p, key)
    if not path_exists(p, label, DatasetError):
        hint = missing_path_hint(p, SUPPORTED_EXTENSIONS)
        parts = [Path(x.strip()).expanduser() for x in str(path).split(",")]
        if len(parts) > 1 and all(x.is_file() for x in parts):
            hint = f"; to give several files, write a list: {key or 'the key'}=[{','.join(map(str, parts))}]"
        raise DataFileNotFoundError(f"dataset file {label} does not exist{hint}")
    if p.is_dir():
        files = [e for e in _list_dir(p) if e.lower().endswith(SUPPORTED_EXTENSIONS)]
        if not files:
            raise DatasetError(
                f"{label}: is a directory, not a dataset file, and holds no {' / '.join(SUPPORTED_EXTENSIONS)} files"
            )
        shown = ",".join(str(p / f) for f in files[:6]) + (",..." if len(files) > 6 else "")
        raise DatasetError(
            f"{label}: is a directory, not a dataset file; give the files in it, as a list for several: "
            f"{key or 'the key'}=[{shown}]"
        )
    if not p.is_file():
        raise DatasetError(f"{label}: is not a regular file")
    return _check_extension(p, key)


def check_data_files(paths: PathLike | Iterable[PathLike] | None, key: str | None = None) -> list[str]:
    """:func:`check_data_file` on each of ``paths`` (one path or a list; none at all is an error naming
    ``key``), before anything reads them or any expensive work starts; returns the expanded paths."""
    files = as_path_list(paths, key)
    for path in files:
        check_data_file(path, key)
    return files


def _read_parquet(path: Path, key: str | None) -> IndexedRows:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a corrupt file
        raise DatasetError(
            f"{_label(path, key)}: cannot read parquet file ({type(exc).__name__}: {exc})"
        ) from exc
    return list(enumerate(table.to_pylist()))


def _read_text(path: Path, key: str | None) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{_label(path, key)}: not valid UTF-8 text ({exc})") from exc
    except OSError as exc:  # permissions, a file vanishing mid-read, I/O errors
        raise DatasetError(f"{_label(path, key)}: cannot read ({exc.strerror or exc})") from exc


def _read_json_array(path: Path, text: str, key: str | None, bad_rows: BadRows) -> IndexedRows:
    """A ``.json`` file holding one array of row objects (what ``json.dump(rows)`` writes)."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        # One broken array loses every row: there is no row to skip, so this always fails.
        raise DatasetError(f"{_label(path, key)}: malformed JSON at line {exc.lineno}: {exc.msg}") from exc
    out: IndexedRows = []
    for i, row in enumerate(rows):
        if isinstance(row, dict):
            out.append((i, row))
        else:
            bad_rows.handle(
                DatasetError(f"{path}: element {i} is a {type(row).__name__}, expected a JSON object")
            )
    return out


def _read_json_lines(path: Path, key: str | None, bad_rows: BadRows) -> IndexedRows:
    """One JSON object per line. Row indices count non-blank lines, skipped ones included, so a row's
    index is the same whatever ``data.bad_rows`` says."""
    text = _read_text(path, key)
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        return _read_json_array(path, text, key, bad_rows)
    out: IndexedRows = []
    row_index = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        index, row_index = row_index, row_index + 1
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            bad_rows.handle(DatasetError(f"{path}: malformed JSON on line {lineno} (row {index}): {exc.msg}"))
            continue
        if not isinstance(row, dict):
            bad_rows.handle(
                DatasetError(
                    f"{path}: line {lineno} (row {index}) is a {type(row).__name__}, expected a JSON object"
                )
            )
            continue
        out.append((index, row))
    return out


def _read_indexed(path: PathLike, key: str | None = None, bad_rows: BadRows | None = None) -> IndexedRows:
    """``(row_index, row)`` for each usable row; file-level problems always raise, naming path and key."""
    p = Path(path).expanduser()
    ext = check_data_file(p, key)
    if ext == ".parquet":
        return _read_parquet(p, key)
    return _read_json_lines(p, key, bad_rows or BadRows("fail"))


def read_rows(path: PathLike) -> list[dict[str, Any]]:
    """Read every row of a ``.parquet``, ``.jsonl`` or ``.json`` file as a list of dicts."""
    return [row for _, row in _read_indexed(path)]


def as_path_list(paths: PathLike | Iterable[PathLike] | None, key: str | None = None) -> list[str]:
    """Normalise one path or a list of paths (also an OmegaConf ListConfig) to expanded strings."""
    if paths is None:
        paths = []
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = [str(Path(p).expanduser()) for p in paths]
    if not out:
        raise DatasetError("no dataset files given" + (f"; set {key}" if key else ""))
    return out


def read_files(
    paths: PathLike | Iterable[PathLike] | None,
    *,
    key: str | None = None,
    bad_rows: BadRows | None = None,
) -> list[tuple[str, int, dict[str, Any]]]:
    """Read several files and keep where each row came from, as ``(path, row_index, row)``.

    The provenance is what lets later validation errors say "train.parquet row 1234". ``key`` is the
    config key the paths came from (``data.train_files``), named in file-level errors; ``bad_rows``
    decides about unparsable JSON lines (default: fail). A missing or unreadable file always fails.
    """
    bad_rows = bad_rows or BadRows("fail")
    out: list[tuple[str, int, dict[str, Any]]] = []
    for path in check_data_files(paths, key):  # every file, before reading a large first one
        skipped = bad_rows.count
        rows = _read_indexed(path, key, bad_rows)
        if not rows and bad_rows.count == skipped:
            raise DatasetError(f"empty dataset file: no rows in {_label(Path(path), key)}")
        out.extend((path, i, row) for i, row in rows)
    return out


def check_columns(
    records: Sequence[tuple[str, int, dict[str, Any]]], fields: dict[str, str], key: str | None = None
) -> None:
    """A parquet file whose schema lacks a needed column fails as a whole, whatever ``data.bad_rows`` says
    (it is the wrong file or the wrong setting, not a few bad rows). ``fields`` maps each (dotted) field to
    the config key that names it; only its first component is a column."""
    first_rows: dict[str, dict[str, Any]] = {}
    for path, _, row in records:
        first_rows.setdefault(path, row)
    for path, row in first_rows.items():
        if Path(path).suffix.lower() != ".parquet":
            continue  # JSON rows can each have their own fields: checked row by row
        for field, setting in fields.items():
            column = field.split(".")[0]
            if column not in row:
                raise DatasetError(
                    f"{_label(Path(path), key)}: no column {column!r} ({setting}={field}); its columns are "
                    f"{list(row)}: set {setting} to the column that holds it"
                )


def write_rows(path: PathLike, rows: Sequence[dict[str, Any]]) -> Path:
    """Write rows to ``.parquet`` or ``.jsonl`` atomically (temp file in the same directory, then rename).

    Atomic so that a crash or a concurrent reader never sees a half-written dataset file.
    """
    p = Path(path).expanduser()
    ext = _check_extension(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        if ext == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return p
