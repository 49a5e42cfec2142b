"""Writing to a path the user named (``verl report -o``, ``verl export OUT_DIR``) that may not be writable:
a read-only or immutable directory, ``/sys`` or ``/proc``, a path through a file.

Such a failure is the user's to fix, so it is one line naming the path and the OS's reason, not a traceback;
and it leaves nothing behind: the directories the write created on the way are removed again, so a failed
command never makes up a path the user then has to clean.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from verl.errors import StorageError, UserError

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})
"""the file system failing (full, broken) rather than refusing the path: the same path works once space is
freed, so these are a :class:`StorageError` (exit 5); any other refusal is an error of the path given"""


def blocking_file(path: Path) -> Path | None:
    """The first of ``path``'s ancestors that exists and is not a directory (``a/file.txt/out``), if any."""
    for parent in reversed(path.parents):
        try:
            if parent.exists() and not parent.is_dir():
                return parent
        except OSError:  # cannot even look (a directory that is not searchable): the write says why
            return None
    return None


def missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its ancestors that do not exist yet, deepest first: what a write of ``path``
    with ``mkdir(parents=True)`` creates, and so what a failed one must remove again."""
    missing = []
    for candidate in (path, *path.parents):
        try:
            if candidate.exists() or candidate.is_symlink():
                break
        except OSError:
            break
        missing.append(candidate)
    return missing


def remove_created(dirs: list[Path]) -> None:
    """Remove the directories of :func:`missing_dirs` that a failed write created, deepest first, each only
    when empty: whatever another process put there meanwhile stays."""
    for directory in dirs:
        try:
            directory.rmdir()
        except OSError:
            pass


def reason(error: OSError) -> str:
    """The OS's reason for ``error`` in words ("Read-only file system"), without the temporary file's name
    that Python's message would show."""
    if error.errno is not None and error.strerror:
        return error.strerror
    return os.strerror(error.errno) if error.errno else str(error) or type(error).__name__


def os_error_of(error: BaseException) -> OSError | None:
    """The OSError behind ``error``: itself, one in its chain, or one a library reported as text (safetensors'
    Rust writer: "No space left on device (os error 28)"); None when the OS did not cause it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"\(os error (\d+)\)|\[Errno (\d+)\]", str(error))
    if found is None:
        return None
    code = int(found.group(1) or found.group(2))
    return OSError(code, os.strerror(code))


def concerns(error: OSError, path: Path) -> bool:
    """Whether ``error`` was about writing ``path``: its file is ``path``, one of its ancestors (a
    directory being created), or in the directory that holds it (a temporary file, a staging directory)."""
    path = Path(os.path.abspath(path))
    for name in (error.filename, error.filename2):
        if name is None:
            continue
        target = Path(os.path.abspath(os.fsdecode(name)))
        if target == path or target in path.parents or path.parent in target.parents:
            return True
    return False


def unwritable(
    path: Path, error: OSError, error_type: type[UserError], hint: str = "give a writable path"
) -> UserError:
    """The one-line error for ``path`` that could not be written: ``cannot write PATH: REASON; HINT``, as a
    :class:`StorageError` when the file system failed (:data:`STORAGE_ERRNOS`), else as ``error_type`` (the
    command's error for a bad path it was given)."""
    blocker = blocking_file(path)
    why = f"{blocker} is a file, not a directory" if blocker is not None else reason(error)
    if blocker is None and error.errno == errno.ENOENT and path.parent.is_dir():
        why = f"{path.parent} takes no new files ({why})"  # /proc: the directory is there, creating fails
    if error.errno in STORAGE_ERRNOS:
        return StorageError(f"cannot write {path}: {why}; free space there, or {hint}")
    return error_type(f"cannot write {path}: {why}; {hint}")
