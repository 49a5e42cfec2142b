"""Checksums of a checkpoint's files, written with it and verified before it is loaded.

When a checkpoint is finished (every rank's part written, before it is renamed into place), its
``checkpoint.json`` records the size and SHA-256 of every file under it. A resume or an export reads each
file again and compares: a file truncated, altered or removed after the save is named, and the checkpoint is
not loaded. Checkpoints written before manifests existed have none and are loaded unverified.

Reading a checkpoint back costs one sequential read of its files (SHA-256 runs at about 1-2 GB/s a core).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST_KEY = "files"
"""the key of ``checkpoint.json`` that holds ``{relative path: {"bytes": n, "sha256": hex}}``"""


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest_of(checkpoint: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, int | str]]:
    """The size and SHA-256 of every file under ``checkpoint`` (paths relative to it, sorted), except those
    named in ``skip`` at its top level."""
    files = {}
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        name = path.relative_to(checkpoint).as_posix()
        if name in skip:
            continue
        files[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return files


_verified: dict[tuple, None] = {}
"""checkpoints found whole, keyed by their files' (name, size, mtime) as then: a run plans its resume and
then loads it, and a second read of every file would say the same unless one changed"""


def damage(checkpoint: Path, manifest: dict[str, dict[str, int | str]]) -> str | None:
    """What is wrong with ``checkpoint``'s files against ``manifest``, naming the first damaged file; None
    when every file is as saved. Sizes are compared first (cheap), then contents."""
    try:
        stats = tuple((name, (checkpoint / name).stat()) for name in manifest)
        key = (str(checkpoint.resolve()), *((n, s.st_size, s.st_mtime_ns) for n, s in stats))
    except OSError:
        key = None  # a file is missing: found below
    if key in _verified:
        return None
    for name, expected in manifest.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{path} is missing (the checkpoint was saved with it)"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{path} has {size} bytes, {expected['bytes']} when saved (truncated or rewritten)"
    for name, expected in manifest.items():
        path = checkpoint / name
        if file_sha256(path) != expected["sha256"]:
            return f"{path} was altered after the save (its SHA-256 differs from the checkpoint's manifest)"
    if key is not None:
        _verified[key] = None
    return None
