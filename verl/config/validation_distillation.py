"""The value rules of the ``distillation`` section, checked when ``distillation.enabled=true``: the loss options
as verl checks them (`verl.algorithms.distillation.DistillationLossOptions`) and the teachers as verl resolves
them (`verl.workers.teacher.resolve_teacher_models`), so a bad setting stops the run before any model loads.
Called by :func:`verl.config.validation.validate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.config.errors import ConfigError, short_repr
from verl.config.value_rules import check_in_range

SECTION = "distillation"
TEACHER_ENTRY_KEYS = ("key", "model_path")
"""what a teacher entry holds here (verl's num_replicas and inference.* are reported at load and dropped)"""


def distillation_enabled(cfg: Any) -> bool:
    """Whether the run distils (a config without the section, e.g. a saved one from before it, does not)."""
    section = OmegaConf.select(cfg, SECTION) if OmegaConf.is_config(cfg) else getattr(cfg, SECTION, None)
    return bool(section is not None and section.enabled)


def distillation_errors(errors: list[str], cfg: DictConfig) -> None:
    """Append the section's problems to ``errors``; nothing is checked while distillation is off (verl reads the
    section only then)."""
    if not distillation_enabled(cfg):
        return
    section = cfg.distillation
    _loss_errors(errors, section.distillation_loss)
    _teacher_errors(errors, section)


def _loss_errors(errors: list[str], loss: Any) -> None:
    from verl.algorithms.distillation import DistillationLossOptions

    prefix = f"{SECTION}.distillation_loss"
    try:
        DistillationLossOptions.of(loss)
    except (ConfigError, ValueError, NotImplementedError) as error:
        errors.append(str(error))
    check_in_range(errors, f"{prefix}.distillation_loss_coef", loss.distillation_loss_coef, 0)
    check_in_range(errors, f"{prefix}.loss_max_clamp", loss.loss_max_clamp, 0, low_open=True, null="no clamp")
    for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        check_in_range(errors, f"{prefix}.{key}", loss[key], 0, low_open=True)


def _teacher_errors(errors: list[str], section: Any) -> None:
    from verl.workers.teacher import resolve_teacher_models

    if not str(section.teacher_key or "").strip():
        errors.append(f"{SECTION}.teacher_key must name a sample field (e.g. data_source); got ''")
    teachers = section.teacher_models
    for name, entry in teachers.items():
        where = f"{SECTION}.teacher_models.{name}"
        if entry is not None and not isinstance(entry, Mapping):
            errors.append(f"{where} expects a mapping with model_path (and key); got {short_repr(entry)}")
            return
        for key in entry or {}:
            if key not in TEACHER_ENTRY_KEYS:
                errors.append(
                    f"unknown config key '{where}.{key}'; a teacher entry takes {', '.join(TEACHER_ENTRY_KEYS)} "
                    "(and verl's num_replicas and inference.*, which have no effect here)"
                )
                return
    try:
        resolve_teacher_models(teachers)
    except ValueError as error:
        errors.append(_with_hint(str(error)))


def _with_hint(message: str) -> str:
    if message.endswith("must be set for a distillation teacher"):
        return message + " (the teacher's model directory or hub id; it must share the student's tokenizer)"
    return message
