"""Several reward functions combined with weights (``reward_model.reward_fns``), and the reward model's score.

A sample's score is a weighted sum of named terms::

    score = Σ_i w_i · term_i(sample)

(TRL calls the same thing ``reward_funcs`` + ``reward_weights``.) The terms (parsed in
:mod:`verl.config.reward_fns`): ``correctness`` (the rule score of today: ``custom_reward_function``, else the
data_source's scorer), ``format`` (1.0 when the response has its data source's final-answer format,
:mod:`verl.workers.reward.formats`), ``length`` (:func:`length_penalty`), ``reward_model`` (the reward model's
score, :mod:`verl.workers.reward.model`) and ``path/to/file.py:fn`` (any function with the scorer signature
``fn(data_source, solution_str, ground_truth, extra_info=None)``). Each term's value is also an extra field
named after it (so it is logged as ``reward_extra/<name>/mean``), except the reward model's: ``rm_score``, since
every row's ``reward_model`` column holds its ground truth; the extra fields the terms return themselves (the
correctness scorer's ``acc``) are kept.

Two seams: the per-sample terms (correctness, format, user functions) are one scoring function handed to the
configured reward manager (naive, batch, dapo: their error policy and time limit apply to it as a whole); the
batch terms (length: token counts; reward_model: one forward pass over the batch) are added by
:class:`RewardFunction`, the reward role's reward function, at the same position (the last response token).
An empty list is exactly the scoring of before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from verl.config.errors import ConfigError
from verl.config.reward_fns import KEY, RM_FIELD, RewardTerm, parse_reward_fns
from verl.protocol import DataProto
from verl.workers.reward.awaiting import coroutine_function, run_to_completion
from verl.workers.reward.dapo import overlong_penalty
from verl.workers.reward.formats import format_check, format_score
from verl.workers.reward.loading import load_custom_reward_function
from verl.workers.reward.masks import last_positions, response_mask, trajectory_mask
from verl.workers.reward.scorers import default_compute_score
from verl.workers.reward.scoring import REWARD_ERROR_KEY, ComputeScoreFn, _as_float

DEFAULT_LENGTH_THRESHOLD = 0.8
"""the length term's default threshold, as a share of data.max_response_length: DAPO's recipe (Yu et al. 2025)
penalises the last 4096 of 20480 tokens, i.e. from 80% on"""


def _term_value(raw: Any, name: str) -> tuple[float, dict[str, Any]]:
    """A term's number and the extra fields it returned (a number, or a dict with a finite ``"score"``)."""
    extra: dict[str, Any] = {}
    value = raw
    if isinstance(raw, Mapping):
        if "score" not in raw:
            raise ValueError(f"reward term {name!r} returned a dict without a 'score' key ({raw!r})")
        value = raw["score"]
        extra = {k: v for k, v in raw.items() if k != "score"}
    number = _as_float(value)
    if number is None or not np.isfinite(number):
        raise ValueError(f"reward term {name!r} returned {raw!r}, not a finite number")
    return number, extra


def combine_terms(results: Sequence[tuple[RewardTerm, Any]]) -> dict[str, Any]:
    """``{"score": Σ w·value, <each term's extra fields>, <field>: value for each term}``; a term's value wins
    over an extra field of the same name."""
    total, extra, values = 0.0, {}, {}
    for term, raw in results:
        value, more = _term_value(raw, term.name)
        extra.update(more)
        values[term.field] = value
        total += term.weight * value
    return {"score": total, **extra, **values}


def _sample_term_fns(
    terms: Sequence[RewardTerm], correctness: ComputeScoreFn
) -> list[tuple[RewardTerm, Any]]:
    """(term, scorer) of the per-sample terms; user functions loaded (errors name their item of the key)."""
    fns = []
    for i, term in enumerate(terms):
        if term.per_batch:
            continue
        if term.path is not None:
            where = f"{KEY}[{i}]"
            fn = load_custom_reward_function(
                term.path,
                term.function or "compute_score",
                path_key=f"{where} path",
                name_key=f"{where} function",
            )
            fns.append((term, partial(fn, **term.kwargs) if term.kwargs else fn))
        else:
            fns.append((term, correctness if term.name == "correctness" else format_score))
    return fns


def sample_scorer(terms: Sequence[RewardTerm], correctness: ComputeScoreFn) -> ComputeScoreFn:
    """One scoring function ``fn(data_source, solution_str, ground_truth, extra_info=None)`` returning the
    weighted sum of the per-sample terms and their values (see :func:`combine_terms`)."""
    fns = _sample_term_fns(terms, correctness)
    if any(coroutine_function(fn) is not None for _, fn in fns):
        return _async_sample_scorer(fns)

    def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict:
        sample = dict(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
        )
        return combine_terms([(term, fn(**sample)) for term, fn in fns])

    return compute_score


def _async_sample_scorer(fns: Sequence[tuple[RewardTerm, Any]]) -> ComputeScoreFn:
    """:func:`sample_scorer` when a term is an ``async def`` function: itself one, so that the manager awaits
    the samples together (:mod:`verl.workers.reward.awaiting`); the plain terms are called as they are."""

    async def compute_score(
        data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> dict:
        sample = dict(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
        )
        results = []
        for term, fn in fns:
            coroutine = coroutine_function(fn)
            results.append((term, await coroutine(**sample) if coroutine is not None else fn(**sample)))
        return combine_terms(results)

    return run_to_completion(compute_score)


def batched_sample_scorer(terms: Sequence[RewardTerm], correctness: ComputeScoreFn) -> ComputeScoreFn:
    """:func:`sample_scorer` for ``reward_manager=batch``: ``correctness`` is the batched function (one call
    with lists; the built-in scorer is called per sample), the other terms are called per sample."""
    fns = _sample_term_fns(terms, correctness)
    batched = correctness is not default_compute_score

    def compute_score(
        data_sources: list, solution_strs: list, ground_truths: list, extra_infos: list
    ) -> list[dict]:
        columns = list(zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True))
        raw: dict[str, list[Any]] = {}
        for term, fn in fns:
            if term.name == "correctness" and term.path is None and batched:
                scores = fn(
                    data_sources=data_sources,
                    solution_strs=solution_strs,
                    ground_truths=ground_truths,
                    extra_infos=extra_infos,
                )
                scores = scores.tolist() if isinstance(scores, (np.ndarray, torch.Tensor)) else list(scores)
                if len(scores) != len(columns):
                    raise ValueError(
                        f"the correctness term returned {len(scores)} scores for {len(columns)} samples"
                    )
                raw[term.name] = scores
            else:
                raw[term.name] = [fn(*row) for row in columns]
        return [combine_terms([(term, raw[term.name][i]) for term, _ in fns]) for i in range(len(columns))]

    return compute_score


def length_penalty(lengths: torch.Tensor, max_response_length: int, threshold: int) -> torch.Tensor:
    """0 up to ``threshold`` tokens, then falling linearly to −1 at ``max_response_length``:
    ``min(−(L − threshold) / (max_response_length − threshold), 0)``, DAPO's soft overlong punishment
    (:func:`verl.workers.reward.dapo.overlong_penalty`) with buffer = max − threshold and factor 1."""
    return overlong_penalty(lengths, max_response_length, max_response_length - threshold, 1.0)


def length_threshold(term: RewardTerm, max_response_length: int) -> int:
    """The length term's ``kwargs.threshold`` (tokens), by default 80% of ``max_response_length``."""
    default = int(DEFAULT_LENGTH_THRESHOLD * max_response_length)
    return int(term.kwargs.get("threshold", default))


def response_positions(data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """(the last trained response token of each row, the trajectory's length): where the reward managers put
    the score (position 0 for an empty response) and what the length term counts (every response token the
    model saw, inserted tool outputs included, as DAPO's overlong penalty counts them)."""
    mask = response_mask(data)
    return last_positions(mask), trajectory_mask(data, mask).sum(-1)


ScoreModel = Callable[[DataProto], torch.Tensor]
"""the reward model: a batch -> one score per sample (see verl.workers.reward.model.RewardModelScorer)"""


class RewardFunction:
    """The reward role's reward function: the manager's score, the reward model's, and the batch terms.

    Without ``terms`` (reward_fns empty) and with a reward model, the reward model's score replaces the rule
    score, as in verl: the batch reaches the manager with ``rm_scores``, which the built-in managers return as
    they are. With terms, each is weighted into the sum; the manager runs only when a per-sample term needs it.
    A sample zeroed after a reward error (error_policy=zero) gets no batch term either: it scores 0.
    """

    def __init__(
        self,
        manager: Callable[..., Any],
        terms: Sequence[RewardTerm] = (),
        reward_model: ScoreModel | None = None,
        max_response_length: int = 1,
    ) -> None:
        self.manager = manager
        self.terms = list(terms)
        self.reward_model = reward_model
        self.max_response_length = max_response_length

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        positions, lengths = response_positions(data)
        rm = self.reward_model(data).to(torch.float32) if self.reward_model is not None else None
        if not self.terms:
            if rm is not None:
                scores = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
                scores[torch.arange(len(positions)), positions.cpu()] = rm
                data = DataProto(
                    {**data.batch, "rm_scores": scores}, dict(data.non_tensor_batch), dict(data.meta_info)
                )
            reward = self.manager(data, return_dict=True)
            if rm is not None:
                reward["reward_extra_info"][RM_FIELD] = rm.tolist()
        else:
            reward = self._weighted(data, positions, lengths, rm)
        return reward if return_dict else reward["reward_tensor"]

    def _weighted(
        self, data: DataProto, positions: torch.Tensor, lengths: torch.Tensor, rm: torch.Tensor | None
    ) -> dict[str, Any]:
        if any(not term.per_batch for term in self.terms):
            reward = self.manager(data, return_dict=True)
        else:
            shape = data.batch["responses"].shape
            reward = {"reward_tensor": torch.zeros(shape, dtype=torch.float32), "reward_extra_info": {}}
        extra = reward["reward_extra_info"]
        failed = torch.tensor([bool(e) for e in extra.get(REWARD_ERROR_KEY, [False] * len(positions))])
        rows = torch.arange(len(positions))
        for term in self.terms:
            if not term.per_batch:
                continue
            if term.name == "length":
                threshold = length_threshold(term, self.max_response_length)
                values = length_penalty(lengths.cpu(), self.max_response_length, threshold)
            else:
                values = rm
            values = values.to(torch.float32).cpu()
            tensor = reward["reward_tensor"]
            added = torch.where(failed, 0.0, term.weight * values).to(tensor.device)
            tensor[rows.to(tensor.device), positions.to(tensor.device)] += added
            extra[term.field] = values.tolist()
        if rm is not None:  # enabled but not a term: scored and logged (a monitor), not in the reward
            extra[RM_FIELD] = rm.tolist()
        return reward


def check_no_reward_fn_in_code(terms: Sequence[RewardTerm], reward_fn: Any) -> None:
    """reward_fns weights terms inside the configured reward manager, which a reward_fn passed in code
    replaces: both together is a config error rather than terms silently dropped."""
    if terms and reward_fn is not None:
        raise ConfigError(
            f"{KEY} combines reward terms inside the configured reward manager, but a reward_fn passed in code "
            f"replaces that manager: set {KEY}=[] or pass compute_score instead"
        )


def check_reward_inputs(config: Any) -> None:
    """At start-up, before anything loads: the terms parse, the user functions they name import, and the reward
    model's directories exist (each an error naming its key)."""
    from verl.workers.reward.model import check_reward_model_inputs

    _sample_term_fns(parse_reward_fns(config.reward_model.reward_fns), default_compute_score)
    check_reward_model_inputs(config)


def check_format_sources(config: Any, data_sources: Sequence[Any]) -> None:
    """With the format term: every data source of the datasets has a known answer format (a ConfigError naming
    the first that has none and the known ones), found before training rather than at the first reward."""
    if not any(
        t.name == "format" and t.path is None for t in parse_reward_fns(config.reward_model.reward_fns)
    ):
        return
    for source in dict.fromkeys(data_sources):
        try:
            format_check(source)
        except ValueError as exc:
            raise ConfigError(f"{KEY} has the format term, but {exc}") from None


def needs_rule_fields(config: Any) -> bool:
    """Whether the reward manager reads each row's data source and ground truth: not when only batch terms
    score (a reward model alone: reward_model.enable with no reward_fns, or reward_fns of length / reward_model)."""
    terms = parse_reward_fns(config.reward_model.reward_fns)
    if not terms:
        return not config.reward_model.enable
    return any(not t.per_batch for t in terms)
