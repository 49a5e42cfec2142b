"""Issue 41: the SmolLM2 recipe's rows (reasoning-gym basic_arithmetic) have the plain answer as
``reward_model.ground_truth``, as verl's rows do, so a reward function comparing strings scores them; the task
record the built-in scorer needs is in ``extra_info``, and its scores are what they were."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

pytest.importorskip("reasoning_gym")

from verl.config import load_config  # noqa: E402
from verl.data.tasks import TASKS  # noqa: E402
from verl.workers.reward.scorers import default_compute_score  # noqa: E402
from verl.workers.reward.scorers import reasoning_gym as rg_scorer  # noqa: E402


@pytest.fixture(scope="module")
def recipe_rows(tmp_path_factory) -> list[dict[str, Any]]:
    """Rows the smollm2_arithmetic recipe's task writes (its task_kwargs, fewer rows)."""
    prep = load_config("smollm2_arithmetic").prepare
    assert prep.task == "reasoning_gym"
    kwargs = {**OmegaConf.to_container(prep.task_kwargs, resolve=True), "size": 12, "test_size": 4}
    train, test = TASKS[prep.task](tmp_path_factory.mktemp("smollm2-data"), **kwargs)
    return pq.read_table(train).to_pylist() + pq.read_table(test).to_pylist()


def verl_style_reward(data_source: str, solution_str: str, ground_truth: str, extra_info=None) -> float:
    """A reward function as verl users write them: the response's last token against the ground truth."""
    return float(solution_str.strip().split()[-1] == ground_truth)


def test_ground_truth_is_the_plain_answer(recipe_rows) -> None:
    for row in recipe_rows:
        truth = row["reward_model"]["ground_truth"]
        a, b = (int(n) for n in row["extra_info"]["question"].split("Calculate ")[1].rstrip(".").split(" + "))
        assert truth == str(a + b) == row["extra_info"]["answer"]
        record = json.loads(row["extra_info"][rg_scorer.TASK_KEY])
        assert record["task"] == "basic_arithmetic" and record["answer_format"] == "number"
        assert record["entry"]["answer"] == truth
        assert verl_style_reward(row["data_source"], f"The sum is {truth}", truth) == 1.0


def score(row: dict[str, Any], response: str) -> dict[str, float]:
    """The built-in scorer as the reward manager calls it: the row's ground truth and extra_info."""
    return default_compute_score(
        row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"]
    )


def test_the_built_in_scorer_scores_right_1_and_wrong_0(recipe_rows) -> None:
    for row in recipe_rows:
        truth, wrong = row["reward_model"]["ground_truth"], str(int(row["reward_model"]["ground_truth"]) + 1)
        assert score(row, truth) == {"score": 1.0, "acc": 1.0}
        assert score(row, f"so the answer is {truth}") == {"score": 1.0, "acc": 1.0}
        assert score(row, wrong) == {"score": 0.0, "acc": 0.0}
        assert score(row, "no idea") == {"score": 0.0, "acc": 0.0}
        # identical to the rows written before, whose ground truth was the record itself
        legacy = row["extra_info"][rg_scorer.TASK_KEY]
        for response in (truth, wrong, "no idea"):
            assert default_compute_score(row["data_source"], response, legacy) == score(row, response)


def test_a_task_without_a_single_answer_gets_an_empty_ground_truth() -> None:
    """graph_color accepts any valid colouring: there is no one answer to compare with."""
    from verl.data.preprocess import generate_splits

    row = generate_splits("graph_color", 1, 0, test_size=0).rows["train"][0]
    assert row["reward_model"]["ground_truth"] == "" and row["extra_info"]["answer"] is None
    assert json.loads(row["extra_info"][rg_scorer.TASK_KEY])["task"] == "graph_color"
