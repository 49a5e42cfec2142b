"""Reading and writing dataset rows (parquet / JSON lines) with errors that point at the bad file and line.

Rows are plain dicts in verl's schema (``data_source``, ``prompt``, ``ability``, ``reward_model``,
``extra_info``). Every error names the file, because a run that dies with "KeyError: 'prompt'"
twenty minutes into loading a cluster job is the thing this module exists to prevent.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

PathLike = str | os.PathLike

SUPPORTED_EXTENSIONS = (".parquet", ".jsonl", ".json")


class DatasetError(ValueError):
    """A dataset file or row is missing, malformed, or does not fit the configured limits."""


def _check_extension(path: Path) -> str:
    ext = path.suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise DatasetError(
            f"{path}: unsupported dataset file extension {ext!r}; use one of {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    return ext


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a corrupt file
        raise DatasetError(f"{path}: cannot read parquet file ({type(exc).__name__}: {exc})") from exc
    return table.to_pylist()


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not valid UTF-8 text ({exc})") from exc
    # A ``.json`` file may also be one JSON array of row objects (what ``json.dump(rows)`` writes).
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: malformed JSON at line {exc.lineno}: {exc.msg}") from exc
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: element {i} is a {type(row).__name__}, expected a JSON object")
        return rows
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: malformed JSON on line {lineno}: {exc.msg}") from exc
        if not isinstance(row, dict):
            raise DatasetError(f"{path}: line {lineno} is a {type(row).__name__}, expected a JSON object")
        rows.append(row)
    return rows


def read_rows(path: PathLike) -> list[dict[str, Any]]:
    """Read every row of a ``.parquet``, ``.jsonl`` or ``.json`` file as a list of dicts."""
    p = Path(path).expanduser()
    ext = _check_extension(p)
    if not p.exists():
        raise FileNotFoundError(f"dataset file {p} does not exist")
    if not p.is_file():
        raise DatasetError(f"{p}: is not a regular file")
    if ext == ".parquet":
        return _read_parquet(p)
    return _read_json_lines(p)


def as_path_list(paths: PathLike | Iterable[PathLike]) -> list[str]:
    """Normalise one path or a list of paths (also an OmegaConf ListConfig) to expanded strings."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = [str(Path(p).expanduser()) for p in paths]
    if not out:
        raise DatasetError("no dataset files given")
    return out


def read_files(paths: PathLike | Iterable[PathLike]) -> list[tuple[str, int, dict[str, Any]]]:
    """Read several files and keep where each row came from, as ``(path, row_index, row)``.

    The provenance is what lets later validation errors say "train.parquet row 1234".
    """
    out: list[tuple[str, int, dict[str, Any]]] = []
    for path in as_path_list(paths):
        out.extend((path, i, row) for i, row in enumerate(read_rows(path)))
    return out


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
