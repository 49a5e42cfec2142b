"""A GRPO step through the real trainer with a rule reward and a reward model combined
(``reward_model.reward_fns=[correctness, {name: reward_model, weight: 0.5}]``): the terms are logged, and the
score is their weighted sum. Once in-process (with validation), once on Ray with the reward split over two reward
workers (the reward model loaded in each of their processes)."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_rl_steps import small_config
from tests.unit.test_reward_model import save_tiny_reward_model
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

TERMS = "reward_model.reward_fns=[correctness,{name: reward_model, weight: 0.5}]"


def run(tiny_model_dir, arithmetic_files, tmp_path, *extra: str) -> tuple[dict, dict]:
    rm = save_tiny_reward_model(tmp_path / "rm")
    config = small_config(
        tiny_model_dir, arithmetic_files, tmp_path / "run",
        "reward_model.enable=true", f"reward_model.model.path={rm}", TERMS,
        "reward_model.micro_batch_size_per_gpu=3", "trainer.total_training_steps=1",
        "trainer.val_before_train=false", "data.val_max_samples=4", *extra,
    )  # fmt: skip
    trainer = RLTrainer(config)
    try:
        summary = trainer.fit()
    finally:
        trainer.shutdown()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return records[-1], summary["val_after"]


def check(record: dict) -> None:
    correctness, rm = record["reward_extra/correctness/mean"], record["reward_extra/rm_score/mean"]
    assert 0.0 <= correctness <= 1.0 and record["reward_extra/acc/mean"] == correctness
    # GRPO has no KL in the reward: the mean score is the mean of the weighted sum, term by term
    assert record["critic/score/mean"] == pytest.approx(correctness + 0.5 * rm, abs=1e-5)
    assert rm != 0.0


def test_grpo_step_with_rule_and_model_rewards(tiny_model_dir, arithmetic_files, tmp_path, one_torch_thread):
    record, val = run(tiny_model_dir, arithmetic_files, tmp_path)
    check(record)
    assert {"val-core/arithmetic/acc/mean@1", "val-aux/arithmetic/rm_score/mean@1"} <= val.keys()
    assert {"val-aux/arithmetic/reward/mean@1", "val-aux/arithmetic/correctness/mean@1"} <= val.keys()


def test_grpo_step_with_rule_and_model_rewards_on_ray(tiny_model_dir, arithmetic_files, tmp_path):
    ray = pytest.importorskip("ray")
    from verl.single_controller.ray import ensure_ray

    ensure_ray()
    try:
        record, _ = run(
            tiny_model_dir, arithmetic_files, tmp_path, "trainer.backend=ray", "reward_model.num_workers=2",
            "trainer.torch_threads=1", "data.val_files=null",  # no validation: the training step is the check
        )  # fmt: skip
        check(record)
    finally:
        ray.shutdown()


def test_seed_reward_model_keyword_scores_with_the_model(
    tiny_model_dir, arithmetic_files, tmp_path, one_torch_thread
):
    """Seed 003's ``RLTrainer(config, reward_model="path/to/reward-model")``: the reward model's score is the
    reward (it replaces the rule score, as ``reward_model.enable=true`` does in verl)."""
    rm = save_tiny_reward_model(tmp_path / "rm")
    config = small_config(
        tiny_model_dir, arithmetic_files, tmp_path / "run",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "data.val_max_samples=4",
    )  # fmt: skip
    trainer = RLTrainer(config, reward_model=str(rm))
    try:
        assert trainer.config.reward_model.enable and trainer.config.reward_model.model.path == str(rm)
        trainer.fit()
    finally:
        trainer.shutdown()
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["reward_extra/rm_score/mean"] != 0.0
    assert record["critic/score/mean"] == pytest.approx(record["reward_extra/rm_score/mean"], abs=1e-5)
