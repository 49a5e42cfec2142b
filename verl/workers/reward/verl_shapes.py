"""Reward managers written for verl, run by this repository's reward workers.

verl has had two shapes of reward manager, and a class of either works here once it is named by
``reward_model.reward_manager`` (verl's ``reward.reward_manager.name``, or ``path/to/file.py:Class`` /
``package.module:Class``, which verl's ``reward.reward_manager.source=importlib`` + ``module.path`` become):

* **classic** (verl <= 0.7, ``verl.workers.reward_manager``): built ``cls(tokenizer=, num_examine=,
  compute_score=, reward_fn_key=)``, called ``manager(data, return_dict)`` for a token-level reward tensor (or
  ``{"reward_tensor", "reward_extra_info"}``). :class:`ClassicManager` builds and calls it; the scoring function
  it is handed reports an exception with the sample it was scoring, as the managers here do.
* **reward loop** (verl 0.8 / 0.9, ``verl.experimental.reward_loop.reward_manager``): a ``RewardManagerBase``
  subclass built ``cls(config=, tokenizer=, compute_score=)`` whose ``async run_single(data)`` scores one sample
  (a one-row DataProto) as ``{"reward_score": float, "reward_extra_info": dict}``. :class:`RewardLoopManager`
  runs it for every sample of the batch at once on an event loop, as verl's reward loop does, and writes each
  score on the sample's last valid response token. A ``run_single`` that raises, runs past
  ``reward_model.timeout_s`` or returns no usable score is a :class:`RewardFunctionError` naming the sample,
  handled per ``reward_model.error_policy``.

A class with ``from_config`` is one of this repository's managers and is built by it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Mapping
from functools import partial, wraps
from typing import Any

import torch
from omegaconf import OmegaConf

from verl.workers.reward.loading import accepted_kwargs
from verl.workers.reward.manager import NaiveRewardManager, error_handling_kwargs
from verl.workers.reward.scoring import (
    ComputeScoreFn,
    RewardBatchError,
    RewardFunctionError,
    RewardSample,
    ScoreResult,
    apply_error_policy,
    call_failure,
    normalize_score,
    report_errors,
)

logger = logging.getLogger(__name__)


def is_reward_loop_class(cls: Any) -> bool:
    """A verl 0.8+ reward-loop manager: it scores one sample with ``async run_single``."""
    return inspect.iscoroutinefunction(getattr(cls, "run_single", None))


def build_manager(
    manager_cls: Any,
    config: Any,
    tokenizer: Any,
    num_examine: int,
    compute_score: ComputeScoreFn,
    client_kwargs: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """The manager ``manager_cls`` builds, in whichever of the three shapes it has (see the module docstring).
    A manager written for verl also gets a generative reward model's ``client_kwargs`` (``reward_router_address``,
    ``reward_model_tokenizer``) in its constructor when it takes them, as verl builds its managers."""
    if hasattr(manager_cls, "from_config"):
        return manager_cls.from_config(config, tokenizer, num_examine, compute_score, **kwargs)
    client = accepted_kwargs(manager_cls, client_kwargs or {})
    if is_reward_loop_class(manager_cls):
        return RewardLoopManager.from_config(
            config, tokenizer, num_examine, compute_score, manager_cls=manager_cls, client_kwargs=client
        )
    error_policy = error_handling_kwargs(config).get("error_policy", "fail")
    scorer = reporting_scorer(compute_score, error_policy)
    kwargs = {**dict(config.reward_model.manager_kwargs), **client, **kwargs}  # verl's reward.reward_kwargs
    return ClassicManager(
        manager_cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=scorer, **kwargs)
    )


def verl_view(config: Any) -> Any:
    """``config`` with the ``reward`` section a manager written for verl 0.9.1 reads (``config.reward.
    reward_kwargs``, ``reward_manager``, ``custom_reward_function``, ``num_workers``), from this repository's keys."""
    reward = config.reward_model
    view = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    view.reward = {
        "reward_kwargs": OmegaConf.to_container(reward.manager_kwargs, resolve=True),
        "reward_manager": {"source": "register", "name": reward.reward_manager},
        "custom_reward_function": OmegaConf.to_container(config.custom_reward_function, resolve=True),
        "num_workers": reward.num_workers,
    }
    return view


def reporting_scorer(compute_score: ComputeScoreFn, error_policy: str) -> ComputeScoreFn:
    """``compute_score`` for a verl manager's own loop: an exception becomes a :class:`RewardFunctionError` naming
    the sample (data source, ground truth, response); with ``error_policy=zero`` it is logged and scored 0."""

    @wraps(compute_score)
    def scored(data_source: Any = None, solution_str: str = "", ground_truth: Any = None, extra_info: Any = None,
               **kw: Any) -> Any:  # fmt: skip
        try:
            return compute_score(
                data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info,
                **kw,
            )  # fmt: skip
        except RewardFunctionError:
            raise
        except Exception as exc:
            index = extra_info.get("index", "?") if isinstance(extra_info, Mapping) else "?"
            error = RewardFunctionError(
                f"raised {type(exc).__name__}: {exc}",
                data_source=data_source, index=index, ground_truth=ground_truth, response=solution_str,
            )  # fmt: skip
            error.__cause__ = exc
            result = apply_error_policy(error, error_policy)
            report_errors([result], error_policy)
            return result.score

    return scored


class ClassicManager:
    """A verl <= 0.7 reward manager, called the way the reward worker calls one: always a dict back."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        name = f"{type(self.manager).__module__}.{type(self.manager).__qualname__}"
        try:
            out = self.manager(data, return_dict=True)
        except RewardFunctionError:
            raise
        except Exception as exc:
            raise RewardBatchError(f"reward manager {name} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(out, torch.Tensor):
            out = {"reward_tensor": out, "reward_extra_info": {}}
        if not isinstance(out, Mapping) or not isinstance(out.get("reward_tensor"), torch.Tensor):
            raise RewardBatchError(
                f"reward manager {name} returned {type(out).__name__}: expected a reward tensor shaped like "
                "responses, or a dict with 'reward_tensor' and 'reward_extra_info'"
            )
        tensor, shape = out["reward_tensor"], tuple(data.batch["responses"].shape)
        if tuple(tensor.shape) != shape:
            raise RewardBatchError(f"reward manager {name} returned a reward tensor of shape {tuple(tensor.shape)}; "
                                   f"the responses are {shape}")  # fmt: skip
        extra = {k: list(v) for k, v in dict(out.get("reward_extra_info") or {}).items()}
        result = {"reward_tensor": tensor.float(), "reward_extra_info": extra}
        return result if return_dict else result["reward_tensor"]


class RewardLoopManager(NaiveRewardManager):
    """A verl 0.8+ reward-loop manager (``run_single`` per sample) as a batch manager; the reward positions, the
    printed examples, the error policy and the ``reward_error`` field are this repository's."""

    def __init__(self, manager: Any, tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> None:
        super().__init__(tokenizer, num_examine, **kwargs)
        self.manager = manager
        self._data: Any = None

    @classmethod
    def from_config(  # type: ignore[override]
        cls, config: Any, tokenizer: Any, num_examine: int, compute_score: ComputeScoreFn, *, manager_cls: Any,
        client_kwargs: Mapping[str, Any] | None = None, **kwargs: Any,
    ) -> RewardLoopManager:  # fmt: skip
        manager = manager_cls(
            config=verl_view(config),
            tokenizer=tokenizer,
            compute_score=compute_score,
            **dict(client_kwargs or {}),
        )
        kwargs = {**error_handling_kwargs(config), "reward_fn_key": config.data.reward_fn_key, **kwargs}
        return cls(manager, tokenizer, num_examine, compute_score=compute_score, **kwargs)

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        self._data = data  # score() hands each sample's row to run_single
        try:
            return super().__call__(data, return_dict=return_dict)
        finally:
            self._data = None

    def score(self, samples: list[RewardSample]) -> list[ScoreResult]:
        outcomes = self._run(self._run_all(samples))
        results = []
        for sample, (ok, value) in zip(samples, outcomes, strict=True):
            try:
                if not ok:
                    raise call_failure(value, self.time_limit, partial(_sample_error, sample=sample))
                results.append(normalize_score(_as_score(value, sample), sample))
            except RewardFunctionError as error:
                results.append(apply_error_policy(error, self.error_policy))
        report_errors(results, self.error_policy)
        return results

    async def _run_all(self, samples: list[RewardSample]) -> list[tuple[bool, Any]]:
        timeout = self.time_limit.timeout_s if self.time_limit is not None else None

        async def one(sample: RewardSample) -> tuple[bool, Any]:
            try:
                row = self._data[sample.index : sample.index + 1]
                return True, await asyncio.wait_for(self.manager.run_single(row), timeout)
            except asyncio.TimeoutError:
                return False, TimeoutError(
                    f"run_single took longer than reward_model.timeout_s={timeout:g} s"
                )
            except Exception as exc:
                return False, exc

        return list(await asyncio.gather(*(one(sample) for sample in samples)))

    def _run(self, coro: Any) -> Any:
        """Run ``coro`` on the manager's event loop (``self.loop`` in verl's base class, which its
        ``run_in_executor`` calls use), on a helper thread when this one already runs a loop."""
        loop = getattr(self.manager, "loop", None)
        if loop is None or loop.is_closed():
            loop = self.manager.loop = asyncio.new_event_loop()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return loop.run_until_complete(coro)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(loop.run_until_complete, coro).result()


def _sample_error(reason: str, sample: RewardSample, hint: str = "") -> RewardFunctionError:
    return RewardFunctionError(
        f"(run_single) {reason}", data_source=sample.data_source, index=sample.index,
        ground_truth=sample.ground_truth, response=sample.response_str, hint=hint,
    )  # fmt: skip


def _as_score(value: Any, sample: RewardSample) -> Any:
    """``run_single``'s ``{"reward_score", "reward_extra_info"}`` as a scorer's ``{"score", **extra}``."""
    if not isinstance(value, Mapping) or "reward_score" not in value:
        raise _sample_error(
            f"returned {value!r}: expected {{'reward_score': float, 'reward_extra_info': dict}}", sample
        )
    extra = dict(value.get("reward_extra_info") or {})
    extra.pop("score", None)
    return {**extra, "score": value["reward_score"]}
