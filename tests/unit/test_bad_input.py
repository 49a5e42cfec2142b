"""Bad input, handled, in reward scoring: misbehaving reward functions (raise, NaN, wrong count, hang),
per-sample and batched, under ``reward_model.error_policy`` and ``reward_model.timeout_s``.

The property tests (hypothesis) feed misbehaving reward functions and hold the reward managers to one
promise: a clear error naming the sample (or the batch), or a counted zero, and never a bare crash.

The data-file and row checks are in test_bad_input_data.py; non-finite gradients and out-of-memory
errors in test_bad_input_training.py. The batched scorers are defined here: an assertion names this file.
"""

from __future__ import annotations

import logging
import math
import pickle
import re
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from _bad_input_helpers import FAST
from hypothesis import given
from hypothesis import strategies as st

from verl.config import ConfigError
from verl.config.loader import load_config
from verl.protocol import DataProto
from verl.workers.reward import (
    REWARD_ERROR_KEY,
    BatchRewardManager,
    NaiveRewardManager,
    RewardBatchError,
    RewardFunctionError,
    TimeLimit,
    TimeLimitExhausted,
    load_reward_manager,
)

# ============================================================================ reward managers

_DIGITS = "0123456789"


class DigitTokenizer:
    """id 0 is padding; id k > 0 is the digit k - 1."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(_DIGITS[i - 1] for i in ids if i != 0)


def make_batch(n: int, width: int = 3) -> DataProto:
    """n samples whose response decodes to the sample's index, so a scorer can look up its behaviour."""
    responses = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i in range(n):
        ids = [_DIGITS.index(c) + 1 for c in str(i)]
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": np.array(["src"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": f"g{i}"} for i in range(n)], dtype=object),
        },
    )


def by_index(behaviours: list[Any]):
    """A per-sample scorer that returns (or raises) ``behaviours[index]``."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        value = behaviours[int(solution_str)]
        if isinstance(value, BaseException):
            raise value
        return value

    return compute_score


def test_raising_scorer_fail_and_zero(caplog):
    behaviours = [1.0, ZeroDivisionError("boom"), 0.5]
    with pytest.raises(RewardFunctionError, match=r"raised ZeroDivisionError: boom for sample 1.*'g1'"):
        NaiveRewardManager(DigitTokenizer(), compute_score=by_index(behaviours))(make_batch(3))
    manager = NaiveRewardManager(DigitTokenizer(), compute_score=by_index(behaviours), error_policy="zero")
    with caplog.at_level(logging.WARNING, logger="verl.workers.reward"):
        out = manager(make_batch(3), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.5]
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [False, True, False]
    messages = [r.getMessage() for r in caplog.records]
    assert any("sample 1" in m and "boom" in m and "error_policy=zero" in m for m in messages)
    assert any("1 of 3 samples scored 0" in m for m in messages)


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, None, "0.5", [1.0], {"acc": 1}, {"score": math.nan}, torch.ones(2)]
)
def test_unusable_scores_follow_the_policy(bad):
    with pytest.raises(RewardFunctionError, match="sample 1"):
        NaiveRewardManager(DigitTokenizer(), compute_score=by_index([1.0, bad]))(make_batch(2))
    out = NaiveRewardManager(DigitTokenizer(), compute_score=by_index([1.0, bad]), error_policy="zero")(
        make_batch(2), return_dict=True
    )
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [False, True]


@pytest.fixture
def release():
    """An event hanging scorers wait on; set at teardown so abandoned threads end with the test."""
    event = threading.Event()
    yield event
    event.set()


def test_hanging_scorer_times_out(release):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "1":
            release.wait(10)
        return 1.0

    manager = NaiveRewardManager(DigitTokenizer(), compute_score=compute_score, timeout_s=0.1)
    with pytest.raises(
        RewardFunctionError, match=r"did not return within reward_model\.timeout_s=0\.1 s for sample 1"
    ):
        manager(make_batch(3))
    zeroing = NaiveRewardManager(
        DigitTokenizer(), compute_score=compute_score, timeout_s=0.1, error_policy="zero"
    )
    start = time.perf_counter()
    out = zeroing(make_batch(3), return_dict=True)
    assert time.perf_counter() - start < 2.0
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [False, True, False]
    assert zeroing.time_limit.abandoned == 1


def test_time_limit_passes_results_and_errors_and_stops_after_too_many_hangs(release):
    limit = TimeLimit(0.05, max_abandoned=2)
    assert limit(lambda: 3) == 3
    with pytest.raises(KeyError, match="k"):
        limit(lambda: {}["k"])
    for _ in range(2):
        with pytest.raises(TimeoutError):
            limit(lambda: release.wait(10))
    with pytest.raises(TimeLimitExhausted, match="2 reward calls are still running"):
        limit(lambda: 1)
    # Exhaustion is not one sample's fault: error_policy=zero does not hide it.
    manager = NaiveRewardManager(DigitTokenizer(), compute_score=by_index([1.0]), error_policy="zero")
    manager.time_limit = limit
    with pytest.raises(TimeLimitExhausted):
        manager(make_batch(1))
    with pytest.raises(ValueError, match="timeout_s"):
        TimeLimit(0)


def test_reward_errors_and_managers_pickle():
    error = RewardFunctionError("raised X", data_source="s", index=3, ground_truth="g", response="r")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.index == 3
    assert str(pickle.loads(pickle.dumps(RewardBatchError("bad count")))) == "bad count"
    manager = NaiveRewardManager(DigitTokenizer(), timeout_s=1.0, error_policy="zero")
    manager.time_limit(lambda: 1)  # the helper thread exists now; it must not be pickled
    clone = pickle.loads(pickle.dumps(manager))
    assert clone.time_limit.timeout_s == 1.0 and clone.error_policy == "zero"


def test_error_policy_is_checked():
    with pytest.raises(ValueError, match="reward_model.error_policy='skip'"):
        NaiveRewardManager(DigitTokenizer(), error_policy="skip")


# ---------------------------------------------------------------------------- batched reward functions


def batched(behaviour):
    def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos):
        return behaviour(len(solution_strs))

    return compute_score_batch


def test_batched_wrong_count_names_function_and_counts():
    for policy in ("fail", "zero"):
        manager = BatchRewardManager(
            DigitTokenizer(), compute_score=batched(lambda n: [1.0] * (n - 1)), error_policy=policy
        )
        with pytest.raises(
            RewardBatchError,
            match=r"compute_score_batch \(.*test_bad_input\.py\) returned 2 scores for a batch of 3",
        ):
            manager(make_batch(3))
    with pytest.raises(RewardBatchError, match="returned float, expected a list of 2 scores"):
        BatchRewardManager(DigitTokenizer(), compute_score=batched(lambda n: 1.0))(make_batch(2))


def test_batched_raise_and_nan_follow_the_policy():
    def boom(n):
        raise RuntimeError("judge down")

    with pytest.raises(
        RewardBatchError, match="compute_score_batch.*raised RuntimeError: judge down on a batch of 2"
    ):
        BatchRewardManager(DigitTokenizer(), compute_score=batched(boom))(make_batch(2))
    out = BatchRewardManager(DigitTokenizer(), compute_score=batched(boom), error_policy="zero")(
        make_batch(2), return_dict=True
    )
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [True, True]
    nan = batched(lambda n: np.array([1.0, np.nan, 0.5]))
    with pytest.raises(RewardFunctionError, match="non-finite score nan for sample 1"):
        BatchRewardManager(DigitTokenizer(), compute_score=nan)(make_batch(3))
    out = BatchRewardManager(DigitTokenizer(), compute_score=nan, error_policy="zero")(
        make_batch(3), return_dict=True
    )
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="reward_manager=batch needs a batched scoring function"):
        BatchRewardManager(DigitTokenizer())


def test_batched_hang_times_out(release):
    manager = BatchRewardManager(
        DigitTokenizer(),
        compute_score=batched(lambda n: release.wait(10)),
        timeout_s=0.1,
        error_policy="zero",
    )
    assert manager(make_batch(2), return_dict=True)["reward_extra_info"][REWARD_ERROR_KEY] == [True, True]


def test_load_reward_manager_reads_the_policy(tmp_path):
    scorer = tmp_path / "score.py"
    scorer.write_text(
        "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n    return [1.0] * len(solution_strs)\n"
    )
    for name in ("naive", "dapo", "batch"):
        overrides = [
            "data.max_response_length=8",
            f"reward_model.reward_manager={name}",
            "reward_model.error_policy=zero",
            "reward_model.timeout_s=2.5",
        ]
        if name == "batch":
            overrides.append(f"custom_reward_function.path={scorer}")
        manager = load_reward_manager(load_config(overrides=overrides, check=False), DigitTokenizer())
        assert manager.error_policy == "zero" and manager.time_limit.timeout_s == 2.5
    default = load_reward_manager(load_config(check=False), DigitTokenizer())
    assert default.error_policy == "fail" and default.time_limit.timeout_s == 60.0  # the default deadline
    unlimited = load_config(overrides=["reward_model.timeout_s=null"], check=False)
    assert load_reward_manager(unlimited, DigitTokenizer()).time_limit is None


def test_config_keys_are_validated():
    cfg = load_config(
        None, ["data.bad_rows=skip", "reward_model.error_policy=zero", "reward_model.timeout_s=5"]
    )
    assert cfg.data.bad_rows == "skip" and cfg.reward_model.timeout_s == 5.0
    for override, key in (
        ("data.bad_rows=ignore", "data.bad_rows"),
        ("reward_model.error_policy=skip", "reward_model.error_policy"),
        ("reward_model.timeout_s=0", "reward_model.timeout_s"),
    ):
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(None, [override])


# ---------------------------------------------------------------------------- property: misbehaving scorers

_GOOD_SCORES = st.one_of(
    st.floats(-10, 10),
    st.integers(-5, 5),
    st.booleans(),
    st.floats(-1, 1).map(lambda x: {"score": x, "acc": x > 0}),
    st.floats(-1, 1).map(np.float32),
    st.floats(-1, 1).map(torch.tensor),
)
_BAD_SCORES = st.one_of(
    st.sampled_from(
        [math.nan, math.inf, -math.inf, None, "1.0", [1.0], (), {"acc": True}, {"score": math.inf}]
    ),
    st.sampled_from([ValueError, KeyError, ZeroDivisionError, TypeError, AssertionError, RuntimeError]).map(
        lambda cls: cls("scorer bug")
    ),
    st.just(torch.zeros(3)),
)
_BEHAVIOURS = st.lists(
    st.one_of(_GOOD_SCORES.map(lambda v: (True, v)), _BAD_SCORES.map(lambda v: (False, v))),
    min_size=1,
    max_size=10,
)


def _expected_score(value: Any) -> float:
    value = value["score"] if isinstance(value, dict) else value
    return float(value.item() if isinstance(value, torch.Tensor) else value)


@FAST
@given(behaviours=_BEHAVIOURS, policy=st.sampled_from(["fail", "zero"]))
def test_property_misbehaving_scorer_error_or_counted_zero(behaviours, policy):
    values = [v for _, v in behaviours]
    bad = [i for i, (ok, _) in enumerate(behaviours) if not ok]
    manager = NaiveRewardManager(DigitTokenizer(), compute_score=by_index(values), error_policy=policy)
    try:
        out = manager(make_batch(len(values)), return_dict=True)
    except RewardFunctionError as error:
        assert policy == "fail" and bad, "raised although every score was usable or the policy is zero"
        assert f"for sample {bad[0]} " in str(error) and f"'g{bad[0]}'" in str(error)
        return
    assert policy == "zero" or not bad
    totals = out["reward_tensor"].sum(-1)
    assert torch.isfinite(totals).all()
    for i, (ok, value) in enumerate(behaviours):
        assert totals[i].item() == pytest.approx(_expected_score(value) if ok else 0.0, abs=1e-6)
    if policy == "zero":
        assert [i for i, flag in enumerate(out["reward_extra_info"][REWARD_ERROR_KEY]) if flag] == bad


@FAST
@given(
    behaviours=_BEHAVIOURS,
    count_delta=st.sampled_from([0, 0, 0, -1, 1, 3]),
    raises=st.booleans(),
    policy=st.sampled_from(["fail", "zero"]),
)
def test_property_misbehaving_batched_scorer(behaviours, count_delta, raises, policy):
    values = [v for _, v in behaviours]
    n = len(values)

    def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
        assert len(solution_strs) == n
        if raises:
            raise OSError("sandbox unreachable")
        return (values + [0.0] * max(count_delta, 0))[: n + count_delta]

    manager = BatchRewardManager(DigitTokenizer(), compute_score=compute_score, error_policy=policy)
    bad = [i for i, (ok, _) in enumerate(behaviours) if not ok]
    try:
        out = manager(make_batch(n), return_dict=True)
    except RewardBatchError as error:
        assert "compute_score" in str(error) and f"batch of {n}" in str(error)
        assert (raises and policy == "fail") or (not raises and count_delta != 0)
        return
    except RewardFunctionError as error:
        assert policy == "fail" and not raises and count_delta == 0 and bad
        assert f"for sample {bad[0]} " in str(error)
        return
    assert policy == "zero" or (not raises and count_delta == 0 and not bad)
    assert count_delta == 0 or raises
    flags = out["reward_extra_info"].get(REWARD_ERROR_KEY, [False] * n)
    assert [i for i, flag in enumerate(flags) if flag] == (list(range(n)) if raises else bad)
    assert torch.isfinite(out["reward_tensor"]).all()
