"""Reward managers: turn a batch of rollouts (DataProto) into token-level reward tensors.

A reward manager decodes each response, looks up its ground truth and data source, calls a scoring
function and writes the scalar score at the response's last valid token (the "outcome reward"
convention that the advantage estimators expect).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import numbers
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from verl.utils.registry import Registry
from verl.workers.reward.scorers import default_compute_score

ComputeScoreFn = Callable[..., Any]

_RESPONSE_PREVIEW_CHARS = 200


class RewardFunctionError(RuntimeError):
    """A scoring function failed or returned something unusable for one sample.

    The message names the data source, sample index, ground truth and (truncated) response so a
    bad row or a buggy scorer can be found without rerunning the rollout.
    """

    def __init__(self, reason: str, *, data_source: Any, index: int, ground_truth: Any, response: str):
        preview = response
        if len(preview) > _RESPONSE_PREVIEW_CHARS:
            preview = preview[:_RESPONSE_PREVIEW_CHARS] + f"... [{len(response)} chars]"
        super().__init__(
            f"reward function {reason} for sample {index} (data_source={data_source!r}, "
            f"ground_truth={ground_truth!r}, response={preview!r})"
        )
        self.data_source = data_source
        self.index = index
        self.ground_truth = ground_truth
        self.response = response


@dataclass
class RewardSample:
    """Everything a scoring function sees for one response (decoded, masks already applied)."""

    index: int
    data_source: Any
    response_str: str
    ground_truth: Any
    extra_info: Any = None
    prompt_str: str | None = None


@dataclass
class ScoreResult:
    score: float
    extra: dict[str, Any]


def _as_float(value: Any) -> float | None:
    """Convert a scorer's number (python/numpy scalar, one-element tensor) to float; None if unusable."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.item()
    elif isinstance(value, np.ndarray):
        if value.size != 1:
            return None
        value = value.item()
    if not isinstance(value, numbers.Real):
        return None
    return float(value)


def _normalize_score(raw: Any, sample: RewardSample) -> ScoreResult:
    """Validate a scorer's return value: a finite number, or a dict with a finite ``"score"``."""
    extra: dict[str, Any] = {}
    value = raw
    if isinstance(raw, Mapping):
        if "score" not in raw:
            raise _error(f"returned a dict without a 'score' key ({raw!r})", sample)
        value = raw["score"]
        extra = {k: v for k, v in raw.items() if k != "score"}
    score = _as_float(value)
    if score is None:
        raise _error(f"returned an unusable value {raw!r} (type {type(raw).__name__})", sample)
    if not math.isfinite(score):
        raise _error(f"returned a non-finite score {raw!r}", sample)
    return ScoreResult(score=score, extra=extra)


def _error(reason: str, sample: RewardSample) -> RewardFunctionError:
    return RewardFunctionError(
        reason,
        data_source=sample.data_source,
        index=sample.index,
        ground_truth=sample.ground_truth,
        response=sample.response_str,
    )


def score_samples(compute_score: ComputeScoreFn, samples: Sequence[RewardSample]) -> list[ScoreResult]:
    """Score samples one by one with ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``.

    Kept as a plain sequential function (no manager state) so timeouts, retries, parallelism or
    failure policies can wrap or replace it later. Any exception is re-raised as
    ``RewardFunctionError`` chained to the original.
    """
    results: list[ScoreResult] = []
    for sample in samples:
        try:
            raw = compute_score(
                data_source=sample.data_source,
                solution_str=sample.response_str,
                ground_truth=sample.ground_truth,
                extra_info=sample.extra_info,
            )
        except Exception as exc:
            raise _error(f"raised {type(exc).__name__}: {exc}", sample) from exc
        results.append(_normalize_score(raw, sample))
    return results


REWARD_MANAGERS = Registry("reward manager (reward_model.reward_manager)")


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator making a reward manager selectable via ``reward_model.reward_manager``."""
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> type:
    return REWARD_MANAGERS.lookup(name)


def _non_tensor_item(non_tensor: Mapping[str, Any], key: str, index: int, *, required: bool) -> Any:
    if key not in non_tensor:
        if required:
            raise KeyError(
                f"reward manager needs non_tensor_batch[{key!r}]; present keys: {sorted(non_tensor)}"
            )
        return None
    return non_tensor[key][index]


def _plain(value: Any) -> Any:
    """numpy string scalars -> str, so messages and printed keys read 'gsm8k', not np.str_('gsm8k')."""
    return str(value) if isinstance(value, str) else value


def _ground_truth(reward_model: Any, index: int) -> Any:
    if isinstance(reward_model, Mapping) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    raise KeyError(
        f"non_tensor_batch['reward_model'][{index}] must be a dict with 'ground_truth', got {reward_model!r}"
    )


@register_reward_manager("naive")
class NaiveRewardManager:
    """Score each sample sequentially with a rule-based function (verl's default manager).

    Args:
        tokenizer: anything with ``decode(ids, skip_special_tokens=True)``.
        num_examine: how many decoded samples to print per data source (debugging aid).
        compute_score: ``fn(data_source, solution_str, ground_truth, extra_info=None)``; defaults
            to :func:`default_compute_score`.
        reward_fn_key: non-tensor key holding each sample's data source.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: ComputeScoreFn | None = None,
        reward_fn_key: str = "data_source",
    ) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    @classmethod
    def from_config(
        cls, config: Any, tokenizer: Any, num_examine: int, compute_score: ComputeScoreFn, **kwargs: Any
    ):
        """Build from a trainer config; managers that need more settings override this."""
        return cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score, **kwargs)

    def _decode(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    def _response_mask(self, data: Any) -> torch.Tensor:
        batch = data.batch
        responses = batch["responses"]
        if "response_mask" in batch:
            mask = batch["response_mask"]
        elif "attention_mask" in batch:
            mask = batch["attention_mask"][:, -responses.shape[-1] :]
        else:
            # No mask at all: every response token counts.
            mask = torch.ones_like(responses)
        if mask.shape != responses.shape:
            raise ValueError(f"response mask shape {tuple(mask.shape)} != responses {tuple(responses.shape)}")
        return mask.bool()

    def _prompt_strs(self, data: Any) -> list[str | None]:
        """Decode prompts (valid tokens only) when present; only used for printing."""
        batch = data.batch
        if "prompts" not in batch:
            return [None] * len(data)
        prompts = batch["prompts"]
        mask = None
        if "attention_mask" in batch and batch["attention_mask"].shape[-1] >= prompts.shape[-1]:
            mask = batch["attention_mask"][:, : prompts.shape[-1]].bool()
        return [
            self._decode(prompts[i][mask[i]] if mask is not None else prompts[i]) for i in range(len(data))
        ]

    def build_samples(self, data: Any, *, with_prompts: bool = False) -> tuple[list[RewardSample], list[int]]:
        """Decode each response and collect its scoring inputs plus its reward position.

        The reward position is the LAST valid response token (searched in the mask, so left- and
        right-padded responses both work). A response with no valid tokens gets position 0: the
        reward must land somewhere, and such rows are normally fully masked downstream anyway.
        """
        responses = data.batch["responses"]
        mask = self._response_mask(data)
        non_tensor = data.non_tensor_batch
        prompts = self._prompt_strs(data) if with_prompts else [None] * len(data)
        positions = torch.arange(responses.shape[-1], device=responses.device)

        samples: list[RewardSample] = []
        reward_positions: list[int] = []
        for i in range(len(data)):
            valid = mask[i]
            reward_positions.append(int(torch.where(valid, positions, -1).max().item()) if valid.any() else 0)
            samples.append(
                RewardSample(
                    index=i,
                    data_source=_plain(_non_tensor_item(non_tensor, self.reward_fn_key, i, required=True)),
                    response_str=self._decode(responses[i][valid]),
                    ground_truth=_ground_truth(
                        _non_tensor_item(non_tensor, "reward_model", i, required=True), i
                    ),
                    extra_info=_non_tensor_item(non_tensor, "extra_info", i, required=False),
                    prompt_str=prompts[i],
                )
            )
        return samples, reward_positions

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """Return a float32 reward tensor shaped like ``responses`` (or a dict with extra info).

        If a reward model already produced ``rm_scores`` they are returned unchanged.
        """
        if "rm_scores" in data.batch:
            if not return_dict:
                return data.batch["rm_scores"]
            keys = (data.meta_info or {}).get("reward_extra_keys", [])
            extra = {k: list(data.non_tensor_batch[k]) for k in keys if k in data.non_tensor_batch}
            return {"reward_tensor": data.batch["rm_scores"], "reward_extra_info": extra}

        samples, reward_positions = self.build_samples(data, with_prompts=self.num_examine > 0)
        results = score_samples(self.compute_score, samples)

        reward_tensor = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        reward_tensor = reward_tensor.to(data.batch["responses"].device)
        for sample, pos, result in zip(samples, reward_positions, results, strict=True):
            reward_tensor[sample.index, pos] = result.score

        # Every extra-info list has one entry per sample (None where a scorer omitted the key), so
        # it can be stored as a non-tensor column aligned with the batch.
        extra_keys: list[str] = []
        for result in results:
            extra_keys.extend(k for k in result.extra if k not in extra_keys)
        reward_extra_info = {k: [r.extra.get(k) for r in results] for k in extra_keys}

        self._print_examples(samples, results)

        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": reward_extra_info}
        return reward_tensor

    def _print_examples(self, samples: Sequence[RewardSample], results: Sequence[ScoreResult]) -> None:
        printed: dict[Any, int] = {}
        for sample, result in zip(samples, results, strict=True):
            count = printed.get(sample.data_source, 0)
            if count >= self.num_examine:
                continue
            printed[sample.data_source] = count + 1
            if sample.prompt_str is not None:
                print("[prompt]", sample.prompt_str)
            print("[response]", sample.response_str)
            print("[ground_truth]", sample.ground_truth)
            print("[score]", result.score)
            for key, value in result.extra.items():
                print(f"[{key}]", value)


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """Read ``cfg.key`` from a DictConfig, dict or plain object; missing or None -> ``default``."""
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        value = cfg.get(key, default)
    else:
        try:
            value = getattr(cfg, key, default)
        except Exception:  # omegaconf struct mode / interpolation errors on absent keys
            value = default
    return default if value is None else value


def load_custom_reward_function(path: str | os.PathLike[str], name: str = "compute_score") -> ComputeScoreFn:
    """Import ``name`` from the Python file at ``path`` (a user-provided scoring function)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom reward function file not found: {path}")
    # Unique module name per file so two custom files do not clobber each other in sys.modules.
    module_name = "verl_custom_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import custom reward function file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # needed e.g. for dataclasses/pickling inside the user module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"reward function {name!r} not found in {path}; callables there: {available}")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{name!r} in {path} is not callable (got {type(fn).__name__})")
    return fn


def get_custom_reward_fn(config: Any) -> ComputeScoreFn | None:
    """The function named by ``config.custom_reward_function`` (with its ``reward_kwargs``), or None."""
    section = _cfg_get(config, "custom_reward_function")
    path = _cfg_get(section, "path")
    if not path:
        return None
    fn = load_custom_reward_function(path, _cfg_get(section, "name", "compute_score"))
    kwargs = dict(_cfg_get(section, "reward_kwargs", {}) or {})
    return partial(fn, **kwargs) if kwargs else fn


def load_reward_manager(
    config: Any,
    tokenizer: Any,
    num_examine: int = 0,
    compute_score: ComputeScoreFn | None = None,
    **kwargs: Any,
) -> Any:
    """Build the reward manager named by ``config.reward_model.reward_manager`` (default "naive").

    The scoring function is ``compute_score`` when given (a function passed in code, e.g. by
    ``RewardOperator``), else ``config.custom_reward_function.path``/``.name`` when a path is set,
    else :func:`default_compute_score`. Extra ``kwargs`` go to the manager's constructor.
    """
    manager_name = _cfg_get(_cfg_get(config, "reward_model"), "reward_manager", "naive")
    manager_cls = get_reward_manager_cls(manager_name)
    compute_score = compute_score or get_custom_reward_fn(config) or default_compute_score
    kwargs.setdefault("reward_fn_key", _cfg_get(_cfg_get(config, "data"), "reward_fn_key", "data_source"))
    return manager_cls.from_config(config, tokenizer, num_examine, compute_score, **kwargs)
