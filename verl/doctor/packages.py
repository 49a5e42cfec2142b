"""The packages a run needs, and the problems with them that would fail it: ``verl doctor``'s environment
failures, and the same check at the start of every run (:func:`check_packages`)."""

from __future__ import annotations

from typing import Any

from verl.doctor.environment import (
    ABSENT,
    CLASH,
    MISSING,
    TOO_OLD,
    InstalledMetadata,
    Metadata,
    PackageRow,
    find_clashes,
    package_rows,
)
from verl.doctor.matrix import BREAKS_TRANSFORMERS
from verl.errors import PackageError


def needed_packages(config: Any, gguf: bool) -> dict[str, str]:
    """The optional packages (support-matrix names) this config needs, with the setting that needs each."""
    from verl.models.lora import lora_enabled

    needs = {}
    if config.trainer.backend == "ray":
        needs["ray"] = "trainer.backend=ray"
    if lora_enabled(config.actor_rollout_ref.model):
        needs["peft"] = "LoRA (actor_rollout_ref.model.lora_rank / lora_adapter_path)"
    name = config.actor_rollout_ref.rollout.name
    if name in ("vllm", "sglang"):
        needs[name] = f"actor_rollout_ref.rollout.name={name}"
    if gguf:
        needs["gguf"] = needs["accelerate"] = "a .gguf model path"
    return needs


def environment_failures(rows: list[PackageRow], needs: dict[str, str]) -> list[str]:
    """One line per package problem that makes this config fail."""
    out = []
    for row in rows:
        needed_by = needs.get(row.key)
        needed = row.feature is None or needed_by is not None
        if row.key in BREAKS_TRANSFORMERS and row.status == CLASH:
            out.append(f"environment: {row.clashes[0].describe()}")
        elif needed and row.status == ABSENT:
            out.append(
                f"environment: {needed_by} needs {row.name}, which is not installed: pip install {row.name}"
            )
        elif needed and row.status in (MISSING, TOO_OLD, CLASH):
            detail = "; ".join(c.describe() for c in row.clashes) if row.clashes else row.advice
            why = f" ({needed_by})" if needed_by else ""
            out.append(
                f"environment: {row.name} {row.installed or ''} is {row.status}{why}: {detail}".replace(
                    "  ", " "
                )
            )
    return out


def check_packages(config: Any, gguf: bool, meta: Metadata | None = None) -> None:
    """Refuse a run that its installed packages would fail (``verl doctor``'s environment failures): a
    package it needs missing, older than verl requires, or built against another version of one it needs.
    Reads package metadata only (~0.1 s); raises :class:`verl.errors.PackageError` with one line per
    problem."""
    meta = meta or InstalledMetadata()
    failures = environment_failures(
        package_rows(meta, clashes=find_clashes(meta)), needed_packages(config, gguf)
    )
    if failures:
        lines = "; ".join(line.removeprefix("environment: ") for line in failures)
        raise PackageError(f"{lines} (`verl doctor` shows the whole environment)")
