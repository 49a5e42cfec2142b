"""A fingerprint of a model directory's files: how a LoRA checkpoint, which holds the adapters and not the
frozen base weights, tells whether ``model.path`` at resume or export still holds the base it was trained on.

What it checks, cheaply and without loading the model: the bytes of ``config.json``, and for each weight
file at the top of the directory (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``) its name, its size, a
safetensors file's whole header (every tensor's name, dtype, shape and offset), and a SHA-256 of
:data:`BLOCKS` blocks of 64 KiB spread evenly over the file, first and last included (about 1 MiB read
per file, whatever its size). Another fine-tune, dtype or revision of the same architecture differs in
almost every block, so it is caught; an edit confined to bytes no block reads is not. The directory's path
is recorded but not compared: a moved or re-downloaded copy of the same files passes. A hub id whose files
are not in the local Hugging Face cache gets no fingerprint, and nothing is checked for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from verl.errors import InputError

logger = logging.getLogger(__name__)

FILE_NAME = "base_model.json"
"""the fingerprint's file in a LoRA checkpoint part, beside ``adapter_config.json``"""

BLOCKS, BLOCK_BYTES = 16, 64 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
CHECKS = (
    "config.json, and each weight file's name, size, safetensors header and 16 sampled 64 KiB blocks "
    "(verl.models.base_fingerprint)"
)


def _local_dir(path: str | Path) -> Path | None:
    """``path`` as a local model directory: itself, or a hub id's snapshot in the local cache (or None)."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(path), local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, not a hub id, no huggingface_hub: nothing to fingerprint
        return None


def _file_digest(path: Path) -> str:
    """SHA-256 over a weight file's size, its safetensors header, and :data:`BLOCKS` evenly spread blocks."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        if path.suffix == ".safetensors" and size >= 8:
            header_len = int.from_bytes(f.read(8), "little")
            digest.update(f.read(min(header_len, size - 8)))
        last = max(size - BLOCK_BYTES, 0)
        for i in range(BLOCKS):
            f.seek(last * i // (BLOCKS - 1))
            digest.update(f.read(BLOCK_BYTES))
    return digest.hexdigest()


def base_fingerprint(path: str | Path) -> dict[str, Any] | None:
    """The fingerprint of the model at ``path`` (a directory or a cached hub id), or None when its files are
    not on this machine. ``files`` maps ``config.json`` and each weight file to its digest; ``digest`` is
    one over all of them."""
    local = _local_dir(path)
    if local is None or not (local / "config.json").is_file():
        return None
    files = {"config.json": hashlib.sha256((local / "config.json").read_bytes()).hexdigest()}
    for item in sorted(local.iterdir()):
        if item.is_file() and item.suffix in WEIGHT_SUFFIXES:
            files[item.name] = _file_digest(item)
    whole = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"path": str(path), "digest": whole, "files": files, "checks": CHECKS}


def write_fingerprint(part: str | Path, fingerprint: dict[str, Any]) -> None:
    """Record ``fingerprint`` in checkpoint part ``part`` (:data:`FILE_NAME`)."""
    target = Path(part)
    target.mkdir(parents=True, exist_ok=True)
    (target / FILE_NAME).write_text(json.dumps(fingerprint, indent=2) + "\n", encoding="utf-8")


def check_same_base(part: str | Path, current: dict[str, Any] | None, key: str, path: str | Path) -> None:
    """Refuse the base model at ``path`` (named by ``key``; ``current`` its fingerprint) for checkpoint part
    ``part`` when the part records a fingerprint of other files. A part without one (a checkpoint from
    before fingerprints, or of a run without LoRA) or a base without one (not on this machine) is not
    checked; the latter is logged."""
    saved_file = Path(part) / FILE_NAME
    if not saved_file.is_file():
        return
    saved = json.loads(saved_file.read_text(encoding="utf-8"))
    if current is None:
        logger.warning(
            "%s=%s: its files are not on this machine, so the base weights are not checked", key, path
        )
        return
    if saved.get("digest") == current["digest"]:
        return
    old, new = saved.get("files", {}), current["files"]
    differ = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
    raise InputError(
        f"{key}={path} is not the base model checkpoint {part} was trained on ({saved.get('path')}): "
        f"{', '.join(differ)} differ (checked: {CHECKS.split(' (')[0]}); use that base model, or delete "
        f"{saved_file} to skip this check"
    )
