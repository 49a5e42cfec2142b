"""Seed 003's keyword arguments to ``RLTrainer``, as config keys (`verl.trainer.seed_api`)."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config
from verl.trainer.seed_api import apply_seed_arguments


def test_checkpoint_config_sets_verl_checkpoint_keys() -> None:
    config, _ = apply_seed_arguments(
        load_config("grpo", []),
        None,
        checkpoint_config={"save_interval": 100, "keep_last_k": 3, "async_save": True},
    )
    trainer = config.trainer
    assert trainer.save_freq == 100 and trainer.async_save is True
    assert trainer.max_actor_ckpt_to_keep == 3 and trainer.max_critic_ckpt_to_keep == 3


def test_an_unknown_checkpoint_config_key_names_the_nearest() -> None:
    with pytest.raises(ConfigError, match="'save_intervall'.*did you mean 'save_interval'"):
        apply_seed_arguments(load_config("grpo", []), None, checkpoint_config={"save_intervall": 10})


def test_a_reward_model_path_enables_the_reward_model(tmp_path) -> None:
    config, compute_score = apply_seed_arguments(load_config("grpo", []), None, reward_model=str(tmp_path))
    assert compute_score is None
    assert config.reward_model.enable is True and config.reward_model.model.path == str(tmp_path)


def test_a_scorer_name_is_a_scoring_function_not_a_model() -> None:
    config, compute_score = apply_seed_arguments(load_config("grpo", []), None, reward_model="arithmetic")
    assert config.reward_model.enable is False
    assert compute_score("arithmetic", "12", "12")["score"] == 1.0


def test_a_near_miss_of_a_scorer_name_is_refused_as_a_typo() -> None:
    with pytest.raises(ConfigError, match="did you mean the scorer 'gsm8k'"):
        apply_seed_arguments(load_config("grpo", []), None, reward_model="gsm8kk")


def test_a_reward_model_and_a_scoring_function_together_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="pass reward_model or compute_score, not both"):
        apply_seed_arguments(load_config("grpo", []), lambda *a, **k: 0.0, reward_model=str(tmp_path))


def test_a_reward_model_path_with_a_custom_reward_function_is_refused(tmp_path) -> None:
    config = load_config("grpo", [f"custom_reward_function.path={tmp_path / 'judge.py'}"])
    with pytest.raises(ConfigError, match="with custom_reward_function.path set"):
        apply_seed_arguments(config, None, reward_model=str(tmp_path))


def test_checkpoint_config_must_be_a_dict() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint_config=\.\.\.\) must be a dict of save_interval"):
        apply_seed_arguments(load_config("grpo", []), None, checkpoint_config=[("save_interval", 1)])
