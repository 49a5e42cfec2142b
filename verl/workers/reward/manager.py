"""Reward managers: turn a batch of rollouts (DataProto) into token-level reward tensors.

A reward manager decodes each response (the whole trajectory: in a multi-turn rollout the inserted tool
outputs too), looks up its ground truth and data source, calls a scoring function and writes the scalar
score at the response's last trained token, the last with ``response_mask`` 1 (the "outcome reward"
convention that the advantage estimators expect).

A scoring function that raises, runs past ``reward_model.timeout_s`` (60 s by default; null = no
limit) or returns NaN / inf / a non-number is a :class:`RewardFunctionError` naming the sample.
``reward_model.error_policy`` decides: ``fail`` raises it (and scores no further sample), ``zero`` logs
it, scores the sample 0 and flags it in the ``reward_error`` extra field (one bool per sample; the
trainer sums it into ``reward/errors``).

The parts: :mod:`verl.workers.reward.scoring` scores samples (the error types, the time limit and the error
policy), :mod:`verl.workers.reward.masks` finds the response tokens and the reward positions; this module
holds the registry of reward managers and the default one, :class:`NaiveRewardManager`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from verl.utils.registry import Registry
from verl.workers.reward.masks import last_positions, response_mask, trajectory_mask
from verl.workers.reward.scorers import default_compute_score
from verl.workers.reward.scoring import (
    ERROR_POLICIES,
    REWARD_ERROR_KEY,
    ComputeScoreFn,
    RewardBatchError,
    RewardFunctionError,
    RewardSample,
    ScoreResult,
    apply_error_policy,
    call_failure,
    call_scorer,
    check_error_policy,
    describe_function,
    normalize_score,
    report_errors,
    run_calls,
    score_samples,
)
from verl.workers.reward.timeout import DEFAULT_TIMEOUT_S, TimeLimit

__all__ = [
    "ERROR_POLICIES",
    "REWARD_ERROR_KEY",
    "REWARD_MANAGERS",
    "ComputeScoreFn",
    "NaiveRewardManager",
    "RewardBatchError",
    "RewardFunctionError",
    "RewardSample",
    "ScoreResult",
    "apply_error_policy",
    "call_failure",
    "call_scorer",
    "check_error_policy",
    "describe_function",
    "error_handling_kwargs",
    "get_reward_manager_cls",
    "last_positions",
    "normalize_score",
    "register_reward_manager",
    "report_errors",
    "response_mask",
    "run_calls",
    "score_samples",
    "trajectory_mask",
]

REWARD_MANAGERS = Registry("reward manager (reward_model.reward_manager)")


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator making a reward manager selectable via ``reward_model.reward_manager``."""
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> type:
    """The manager registered as ``name`` (after importing ``VERL_USE_EXTERNAL_MODULES`` on a miss, where verl's
    users register theirs), or the class ``path/to/file.py:Class`` / ``package.module:Class`` names (verl's
    ``reward.reward_manager.source=importlib``). Either of verl's shapes works (verl.workers.reward.verl_shapes)."""
    if ":" in str(name):
        from verl.utils.imports import load_object

        return load_object(name, "reward_model.reward_manager", "reward manager class")
    if name not in REWARD_MANAGERS:
        from verl.algorithms.external import import_external_modules

        import_external_modules()
    return REWARD_MANAGERS.lookup(name)


def _with_rollout_info(extra_info: Any, non_tensor: Mapping[str, Any], index: int) -> Any:
    """``extra_info`` plus what an agent loop reported for the sample, as verl passes it to scorers:
    ``num_turns``, and ``tool_rewards`` (the sum of its tools' rewards). Unchanged for a single-turn batch."""
    if "__num_turns__" not in non_tensor:
        return extra_info
    info = dict(extra_info) if isinstance(extra_info, Mapping) else {}
    info["num_turns"] = int(non_tensor["__num_turns__"][index])
    if "tool_rewards" in non_tensor:
        info["tool_rewards"] = non_tensor["tool_rewards"][index]
    return info


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
        error_policy: ``reward_model.error_policy``, ``fail`` or ``zero`` (see the module docstring).
        timeout_s: ``reward_model.timeout_s``, seconds per scoring call (default 60); None = no limit.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: ComputeScoreFn | None = None,
        reward_fn_key: str = "data_source",
        error_policy: str = "fail",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.error_policy = check_error_policy(error_policy)
        self.time_limit = TimeLimit(timeout_s) if timeout_s is not None else None

    @classmethod
    def from_config(
        cls, config: Any, tokenizer: Any, num_examine: int, compute_score: ComputeScoreFn, **kwargs: Any
    ):
        """Build from a trainer config; managers that need more settings override this."""
        kwargs = {**error_handling_kwargs(config), **kwargs}
        return cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score, **kwargs)

    def score(self, samples: Sequence[RewardSample]) -> list[ScoreResult]:
        """One result per sample, in order; managers that score differently (batched) override this."""
        return score_samples(
            self.compute_score, samples, error_policy=self.error_policy, time_limit=self.time_limit
        )

    def _decode(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    def _response_mask(self, data: Any) -> torch.Tensor:
        return response_mask(data)

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

        The decoded response is the whole trajectory (:func:`trajectory_mask`: in a multi-turn rollout the
        tool outputs between the sampled turns too). The reward position is the LAST trained response token
        (``response_mask``, searched in the mask, so left- and right-padded responses both work). A response
        with no valid tokens gets position 0: the reward must land somewhere, and such rows are normally
        fully masked downstream anyway.
        """
        responses = data.batch["responses"]
        mask = self._response_mask(data)
        text_mask = trajectory_mask(data, mask)
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
                    response_str=self._decode(responses[i][text_mask[i]]),
                    ground_truth=_ground_truth(
                        _non_tensor_item(non_tensor, "reward_model", i, required=True), i
                    ),
                    extra_info=_with_rollout_info(
                        _non_tensor_item(non_tensor, "extra_info", i, required=False), non_tensor, i
                    ),
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
        results = self.score(samples)

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
        if self.error_policy != "fail":  # under fail an error never gets here: no column to carry
            reward_extra_info[REWARD_ERROR_KEY] = [r.error is not None for r in results]

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


def error_handling_kwargs(config: Any) -> dict[str, Any]:
    """``error_policy`` / ``timeout_s`` from ``config.reward_model``, only where they differ from the
    defaults: a custom manager whose constructor predates them keeps working until it needs them."""
    section = config.reward_model
    kwargs = {"error_policy": section.error_policy, "timeout_s": section.timeout_s}
    defaults = {"error_policy": "fail", "timeout_s": DEFAULT_TIMEOUT_S}
    return {k: v for k, v in kwargs.items() if v != defaults[k]}
