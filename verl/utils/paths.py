"""Telling a user what is wrong with a path they gave: the nearest existing path to one that does not
exist (a typo fixed in any component), or what its directory holds; and whether a path exists at all, with
one the OS refuses to look at reported as such instead of passing for missing.

Used by every loader that reads a path from the config (datasets, models, GGUF files, reward functions),
so it imports nothing from verl: a path hint never loads datasets, models or reward scorers.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path

PathLike = str | os.PathLike

__all__ = ["closest_name", "missing_path_hint", "path_exists"]


def _exists(path: Path) -> bool:
    """``path.exists()``, False for a path the OS refuses to look at (a name too long, a loop of links)."""
    try:
        return path.exists()
    except OSError:
        return False


def _list_dir(directory: Path) -> list[str]:
    try:
        return sorted(name for name in os.listdir(directory) if not name.startswith("."))
    except OSError:
        return []


def _similarity(name: str, candidate: str) -> float:
    """How alike two file names are; with the same extension only the stems count (every ``*.parquet``
    would otherwise look like ``nope.parquet``)."""
    a, b = Path(name), Path(candidate)
    if a.suffix and a.suffix.lower() == b.suffix.lower():
        name, candidate = a.stem, b.stem
    return difflib.SequenceMatcher(None, name.lower(), candidate.lower()).ratio()


def closest_name(name: str, directory: Path, cutoff: float = 0.6) -> str | None:
    """The entry of ``directory`` most like ``name`` (a typo's likely target), or None."""
    scored = [(_similarity(name, candidate), candidate) for candidate in _list_dir(directory)]
    scored = [sc for sc in scored if sc[0] >= cutoff]
    return max(scored)[1] if scored else None


def missing_path_hint(path: PathLike, kinds: Sequence[str] = (), dirs: bool = False) -> str:
    """What to say after "X does not exist": the nearest existing path (a typo fixed in any component), or
    which directory on the way is missing, or what the directory holds (entries ending in ``kinds``; only
    directories with ``dirs``).

    Only lists directories; never creates anything.
    """
    path = Path(os.path.abspath(Path(path).expanduser()))
    guess: Path | None = Path(path.anchor)
    first_missing: Path | None = None
    for part in path.parts[1:]:
        if _exists(guess / part):
            guess = guess / part
            continue
        first_missing = first_missing or guess / part
        if guess.is_file():
            return f"; {guess} is a file, not a directory"
        match = closest_name(part, guess) if guess.is_dir() else None
        if match is None:
            guess = None
            break
        guess = guess / match
    if guess is not None and guess != path and _exists(guess):
        return f"; did you mean {guess}?"
    if first_missing is not None and first_missing != path:
        return f"; the directory {first_missing} does not exist"
    entries = [
        e
        for e in _list_dir(path.parent)
        if (not kinds or e.lower().endswith(tuple(kinds))) and (not dirs or (path.parent / e).is_dir())
    ]
    if not entries:
        return f"; {path.parent} holds no {' / '.join(kinds) or ('directories' if dirs else 'entries')}"
    return f"; {path.parent} holds {', '.join(entries[:6])}{', ...' if len(entries) > 6 else ''}"


def path_exists(path: Path, label: str, error: type[Exception]) -> bool:
    """Whether ``path`` exists; one that cannot even be looked at (a name too long, a loop of symlinks, no
    permission) raises ``error`` naming ``label``, instead of passing for missing."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise error(f"{label}: cannot use this path ({exc.strerror or exc})") from exc
    return True
