"""Which reward model a config asks for, by verl's rule, and the checks of the generative one's keys.

verl 0.9.1's reward loop decides from two keys: with ``reward_model.enable`` and no ``custom_reward_function``
the reward model is discriminative (a sequence classifier scoring each response); with a custom reward function
it is generative, served like a rollout, and the function calls it over HTTP (``reward_router_address``). Here
one more case keeps what ``reward_model.reward_fns`` already meant: a list naming the ``reward_model`` term asks
for a discriminative score to weigh in, so the model stays discriminative and the custom function is the
``correctness`` term. Kept free of torch and of the worker packages (config validation imports it).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.config.backends import BUILT_ROLLOUTS, DTYPE_NAMES
from verl.config.errors import as_written
from verl.config.reward_fns import reward_fns_problems
from verl.config.schema_reward import RewardModelRolloutConfig
from verl.config.value_rules import check_at_least, check_choice, check_in_range

SECTION = "reward_model.rollout"

GENRM_KWARGS = ("reward_router_address", "reward_model_tokenizer")
"""the keyword arguments a generative reward model's client function is called with (verl's names)"""

DISRM_ONLY = {
    "micro_batch_size_per_gpu": None,
    "max_length": None,
    "model.input_tokenizer": None,
}
"""keys only a discriminative reward model reads, and their defaults"""

ENGINE_ONLY = {
    "gpu_memory_utilization": ("vllm", "sglang"),
    "free_cache_engine": ("vllm", "sglang"),
    "engine_kwargs": ("vllm", "sglang"),
    "enforce_eager": ("vllm",),
    "enable_chunked_prefill": ("vllm",),
    "enable_prefix_caching": ("vllm",),
    "max_num_batched_tokens": ("vllm",),
}
"""``reward_model.rollout`` keys only some engines read, and which"""


def names_reward_model_term(cfg: Any) -> bool:
    """``reward_model.reward_fns`` weighs in the ``reward_model`` term (a discriminative score)."""
    terms = reward_fns_problems(cfg.reward_model.reward_fns, [])
    return any(term.name == "reward_model" and term.path is None for term in terms)


def serves_genrm(cfg: Any) -> bool:
    """The reward model is generative and served: ``reward_model.enable`` with ``custom_reward_function.path``
    (verl's rule), unless ``reward_model.reward_fns`` names the ``reward_model`` term (see the module
    docstring)."""
    return bool(
        cfg.reward_model.enable and cfg.custom_reward_function.path and not names_reward_model_term(cfg)
    )


def genrm_errors(cfg: DictConfig) -> list[str]:
    """The values of ``reward_model.rollout``, and the discriminative model's keys set for a generative one
    (they would change nothing)."""
    errors: list[str] = []
    section = cfg.reward_model.rollout
    check_in_range(errors, f"{SECTION}.temperature", section.temperature, 0, note="0 = greedy")
    check_in_range(errors, f"{SECTION}.top_p", section.top_p, 0, 1, low_open=True)
    check_at_least(errors, f"{SECTION}.top_k", section.top_k, -1)
    check_at_least(errors, f"{SECTION}.response_length", section.response_length, 1)
    check_at_least(errors, f"{SECTION}.max_model_len", section.max_model_len, 2, null="the model's own")
    check_at_least(errors, f"{SECTION}.max_num_seqs", section.max_num_seqs, 1)
    check_in_range(
        errors, f"{SECTION}.gpu_memory_utilization", section.gpu_memory_utilization, 0, 1, low_open=True
    )
    check_at_least(
        errors, f"{SECTION}.max_num_batched_tokens", section.max_num_batched_tokens, 1, null="vLLM's"
    )
    if section.dtype is not None:
        check_choice(errors, f"{SECTION}.dtype", section.dtype, DTYPE_NAMES)
    if serves_genrm(cfg):
        check_choice(errors, f"{SECTION}.name", section.name, BUILT_ROLLOUTS)
        for key, default in DISRM_ONLY.items():
            value = OmegaConf.select(cfg.reward_model, key)
            if value != default:
                errors.append(
                    f"reward_model.{key}={as_written(value)} is read by a discriminative reward model only; with "
                    f"custom_reward_function.path set the reward model is generative (served per {SECTION}, "
                    "called by that function, as in verl): drop the setting"
                )
    return errors


def _changed(cfg: DictConfig) -> dict[str, Any]:
    """The ``reward_model.rollout`` keys set away from their defaults, with their values."""
    given = OmegaConf.to_container(cfg.reward_model.rollout, resolve=True)
    defaults = OmegaConf.to_container(OmegaConf.structured(RewardModelRolloutConfig))
    return {key: value for key, value in given.items() if value != defaults[key]}


def genrm_notices(cfg: DictConfig) -> list[str]:
    """``reward_model.rollout`` keys that nothing reads: the enabled reward model is discriminative, or the
    generative one's engine does not read them."""
    if not cfg.reward_model.enable:
        return []
    changed = _changed(cfg)
    if serves_genrm(cfg):
        engine = cfg.reward_model.rollout.name
        return [
            f"{SECTION}.{key}={as_written(value)}: read by the {' and '.join(ENGINE_ONLY[key])} engine only; the "
            f"generative reward model generates with {SECTION}.name={engine}"
            for key, value in changed.items()
            if key in ENGINE_ONLY and engine not in ENGINE_ONLY[key]
        ]
    listed = [f"{SECTION}.{key}={as_written(value)}" for key, value in changed.items()]
    if not listed:
        return []
    why = (
        "reward_model.reward_fns names the reward_model term"
        if names_reward_model_term(cfg)
        else "no custom_reward_function.path"
    )
    return [
        f"{', '.join(listed)}: read only when the reward model is generative (reward_model.enable with "
        f"custom_reward_function.path, as in verl); here it is discriminative ({why}) and scores in the reward "
        "workers"
    ]
