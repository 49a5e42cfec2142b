"""``reward_model.reward_manager=limited``: verl's rate-limited reward manager (``RateLimitedRewardManager``).

For scorers that call a paid or shared service (an LLM judge behind an API): each call waits for its share of
``reward_model.max_rpm`` requests and ``max_tpm`` tokens a minute (a call counts as
``estimated_tokens_per_request`` tokens), then runs under ``reward_model.timeout_s`` (verl's ``reward.timeout``).
A call that times out or fails never stops training, as in verl: the sample scores 0, its ``timeout`` field is
True for a timeout, and ``reward_error`` flags it (``reward/errors``); ``error_policy`` is not read.

The pacing is verl's token bucket: it starts full with one second's worth (rate / 60 tokens) and refills at
that rate; a call that needs more waits. The limits hold per reward worker (verl's are per process too), and
the wait happens before the call's time limit starts. verl's ``max_concurrent`` needs nothing here: a worker
makes its calls one at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from verl.workers.reward.manager import NaiveRewardManager, register_reward_manager
from verl.workers.reward.scoring import (
    ComputeScoreFn,
    RewardFunctionError,
    RewardSample,
    ScoreResult,
    _error,
    apply_error_policy,
    call_failure,
    normalize_score,
    report_errors,
    run_calls,
)
from verl.workers.reward.timeout import CallTimeout

TIMEOUT_KEY = "timeout"
"""the per-sample extra field (bool) marking a call that ran past the time limit, as verl's limited manager"""


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved up; :meth:`acquire` waits until enough are there.

    A request for more than the capacity waits for the deficit (the bucket goes negative, as verl's does).
    ``clock`` and ``sleep`` are injectable so tests need not wait.
    """

    def __init__(
        self,
        rate: float,
        capacity: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"a token bucket needs a rate > 0; got {rate}")
        self.rate = float(rate)
        self.capacity = float(capacity if capacity is not None else rate)
        self.tokens = self.capacity
        self.clock, self.sleep = clock, sleep
        self.last = clock()
        self.lock = threading.Lock()

    def acquire(self, tokens: float = 1.0) -> float:
        """Take ``tokens``, waiting as long as the refill needs; returns the seconds waited."""
        with self.lock:
            now = self.clock()
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now
            self.tokens -= tokens
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            self.sleep(wait)
        return wait

    def __getstate__(self) -> dict[str, Any]:  # a lock does not pickle (managers travel to Ray workers)
        state = dict(self.__dict__)
        del state["lock"]
        state["clock"], state["sleep"] = time.monotonic, time.sleep
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()
        self.last = self.clock()


def per_minute(limit: int | None) -> TokenBucket | None:
    """verl's bucket for a per-minute limit: rate and capacity of one second's worth; None = no limit."""
    return None if limit is None else TokenBucket(limit / 60.0)


@register_reward_manager("limited")
class RateLimitedRewardManager(NaiveRewardManager):
    """The naive manager's decoding and reward positions; calls paced by the limits, failures scored 0."""

    def __init__(
        self,
        *args: Any,
        max_rpm: int | None = None,
        max_tpm: int | None = None,
        estimated_tokens_per_request: int = 2000,
        **kwargs: Any,
    ) -> None:
        kwargs["error_policy"] = "zero"  # verl: a failed or timed-out call scores 0, training goes on
        super().__init__(*args, **kwargs)
        self.requests = per_minute(max_rpm)
        self.tokens = per_minute(max_tpm)
        self.estimated_tokens_per_request = estimated_tokens_per_request

    @classmethod
    def from_config(
        cls, config: Any, tokenizer: Any, num_examine: int, compute_score: ComputeScoreFn, **kwargs: Any
    ) -> RateLimitedRewardManager:
        reward = config.reward_model
        kwargs.pop("error_policy", None)
        return cls(
            tokenizer=tokenizer,
            num_examine=num_examine,
            compute_score=compute_score,
            timeout_s=reward.timeout_s,
            max_rpm=reward.max_rpm,
            max_tpm=reward.max_tpm,
            estimated_tokens_per_request=reward.estimated_tokens_per_request,
            **kwargs,
        )

    def pace(self) -> None:
        """Wait for this call's share of the request and token limits."""
        if self.requests is not None:
            self.requests.acquire(1.0)
        if self.tokens is not None:
            self.tokens.acquire(float(self.estimated_tokens_per_request))

    def score(self, samples: Sequence[RewardSample]) -> list[ScoreResult]:
        results = [self._score_one(sample) for sample in samples]
        report_errors(results, self.error_policy)
        return results

    def _score_one(self, sample: RewardSample) -> ScoreResult:
        self.pace()
        call = partial(
            self.compute_score,
            data_source=sample.data_source,
            solution_str=sample.response_str,
            ground_truth=sample.ground_truth,
            extra_info=sample.extra_info,
        )
        ok, value = next(run_calls([call], self.time_limit, stop_on_error=True))
        try:
            if not ok:
                raise call_failure(value, self.time_limit, partial(_error, sample=sample))
            result = normalize_score(value, sample)
        except RewardFunctionError as error:
            result = apply_error_policy(error, self.error_policy)
        result.extra[TIMEOUT_KEY] = not ok and isinstance(value, CallTimeout)
        return result


__all__ = ["TIMEOUT_KEY", "RateLimitedRewardManager", "TokenBucket", "per_minute"]
