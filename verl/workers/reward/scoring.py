"""Scoring samples for the reward managers (:mod:`verl.workers.reward.manager`): what a scoring function sees
(:class:`RewardSample`) and what a sample scores (:class:`ScoreResult`), a scorer's return value checked, the
calls run under ``reward_model.timeout_s``, and :class:`RewardFunctionError` naming the sample whose scorer
raised, timed out or returned NaN / inf / a non-number, raised or scored 0 per ``reward_model.error_policy``.
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

from verl.workers.reward.awaiting import await_all, coroutine_function
from verl.workers.reward.timeout import CallTimeout, Outcome, TimeLimit

logger = logging.getLogger("verl.workers.reward.manager")  # the name these warnings are logged under

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
    """Score samples one by one with ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``;
    an ``async def`` function (:mod:`verl.workers.reward.awaiting`) is awaited for all samples at once instead.

    Kept as a plain function (no manager state) so parallelism or retries can wrap or replace it later. A
    failed sample (an exception, a timeout, an unusable score) is a ``RewardFunctionError`` chained to the
    cause, raised or scored 0 per ``error_policy``.
    """
    check_error_policy(error_policy)
    coroutine = coroutine_function(compute_score)
    calls = [
        partial(
            coroutine or compute_score,
            data_source=sample.data_source,
            solution_str=sample.response_str,
            ground_truth=sample.ground_truth,
            extra_info=sample.extra_info,
        )
        for sample in samples
    ]
    if coroutine is not None:  # an async def function: every sample's call awaited at once
        outcomes: Iterator[Outcome] = iter(await_all(calls, time_limit.timeout_s if time_limit else None))
    else:  # error_policy=fail stops at the first failure: the calls after it are not run
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
