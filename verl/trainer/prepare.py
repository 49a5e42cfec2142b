"""Build what a recipe needs but the machine does not have yet: task data, a tiny model, its SFT warm start.

This is what makes ``verl run`` work on a fresh machine with no downloads. Each artifact lives in a
cache directory named after everything that determines it (:class:`verl.utils.artifacts.Artifact`: the
task settings, the model settings and seed, the whole SFT config but its paths, the builders' format
version), under ``prepare.cache_dir`` (``$VERL_HOME``, default ``~/.cache/verl``). A changed setting builds
a new artifact; the same settings reuse the cached one. Building holds a file lock on the artifact and
writes under a unique temporary name that is renamed into place, so runs started together build
each artifact once and never see half of one.

Only paths the config leaves unset are filled: ``data.train_files`` / ``val_files`` (when unset,
``prepare.task`` writes them; a ``val_files`` the user gave is kept) and ``actor_rollout_ref.model.path``
(when unset, ``prepare.tiny_model`` builds a model and ``prepare.sft`` warm-starts it). A path the user
gave is used as it is and never written to: everything is written under ``prepare.cache_dir``. The paths
the user gave are checked first (:func:`check_inputs`), so a typo fails in a second, not after minutes of
building.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from verl.trainer.pinned_warm_start import install_pinned, pinned_record, pinned_warm_starts
from verl.utils.artifacts import Artifact

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparePlan:
    """The artifacts a config needs (in build order) and the config keys they fill."""

    data: Artifact | None
    init_model: Artifact | None
    sft_model: Artifact | None
    fill_val_files: bool = True
    """the task's test split fills ``data.val_files`` (only when the user left it unset)"""
    gguf_models: tuple[tuple[str, Path, Artifact], ...] = ()
    """(config key, GGUF file, its converted directory) for each model path that names a GGUF file"""

    def artifacts(self) -> list[Artifact]:
        built = [a for a in (self.data, self.init_model, self.sft_model) if a is not None]
        return [artifact for _, _, artifact in self.gguf_models] + built

    def updates(self) -> dict[str, Any]:
        """The config keys the artifacts fill: the data files and the model path."""
        updates: dict[str, Any] = {}
        if self.data is not None:
            updates["data.train_files"] = str(self.data.path / "train.parquet")
            if self.fill_val_files:
                updates["data.val_files"] = str(self.data.path / "test.parquet")
        model = self.sft_model or self.init_model
        if model is not None:
            updates["actor_rollout_ref.model.path"] = str(model.path)
        for key, _, artifact in self.gguf_models:
            updates[key] = str(artifact.path)
        return updates


GGUF_MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path")
"""the model paths that may name a GGUF file (converted whether or not ``prepare.enable`` is set: the file is
the user's model, not something built for them)"""


def _used_model_keys(config: TrainerConfig) -> list[str]:
    """The keys of :data:`GGUF_MODEL_KEYS` whose model the run loads (no critic model without a critic)."""
    from verl.trainer.plan import critic_enabled

    return [key for key in GGUF_MODEL_KEYS if key != "critic.model.path" or critic_enabled(config)]


def _gguf_models(config: TrainerConfig, cache_dir: Path) -> tuple[tuple[str, Path, Artifact], ...]:
    from verl.models.gguf import check_gguf_file, gguf_artifact, is_gguf

    found = []
    for key in _used_model_keys(config):
        path = OmegaConf.select(config, key)
        if is_gguf(path):
            file = check_gguf_file(path, key)
            found.append((key, file, gguf_artifact(file, cache_dir)))
    return tuple(found)


def plan_inputs(config: TrainerConfig) -> PreparePlan:
    """Which artifacts ``config`` needs, without building anything (``verl run --print-config`` shows them)."""
    prep = config.prepare
    cache_dir = Path(prep.cache_dir).expanduser()
    gguf_models = _gguf_models(config, cache_dir)
    if not prep.enable:
        return PreparePlan(None, None, None, gguf_models=gguf_models)
    data = None
    if config.data.train_files is None and prep.task:
        from verl.data.tasks import ROW_FORMATS

        _check_task(prep.task)
        settings = {"task": prep.task, **_plain(prep.task_kwargs)}
        if prep.task in ROW_FORMATS:
            settings["row_format"] = ROW_FORMATS[prep.task]
        data = Artifact(f"{prep.task}-data", settings, cache_dir)
    init_model = sft_model = None
    model_unset = not str(config.actor_rollout_ref.model.path).strip()
    if model_unset and prep.model:  # a built-in model's GGUF file, converted like one the user names
        from verl.models.gguf import fetchable_file, gguf_artifact

        file = fetchable_file(prep.model)
        fetched = ("actor_rollout_ref.model.path", file, gguf_artifact(file, cache_dir))
        return PreparePlan(
            data,
            None,
            None,
            fill_val_files=config.data.val_files is None,
            gguf_models=(*gguf_models, fetched),
        )
    if model_unset and prep.tiny_model:
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
            settings["trainer"].pop("on_existing_run")
            sft_model = Artifact(
                "tiny-model-sft", {"init": init_model.key, "data": data_key, "sft": settings}, cache_dir
            )
    return PreparePlan(
        data, init_model, sft_model, fill_val_files=config.data.val_files is None, gguf_models=gguf_models
    )


def resolve_inputs(config: TrainerConfig) -> TrainerConfig:
    """``config`` with the paths its artifacts will have, built or not (for printing)."""
    return with_updates(config, plan_inputs(config).updates())


def prepare_inputs(config: TrainerConfig, log: Callable[[str], None] = print) -> TrainerConfig:
    """Build the artifacts ``config`` needs that are not cached yet; returns the config with their paths.

    The paths the user gave are checked before anything is built (:func:`check_inputs`)."""
    check_inputs(config)
    plan = plan_inputs(config)
    resolved = with_updates(config, plan.updates())
    for key, file, artifact in plan.gguf_models:
        from verl.models.gguf import convert_gguf

        artifact.build(lambda out, file=file: convert_gguf(file, out), log)
        _check_fits(resolved, artifact.path, overrides=_overrides_for(resolved, key))
    if plan.data is not None:
        plan.data.build(lambda out: _write_task(config.prepare, out), log)
    if plan.init_model is not None:
        plan.init_model.build(lambda out: _write_tiny_model(config, out), log)
        # Before the warm start: a built model too short for the configured lengths fails now.
        _check_fits(config, plan.init_model.path, also="or raise prepare.tiny_model.max_position_embeddings")
    if plan.sft_model is not None:
        train_files = as_file_list(resolved.data.train_files)
        if plan.data is not None and (plan.data.path / SFT_FILE).is_file():
            train_files = [str(plan.data.path / SFT_FILE)]  # the task's own demonstrations
        pinned = pinned_warm_starts().get(plan.sft_model.key)
        if pinned is not None:  # the recipe's warm start, shipped: the same model on every CPU
            log(f"[prepare] warm start: the shipped one ({pinned}, {pinned_record(pinned)['summary']})")
            plan.sft_model.build(lambda out: install_pinned(pinned, out), log)
        else:
            plan.sft_model.build(lambda out: _warm_start(config, plan.init_model.path, train_files, out), log)
    _check_set(resolved)
    return resolved


SFT_FILE = "sft.parquet"
"""a task that writes this beside train.parquet gives the warm start its own demonstrations, so that RL trains on
prompts the warm start never saw (otherwise the warm start fine-tunes on the training file)"""

LENGTHS = "data.max_prompt_length + data.max_response_length"


def _check_fits(config: TrainerConfig, model_path: Any, also: str = "", overrides: Any = None) -> None:
    """``overrides``: the model's ``override_config`` (the policy's by default), which may raise the limit."""
    from verl.models.loading import check_fits_model

    if overrides is None:
        overrides = config.actor_rollout_ref.model.override_config
    longest = config.data.max_prompt_length + config.data.max_response_length
    check_fits_model(model_path, longest, LENGTHS, also=also, overrides=overrides)


def _overrides_for(config: TrainerConfig, key: str) -> Any:
    """The ``override_config`` of the model at config key ``key`` (the policy's or the critic's)."""
    return OmegaConf.select(config, key.rpartition(".")[0] + ".override_config")


def check_inputs(config: TrainerConfig) -> None:
    """Check the inputs the user gave, before anything is built, loaded or trained (cheap: no file is read
    but the models' config.json): the data files exist and are dataset files, the model and tokenizer
    directories are whole (config.json, tokenizer files) or hub ids, the dtypes are known, the
    sequence length fits the model, and the packages the run needs are installed and recent enough. Each
    problem is an InputError / ConfigError naming the config key (a PackageError naming the package)."""
    from verl.data.io import check_data_files
    from verl.doctor.packages import check_packages
    from verl.models.gguf import check_gguf_file, is_gguf
    from verl.models.loading import check_model_dir, resolve_dtype
    from verl.trainer.plan import critic_enabled

    _check_names(config)
    data = config.data
    if data.train_files is not None:
        check_data_files(data.train_files, "data.train_files")
    if data.val_files:  # [] = no validation set
        check_data_files(data.val_files, "data.val_files")
    model = config.actor_rollout_ref.model
    resolve_dtype(model.torch_dtype, "actor_rollout_ref.model.torch_dtype")
    gguf_keys = {key for key in _used_model_keys(config) if is_gguf(OmegaConf.select(config, key))}
    for key in gguf_keys:  # its directory is checked once converted (prepare_inputs)
        check_gguf_file(OmegaConf.select(config, key), key)
    if model.tokenizer_path:
        check_model_dir(
            model.tokenizer_path,
            "actor_rollout_ref.model.tokenizer_path",
            need_config=False,
            need_tokenizer=True,
        )
    if str(model.path).strip() and "actor_rollout_ref.model.path" not in gguf_keys:
        check_model_dir(
            model.path,
            "actor_rollout_ref.model.path",
            need_tokenizer=not model.tokenizer_path,
            tokenizer_key="actor_rollout_ref.model.tokenizer_path",
        )
        _check_fits(config, model.path)
    if model.lora_adapter_path is not None:
        from verl.models.lora import check_adapter_dir

        check_adapter_dir(model.lora_adapter_path, "actor_rollout_ref.model.lora_adapter_path")
    if critic_enabled(config):
        critic = config.critic.model
        resolve_dtype(critic.torch_dtype, "critic.model.torch_dtype")
        if critic.path and "critic.model.path" not in gguf_keys:
            check_model_dir(critic.path, "critic.model.path")
            _check_fits(config, critic.path, overrides=critic.override_config)
    check_packages(config, gguf=bool(gguf_keys))


def _check_names(config: TrainerConfig) -> None:
    """The implementations the config names exist (estimator, loss, rollout engine, reward manager, the
    custom reward function): a typo fails here, not after the warm start or at the first step."""
    from verl.algorithms import get_adv_estimator_fn, get_policy_loss_fn
    from verl.workers.reward import get_reward_manager_cls, load_custom_reward_function
    from verl.workers.rollout import get_rollout_class

    get_adv_estimator_fn(config.algorithm.adv_estimator)
    get_policy_loss_fn(config.actor_rollout_ref.actor.policy_loss.loss_mode)
    get_rollout_class(config.actor_rollout_ref.rollout.name)
    get_reward_manager_cls(config.reward_model.reward_manager)
    if config.custom_reward_function.path:
        load_custom_reward_function(config.custom_reward_function.path, config.custom_reward_function.name)
    from verl.workers.reward.combine import check_reward_inputs

    check_reward_inputs(config)  # reward_model.reward_fns' user functions, the reward model's directories


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
    from verl.errors import UserError
    from verl.trainer.sft_trainer import run_sft

    try:
        run_sft(_sft_config(config, init_path, train_files, out))
    except UserError as exc:  # its keys are the SFT config's: say where the user sets them
        raise type(exc)(
            f"the SFT warm start of the tiny model (verl sft; set its keys as prepare.sft.<key>, e.g. "
            f"prepare.sft.train_batch_size): {exc}"
        ) from exc


def _sft_config(config: TrainerConfig, init_path: Path, train_files: list[str], out: Path) -> Any:
    """The warm start's SFT config: the sft recipe, the seed and thread count of this run (or
    ``prepare.seed``), then ``prepare.sft`` (which may set its own, e.g. ``torch_threads``)."""
    # JSON-quoted: a path may hold anything YAML would read as syntax (quotes, ': ', a leading '[').
    overrides = [
        f"model.path={json.dumps(str(init_path))}",
        f"data.train_files={json.dumps([str(f) for f in train_files])}",
        f"trainer.default_local_dir={json.dumps(str(out))}",
        f"trainer.seed={_warm_start_seed(config)}",
    ]
    threads = config.trainer.torch_threads
    overrides.append(f"trainer.torch_threads={'null' if threads is None else threads}")
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
    from verl.data.io import DatasetError, check_data_files

    digest = hashlib.sha256()
    for path in check_data_files(as_file_list(files), "data.train_files"):
        try:
            digest.update(Path(path).read_bytes())
        except OSError as exc:
            raise DatasetError(f"{path} (data.train_files): cannot read ({exc.strerror or exc})") from exc
    return digest.hexdigest()[:16]
