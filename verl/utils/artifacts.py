"""Cached build artifacts: a directory built once from the settings that determine it, shared by every run
that needs the same thing.

An :class:`Artifact` lives in a directory named after its kind and a hash of its settings (and of
:data:`ARTIFACT_FORMAT`), under a cache directory (``prepare.cache_dir``: ``$VERL_HOME``, default
``~/.cache/verl``). A changed setting is another artifact; the same settings reuse the cached one. Building
holds a file lock on the artifact and writes under a unique temporary name that is renamed into place, so
runs started together build each artifact once and never see half of one. :mod:`verl.trainer.prepare`
builds a run's task data, tiny model and warm start this way, :mod:`verl.models.gguf` a GGUF file's
converted model.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

ARTIFACT_FORMAT = 2
"""Bump when a builder (task writer, tiny-model factory, SFT) makes something else from the same settings:
every cached artifact is then rebuilt."""

MANIFEST = "artifact.json"


@dataclass(frozen=True)
class Artifact:
    """One cached thing (task data, initial model, warm-started model) and the settings that determine it."""

    kind: str
    settings: dict[str, Any]
    cache_dir: Path

    @property
    def key(self) -> str:
        text = json.dumps({"format": ARTIFACT_FORMAT, "kind": self.kind, **self.settings}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        return self.cache_dir / "artifacts" / f"{self.kind}-{self.key}"

    def ready(self) -> bool:
        return (self.path / MANIFEST).is_file()

    def build(self, write: Callable[[Path], None], log: Callable[[str], None] = print) -> Path:
        """The artifact's directory, built by ``write(tmp_dir)`` unless it is cached. Concurrent callers
        wait on the artifact's lock; the first builds it and the others find it ready."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            if self.ready():
                return self.path
            log(f"[prepare] building {self.kind} {self.path}")
            tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
            try:
                write(tmp)
                manifest = {"format": ARTIFACT_FORMAT, "kind": self.kind, "key": self.key, **self.settings}
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
                shutil.rmtree(self.path, ignore_errors=True)  # a directory without a manifest is not ours
                tmp.rename(self.path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return self.path

    def describe(self) -> str:
        return f"{self.kind}: {self.path} ({'cached' if self.ready() else 'to build'})"
