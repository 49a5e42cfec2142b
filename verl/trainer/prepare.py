"""Build what a recipe needs but the machine does not have yet: task data, a tiny model, its SFT warm start.

This is what makes ``verl run`` work on a fresh machine with no downloads. Each artifact lives in a
cache directory named after everything that determines it (:class:`Artifact`: the task settings, the
model settings and seed, the whole SFT config but its paths, the builders' format version), under
``prepare.cache_dir`` (``$VERL_HOME``, default ``~/.cache/verl``). A changed setting builds a new
artifact; the same settings reuse the cached one. Building holds a file lock on the artifact and
writes under a unique temporary name that is renamed into place, so runs started together build
each artifact once and never see half of one.

Only paths the config leaves unset are filled: ``data.train_files`` / ``val_files`` (when unset,
``prepare.task`` writes them) and ``actor_rollout_ref.model.path`` (when unset, ``prepare.tiny_model``
builds a model and ``prepare.sft`` warm-starts it). A path the user gave is used as it is and never
written to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock
from omegaconf import OmegaConf

from verl.config import (
    ConfigError,
    SFTConfig,
    TrainerConfig,
    as_file_list,
    load_config,
    sft_overrides,
    with_updates,
)

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class PreparePlan:
    """The artifacts a config needs (in build order) and the config keys they fill."""

    data: Artifact | None
    init_model: Artifact | None
    sft_model: Artifact | None

    def artifacts(self) -> list[Artifact]:
        return [a for a in (self.data, self.init_model, self.sft_model) if a is not None]

    def updates(self) -> dict[str, Any]:
        """The config keys the artifacts fill: the data files and the model path."""
        updates: dict[str, Any] = {}
        if self.data is not None:
            updates["data.train_files"] = str(self.data.path / "train.parquet")
            updates["data.val_files"] = str(self.data.path / "test.parquet")
        model = self.sft_model or self.init_model
        if model is not None:
            updates["actor_rollout_ref.model.path"] = str(model.path)
        return updates


def plan_inputs(config: TrainerConfig) -> PreparePlan:
    """Which artifacts ``config`` needs, without building anything (``verl run --print-config`` shows them)."""
    prep = config.prepare
    if not prep.enable:
        return PreparePlan(None, None, None)
    cache_dir = Path(prep.cache_dir).expanduser()
    data = None
    if config.data.train_files is None and prep.task:
        _check_task(prep.task)
        data = Artifact(f"{prep.task}-data", {"task": prep.task, **_plain(prep.task_kwargs)}, cache_dir)
    init_model = sft_model = None
    if not str(config.actor_rollout_ref.model.path).strip() and prep.tiny_model:
        settings = {"tiny_model": _plain(prep.tiny_model), "seed": _warm_start_seed(config)}
        init_model = Artifact("tiny-model", settings, cache_dir)
        if prep.sft:
            data_key = data.key if data is not None else _files_digest(config.data.train_files)
            sft_config = _sft_config(config, Path("<init>"), ["<data>"], Path("<out>"))
            settings = OmegaConf.to_container(sft_config, resolve=True)
            # Everything of the SFT config but its paths, which the keys of the inputs stand for.
            settings["model"].pop("path")
            settings["data"].pop("train_files")
            settings["trainer"].pop("default_local_dir")
            settings["trainer"].pop("logger")
            sft_model = Artifact(
                "tiny-model-sft", {"init": init_model.key, "data": data_key, "sft": settings}, cache_dir
            )
    return PreparePlan(data, init_model, sft_model)


def resolve_inputs(config: TrainerConfig) -> TrainerConfig:
    """``config`` with the paths its artifacts will have, built or not (for printing)."""
    return with_updates(config, plan_inputs(config).updates())


def prepare_inputs(config: TrainerConfig, log: Callable[[str], None] = print) -> TrainerConfig:
    """Build the artifacts ``config`` needs that are not cached yet; returns the config with their paths."""
    plan = plan_inputs(config)
    resolved = with_updates(config, plan.updates())
    if plan.data is not None:
        plan.data.build(lambda out: _write_task(config.prepare, out), log)
    if plan.init_model is not None:
        plan.init_model.build(lambda out: _write_tiny_model(config, out), log)
    if plan.sft_model is not None:
        train_files = as_file_list(resolved.data.train_files)
        plan.sft_model.build(lambda out: _warm_start(config, plan.init_model.path, train_files, out), log)
    _check_set(resolved)
    return resolved


def _check_task(task: str) -> None:
    from verl.data.tasks import TASKS

    if task not in TASKS:
        raise ConfigError(f"prepare.task={task!r}: unknown task; known tasks: {', '.join(sorted(TASKS))}")


def _write_task(prep: Any, out: Path) -> None:
    from verl.data.tasks import TASKS

    TASKS[prep.task](out, **_plain(prep.task_kwargs))


def _warm_start_seed(config: TrainerConfig) -> int:
    """Seed of the tiny model and its warm start: ``prepare.seed``, else the run's ``trainer.seed``."""
    return config.prepare.seed if config.prepare.seed is not None else config.trainer.seed


def _write_tiny_model(config: TrainerConfig, out: Path) -> None:
    from verl.models import make_tiny_model

    make_tiny_model(out, seed=_warm_start_seed(config), **_plain(config.prepare.tiny_model))


def _warm_start(config: TrainerConfig, init_path: Path, train_files: list[str], out: Path) -> None:
    """``verl sft`` of the initial model on the task's training file, written to ``out``."""
    from verl.trainer.sft_trainer import run_sft

    run_sft(_sft_config(config, init_path, train_files, out))


def _sft_config(config: TrainerConfig, init_path: Path, train_files: list[str], out: Path) -> Any:
    """The warm start's SFT config: the sft recipe, the seed and thread count of this run (or
    ``prepare.seed``), then ``prepare.sft`` (which may set its own, e.g. ``torch_threads``)."""
    overrides = [
        f"model.path={init_path}",
        f"data.train_files={train_files}",
        f"trainer.default_local_dir={out}",
        f"trainer.seed={_warm_start_seed(config)}",
    ]
    if config.trainer.torch_threads:
        overrides.append(f"trainer.torch_threads={config.trainer.torch_threads}")
    return load_config(None, overrides + sft_overrides(_plain(config.prepare.sft)), schema=SFTConfig)


def _check_set(config: TrainerConfig) -> None:
    """The data and the model must be given or built (a given path is used as it is, never written to)."""
    if config.data.train_files is None:
        raise ConfigError(
            "data.train_files is not set: give a parquet / jsonl path, or set prepare.task (with "
            "prepare.enable=true) to build a built-in task's files"
        )
    model_path = str(config.actor_rollout_ref.model.path).strip()
    if not model_path:
        raise ConfigError(
            "actor_rollout_ref.model.path is not set: give a model directory, or set prepare.tiny_model "
            "(with prepare.enable=true) to build one"
        )


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _files_digest(files: Any) -> str:
    """Content hash of the user's data files: an SFT warm start on other data is another artifact."""
    digest = hashlib.sha256()
    for path in as_file_list(files):
        digest.update(Path(path).expanduser().read_bytes())
    return digest.hexdigest()[:16]
