"""The default reward deadline (``reward_model.timeout_s`` = 60 s; null = no limit) and what the reward's
fields become in validation: ``val-core/<source>/acc/mean@n`` only when the scorer reports ``acc`` (the reward
then ``val-aux/<source>/reward/mean@n``, as verl names it), else ``val-core/<source>/reward/mean@n``, and the
progress bar's ``val_acc`` / ``val_reward``.
"""

from __future__ import annotations

import io
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _config_helpers import _verl_home  # noqa: F401  (_verl_home: autouse fixture)
from omegaconf import OmegaConf

from verl.config import TrainerConfig, load_config
from verl.protocol import DataProto
from verl.trainer.metrics import compute_validation_metrics
from verl.utils.tracking import Tracking, validation_postfix
from verl.workers.reward import (
    REWARD_ERROR_KEY,
    BatchRewardManager,
    NaiveRewardManager,
    RewardBatchError,
    RewardFunctionError,
    default_compute_score,
    load_reward_manager,
)
from verl.workers.reward.timeout import DEFAULT_TIMEOUT_S, CallTimeout

HINT = "raise reward_model.timeout_s=<seconds> (null = no limit; the default is 60)"


class DigitTokenizer:
    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(str(i - 1) for i in ids if i != 0)


def make_batch(answers: list[int], source: str = "arithmetic") -> DataProto:
    """One response per answer (its digits), ground truth 7 for every sample."""
    width = max(len(str(a)) for a in answers)
    responses = torch.zeros((len(answers), width), dtype=torch.long)
    for row, answer in enumerate(answers):
        ids = [int(c) + 1 for c in str(answer)]
        responses[row, : len(ids)] = torch.tensor(ids)
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": (responses != 0).long()},
        non_tensors={
            "data_source": np.array([source] * len(answers), dtype=object),
            "reward_model": np.array([{"ground_truth": 7} for _ in answers], dtype=object),
        },
    )


@pytest.fixture
def release():
    """An event the hanging scorers wait on; set at teardown so their abandoned threads end with the test."""
    event = threading.Event()
    yield event
    event.set()


# ------------------------------------------------------------------------------------------------ the default
def test_default_deadline_is_60_seconds() -> None:
    assert DEFAULT_TIMEOUT_S == 60.0
    assert OmegaConf.structured(TrainerConfig).reward_model.timeout_s == 60.0  # the schema agrees
    assert load_config().reward_model.timeout_s == 60.0
    assert NaiveRewardManager(DigitTokenizer()).time_limit.timeout_s == 60.0
    assert load_reward_manager(load_config(), DigitTokenizer()).time_limit.timeout_s == 60.0
    assert load_config(overrides=["reward_model.timeout_s=null"]).reward_model.timeout_s is None


def test_a_reward_that_sleeps_forever_fails_naming_the_sample_and_the_key(release) -> None:
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "9":
            release.wait(600)  # "forever": far past the deadline
        return 1.0

    config = load_config(overrides=["reward_model.timeout_s=0.5", "reward_model.error_policy=fail"])
    manager = load_reward_manager(config, DigitTokenizer(), compute_score=compute_score)
    start = time.monotonic()
    with pytest.raises(RewardFunctionError) as info:
        manager(make_batch([7, 9]))
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert message.startswith(
        "reward function did not return within reward_model.timeout_s=0.5 s for sample 1 "
    )
    assert "data_source='arithmetic'" in message and "response='9'" in message
    assert message.endswith(f"; if it is slow rather than stuck, {HINT}")
    assert "\n" not in message
    assert isinstance(info.value.__cause__, CallTimeout)


def test_the_deadline_counts_from_each_call_s_own_start() -> None:
    """The calls of a batch go to the helper thread together; each still gets the whole timeout."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(0.15)
        return 1.0

    manager = NaiveRewardManager(DigitTokenizer(), compute_score=compute_score, timeout_s=0.4)
    start = time.monotonic()
    assert manager(make_batch([1, 2, 3, 4, 5])).sum().item() == 5.0  # 0.75 s in all, 0.15 s each
    assert time.monotonic() - start >= 0.75 and manager.time_limit.abandoned == 0


def test_error_policy_fail_runs_no_call_after_the_first_failure() -> None:
    seen: list[str] = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        if solution_str == "2":
            raise ZeroDivisionError("boom")
        return 1.0

    manager = NaiveRewardManager(DigitTokenizer(), compute_score=compute_score, timeout_s=5)
    with pytest.raises(RewardFunctionError, match=r"raised ZeroDivisionError: boom for sample 1 "):
        manager(make_batch([1, 2, 3, 4]))
    assert seen == ["1", "2"]
    zeroing = NaiveRewardManager(
        DigitTokenizer(), compute_score=compute_score, timeout_s=5, error_policy="zero"
    )
    seen.clear()
    assert zeroing(make_batch([1, 2, 3, 4])).sum().item() == 3.0 and seen == ["1", "2", "3", "4"]


def test_a_reward_function_from_a_file_that_sleeps_times_out(tmp_path: Path) -> None:
    path = tmp_path / "slow.py"
    path.write_text(
        "import time\n\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    time.sleep(5)\n"
        "    return 1.0\n"
    )
    config = load_config(overrides=[f"custom_reward_function.path={path}", "reward_model.timeout_s=0.5"])
    with pytest.raises(
        RewardFunctionError, match=r"timeout_s=0\.5 s for sample 0 .*raise reward_model\.timeout_s"
    ):
        load_reward_manager(config, DigitTokenizer())(make_batch([7]))


def test_a_batched_reward_that_hangs_names_the_key(release) -> None:
    def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
        release.wait(600)
        return [1.0] * len(solution_strs)

    manager = BatchRewardManager(DigitTokenizer(), compute_score=compute_score, timeout_s=0.3)
    with pytest.raises(RewardBatchError) as info:
        manager(make_batch([7, 8]))
    assert "did not return within reward_model.timeout_s=0.3 s on a batch of 2 samples" in str(info.value)
    assert str(info.value).endswith(HINT)


def test_null_means_no_limit() -> None:
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(0.4)
        return 0.5

    config = load_config(overrides=["reward_model.timeout_s=null"])
    manager = load_reward_manager(config, DigitTokenizer(), compute_score=compute_score)
    assert manager.time_limit is None
    assert manager(make_batch([7])).sum().item() == 0.5


def test_a_scorer_with_a_signal_timeout_is_told_to_use_null() -> None:
    """signal.signal works only on the main thread; the deadline runs scorers on a helper thread."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))  # what a signal-based timeout does
        return 1.0

    with pytest.raises(RewardFunctionError, match=r"raised ValueError: .*set reward_model\.timeout_s=null"):
        NaiveRewardManager(DigitTokenizer(), compute_score=compute_score)(make_batch([7]))
    unlimited = NaiveRewardManager(DigitTokenizer(), compute_score=compute_score, timeout_s=None)
    assert unlimited(make_batch([7])).sum().item() == 1.0  # on the calling (main) thread


def test_the_errors_keep_their_hint_through_pickling() -> None:
    error = RewardFunctionError(
        "did not return", data_source="s", index=3, ground_truth=1, response="x", hint="raise it"
    )
    clone = pickle.loads(pickle.dumps(error))
    assert str(clone) == str(error) and clone.hint == "raise it" and clone.index == 3
    batch = pickle.loads(pickle.dumps(RewardBatchError("batched reward function f failed", "raise it")))
    assert str(batch) == "batched reward function f failed; raise it"
    timeout = pickle.loads(pickle.dumps(CallTimeout(0.5)))
    assert str(timeout) == "did not return within reward_model.timeout_s=0.5 s" and timeout.timeout_s == 0.5


# ------------------------------------------------------------------------------------------- validation metrics
def test_acc_is_reported_only_when_the_scorer_reports_it() -> None:
    metrics = compute_validation_metrics(["s", "s"], [0.5, 1.5], {}, n=1)
    assert metrics == {"val-core/s/reward/mean@1": 1.0}  # no acc made up from the score


def test_acc_and_reward_when_the_scorer_reports_acc() -> None:
    extra = {"acc": [True, False, 1.0, None], "pred": ["a", "b", "c", "d"]}
    metrics = compute_validation_metrics(["a", "a", "b", "b"], [2.0, 0.0, 1.0, 3.0], extra, n=4)
    assert metrics == {
        "val-aux/a/reward/mean@4": 1.0,  # acc is the core variable, the reward auxiliary (verl's naming)
        "val-core/a/acc/mean@4": 0.5,
        "val-aux/b/reward/mean@4": 2.0,
        "val-core/b/acc/mean@4": 1.0,  # the row without acc does not count
    }


def test_samples_zeroed_after_a_reward_error_count_as_wrong() -> None:
    extra = {"acc": [1.0, None, None], REWARD_ERROR_KEY: [False, True, False]}
    metrics = compute_validation_metrics(["a", "a", "b"], [1.0, 0.0, 0.0], extra)
    assert metrics["val-core/a/acc/mean@1"] == 0.5
    assert "val-core/b/acc/mean@1" not in metrics  # no acc reported for b


def test_the_arithmetic_scorer_reports_acc() -> None:
    assert default_compute_score("arithmetic", "7", 7) == {"score": 1.0, "acc": 1.0}
    out = NaiveRewardManager(DigitTokenizer())(make_batch([7, 8]), return_dict=True)
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0]
    metrics = compute_validation_metrics(["arithmetic"] * 2, [1.0, 0.0], out["reward_extra_info"])
    assert metrics == {"val-aux/arithmetic/reward/mean@1": 0.5, "val-core/arithmetic/acc/mean@1": 0.5}


def test_progress_bar_shows_acc_or_reward() -> None:
    assert validation_postfix(
        {"val-core/openai/gsm8k/acc/mean@1": 0.25, "val-core/x/reward/mean@1": 3.0}
    ) == {"val_acc": 0.25}
    assert validation_postfix({"val-core/x/reward/mean@2": 3.0, "critic/score/mean": 1.0}) == {
        "val_reward": 3.0
    }
    assert validation_postfix({"critic/score/mean": 1.0}) == {}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tracking_postfix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stderr", _Terminal())  # a progress bar only on a terminal
    tracker = Tracking(["console"], tmp_path, total_steps=2)
    try:
        tracker.log({"critic/score/mean": 0.5, "val-core/x/reward/mean@1": 0.75}, step=1)
        assert tracker.progress.postfix == "score=0.5, val_reward=0.75"
        tracker.log({"val-core/x/reward/mean@1": 0.75, "val-core/x/acc/mean@1": 0.25}, step=2)
        assert tracker.progress.postfix == "val_acc=0.25"
    finally:
        tracker.close()
