"""Recipes: the built-in algorithm recipes and recipes building on a base recipe."""

import pytest

from verl.config import ConfigError, load_config

ARR = "actor_rollout_ref"


def test_recipe_builds_on_a_base(tmp_path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text("base: grpo\nalgorithm:\n  adv_estimator: rloo\n")
    grandchild = tmp_path / "grandchild.yaml"
    grandchild.write_text("base: child.yaml\ntrainer:\n  seed: 7\n")
    cfg = load_config(str(grandchild))
    assert cfg.algorithm.adv_estimator == "rloo" and cfg.trainer.seed == 7
    assert cfg.data.train_batch_size == load_config("grpo").data.train_batch_size  # inherited from grpo
    loop = tmp_path / "loop.yaml"
    loop.write_text("base: loop.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_config(str(loop))
    typo = tmp_path / "typo.yaml"
    typo.write_text("base: grpo\nalgorithm:\n  adv_estimatr: rloo\n")
    with pytest.raises(ConfigError, match="typo.yaml.*algorithm.adv_estimator"):
        load_config(str(typo))


def test_builtin_algorithm_recipes() -> None:
    assert load_config("ppo").algorithm.adv_estimator == "gae"
    drgrpo = load_config("drgrpo")
    assert drgrpo.algorithm.norm_adv_by_std_in_grpo is False
    assert drgrpo[ARR].actor.loss_agg_mode == "seq-mean-token-sum-norm"
    assert load_config("gspo")[ARR].actor.policy_loss.loss_mode == "gspo"
