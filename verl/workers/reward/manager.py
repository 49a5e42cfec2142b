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
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from verl.utils.registry import Registry
from verl.workers.reward.scorers import default_compute_score
from verl.workers.reward.timeout import DEFAULT_TIMEOUT_S, CallTimeout, Outcome, TimeLimit

logger = logging.getLogger(__name__)

ComputeScoreFn = Callable[..., Any]

_RESPONSE_PREVIEW_CHARS = 200

ERROR_POLICIES = ("fail", "zero")
"""``reward_model.error_policy``: what a failed sample scores (see the module docstring)."""

REWARD_ERROR_KEY = "reward_error"
"""The per-sample extra field (bool) flagging samples scored 0 after an error (error_policy=zero)."""

_MAX_REPORTED_ERRORS = 5
"""Failed samples logged one by one per batch; the rest are counted in one summary line."""


class RewardFunctionError(RuntimeError):
    """A scoring function failed or returned something unusable for one sample.

    The message names the data source, sample index, ground truth and (truncated) response so a
    bad row or a buggy scorer can be found without rerunning the rollout. ``hint`` (what to do about it,
    e.g. raise the time limit) ends the message.
    """

    def __init__(
        self, reason: str, *, data_source: Any, index: int, ground_truth: Any, response: str, hint: str = ""
    ):
        self.reason = reason
        preview = response
        if len(preview) > _RESPONSE_PREVIEW_CHARS:
            preview = preview[:_RESPONSE_PREVIEW_CHARS] + f"... [{len(response)} chars]"
        super().__init__(
            f"reward function {reason} for sample {index} (data_source={data_source!r}, "
            f"ground_truth={ground_truth!r}, response={preview!r})" + (f"; {hint}" if hint else "")
        )
        self.data_source = data_source
        self.index = index
        self.ground_truth = ground_truth
        self.response = response
        self.hint = hint

    def __reduce__(self):  # keyword-only fields: the default pickling would lose them (Ray pickles errors)
        fields = dict(
            data_source=self.data_source,
            index=self.index,
            ground_truth=self.ground_truth,
            response=self.response,
            hint=self.hint,
        )
        return (partial(type(self), self.reason, **fields), ())


class RewardBatchError(RewardFunctionError):
    """A batched reward function failed as a whole, or returned a wrong number of scores."""

    def __init__(self, message: str, hint: str = "") -> None:
        RuntimeError.__init__(self, message + (f"; {hint}" if hint else ""))
        self.reason = message
        self.hint = hint
        self.data_source = self.index = self.ground_truth = self.response = None

    def __reduce__(self):
        return (type(self), (self.reason, self.hint))


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
    """One sample's score, the extra fields its scorer returned, and the error it was zeroed for (if any)."""

    score: float
    extra: dict[str, Any]
    error: str | None = None


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


def normalize_score(raw: Any, sample: RewardSample) -> ScoreResult:
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


def _error(reason: str, sample: RewardSample, hint: str = "") -> RewardFunctionError:
    return RewardFunctionError(
        reason,
        data_source=sample.data_source,
        index=sample.index,
        ground_truth=sample.ground_truth,
        response=sample.response_str,
        hint=hint,
    )


def describe_function(fn: Callable[..., Any]) -> str:
    """``name (file)`` of a scoring function, for messages about a function rather than a sample."""
    base = fn.func if isinstance(fn, partial) else fn
    name = getattr(base, "__qualname__", None) or type(base).__name__
    code = getattr(base, "__code__", None)
    return f"{name} ({code.co_filename})" if code is not None else name


def check_error_policy(error_policy: str) -> str:
    if error_policy not in ERROR_POLICIES:
        raise ValueError(f"reward_model.error_policy={error_policy!r} is not one of {ERROR_POLICIES}")
    return error_policy


_MAIN_THREAD_ONLY = "signal only works in main thread"
"""Python's ValueError from ``signal.signal`` / ``signal.alarm`` off the main thread (scorers with
signal-based timeouts, e.g. math_verify's default)."""


def run_calls(
    calls: Sequence[Callable[[], Any]], time_limit: TimeLimit | None, *, stop_on_error: bool
) -> Iterator[Outcome]:
    """The outcome of each call, in order: under the time limit (the whole list handed to its thread at
    once) or on this thread. With ``stop_on_error`` the calls after the first failure are not run (under
    the time limit) or not reached (here, when the caller stops reading).

    The time limit refusing to start more calls (too many hung threads) is not a sample's fault: its
    :class:`TimeLimitExhausted` passes through, so no error policy can hide it.
    """
    if time_limit is not None:
        yield from time_limit.map(calls, stop_on_error=stop_on_error)
        return
    for fn in calls:
        try:
            yield True, fn()
        except Exception as exc:
            yield False, exc


def call_failure(
    exc: BaseException, time_limit: TimeLimit | None, fail: Callable[..., Exception]
) -> Exception:
    """The error for a failed call, ``fail(reason, hint=...)`` chained to ``exc``; a BaseException that is
    not an Exception (KeyboardInterrupt, SystemExit) is raised as it is."""
    if not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, CallTimeout):
        error = fail(str(exc), hint=exc.hint)
    else:
        hint = ""
        if time_limit is not None and _MAIN_THREAD_ONLY in str(exc):
            hint = (
                "reward_model.timeout_s runs the reward function on a helper thread, where signal-based "
                "timeouts cannot work: set reward_model.timeout_s=null to call it on the calling thread, or "
                "turn off its own signal timeout"
            )
        error = fail(f"raised {type(exc).__name__}: {exc}", hint=hint)
    error.__cause__ = exc
    return error


def call_scorer(fn: Callable[[], Any], time_limit: TimeLimit | None, fail: Callable[..., Exception]) -> Any:
    """``fn()`` under the time limit; a timeout or an exception raises ``fail(reason, hint=...)``, chained."""
    ok, value = next(run_calls([fn], time_limit, stop_on_error=True))
    if not ok:
        raise call_failure(value, time_limit, fail)
    return value


def apply_error_policy(error: RewardFunctionError, error_policy: str) -> ScoreResult:
    """``fail``: raise the error; ``zero``: a 0 score that carries the error's message."""
    if error_policy == "fail":
        raise error
    return ScoreResult(score=0.0, extra={}, error=str(error))


def report_errors(results: Sequence[ScoreResult], error_policy: str) -> None:
    """Log the first few zeroed samples in full and the total, so a broken scorer is seen but not spammed."""
    errors = [r.error for r in results if r.error is not None]
    for message in errors[:_MAX_REPORTED_ERRORS]:
        logger.warning("%s; scored 0 (reward_model.error_policy=%s)", message, error_policy)
    if errors:
        logger.warning(
            "%d of %d samples scored 0 after a reward function error (reward_model.error_policy=%s)",
            len(errors),
            len(results),
            error_policy,
        )


def score_samples(
    compute_score: ComputeScoreFn,
    samples: Sequence[RewardSample],
    *,
    error_policy: str = "fail",
    time_limit: TimeLimit | None = None,
) -> list[ScoreResult]:
    """Score samples one by one with ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``.

    Kept as a plain sequential function (no manager state) so parallelism or retries can wrap or
    replace it later. A failed sample (an exception, a timeout, an unusable score) is a
    ``RewardFunctionError`` chained to the cause, raised or scored 0 per ``error_policy``.
    """
    check_error_policy(error_policy)
    calls = [
        partial(
            compute_score,
            data_source=sample.data_source,
            solution_str=sample.response_str,
            ground_truth=sample.ground_truth,
            extra_info=sample.extra_info,
        )
        for sample in samples
    ]
    # error_policy=fail stops at the first failure: the calls after it are not run.
    outcomes = run_calls(calls, time_limit, stop_on_error=error_policy == "fail")
    results: list[ScoreResult] = []
    for sample, (ok, value) in zip(samples, outcomes, strict=True):
        try:
            if not ok:
                raise call_failure(value, time_limit, partial(_error, sample=sample))
            results.append(normalize_score(value, sample))
        except RewardFunctionError as error:
            results.append(apply_error_policy(error, error_policy))
    report_errors(results, error_policy)
    return results


REWARD_MANAGERS = Registry("reward manager (reward_model.reward_manager)")


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator making a reward manager selectable via ``reward_model.reward_manager``."""
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> type:
    return REWARD_MANAGERS.lookup(name)


def response_mask(data: Any) -> torch.Tensor:
    """Which response tokens are valid (bool, shaped like ``responses``): ``response_mask``, else the response
    part of ``attention_mask``, else all of them."""
    batch = data.batch
    responses = batch["responses"]
    if "response_mask" in batch:
        mask = batch["response_mask"]
    elif "attention_mask" in batch:
        mask = batch["attention_mask"][:, -responses.shape[-1] :]
    else:
        mask = torch.ones_like(responses)
    if mask.shape != responses.shape:
        raise ValueError(f"response mask shape {tuple(mask.shape)} != responses {tuple(responses.shape)}")
    return mask.bool()


def trajectory_mask(data: Any, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Which response tokens make up the response as a whole (bool, shaped like ``responses``): every token the
    model saw, i.e. the response part of ``attention_mask``, plus the trained tokens ``mask`` (by default
    :func:`response_mask`). In a multi-turn rollout that includes the inserted tool / user tokens, whose
    ``response_mask`` is 0 but which are part of the trajectory a scorer judges (verl decodes the response up
    to the attention mask's length); in a single-turn batch the two masks are the same."""
    mask = response_mask(data) if mask is None else mask.bool()
    attention = data.batch["attention_mask"] if "attention_mask" in data.batch else None
    if attention is not None and attention.shape[-1] >= mask.shape[-1]:
        mask = mask | attention[:, -mask.shape[-1] :].bool()
    return mask


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """Each row's last position where ``mask`` is set, 0 for a row without one: where the outcome reward goes.
    With ``response_mask`` that is the last sampled token, also when inserted (masked) tokens follow it:
    the advantage estimators skip masked tokens, so a reward on one would be lost."""
    index = torch.arange(mask.shape[-1], device=mask.device)
    return torch.where(mask.bool(), index, -1).max(-1).values.clamp_min(0)


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
