"""Recipes: the built-in algorithm recipes and recipes building on a base recipe."""

import pytest
from omegaconf import OmegaConf

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


def command_line(overrides: list[str]):
    """The config `verl run <overrides>` (no --config) trains with."""
    from verl.config import TrainerConfig
    from verl.config.loader import default_recipe

    return load_config(default_recipe(TrainerConfig, overrides)[0], overrides)


def test_default_recipe_is_verls_defaults_when_the_model_or_data_are_the_users() -> None:
    demo = command_line([])  # tuned for its tiny model
    assert demo[ARR].actor.optim.lr == 1.0e-4 and demo.data.max_prompt_length == 32
    verl_defaults = load_config("ppo_trainer")
    model = f"{ARR}.model.path=/my/model"
    for given in ([model], [model, "data.train_files=/my/train.parquet", "+data.val_files=/v.parquet"]):
        cfg = command_line(given)
        assert cfg.algorithm.adv_estimator == "grpo" and cfg[ARR].rollout.n == 5
        assert cfg[ARR].actor.use_kl_loss is True and cfg[ARR].actor.kl_loss_coef == 0.001
        # Nothing of the demo's tuning: every tuned key is verl's default again.
        for key in (
            "data.max_prompt_length",
            "data.max_response_length",
            "data.train_batch_size",
            "data.truncation",
            f"{ARR}.actor.optim.lr",
            f"{ARR}.actor.optim.lr_warmup_steps",
            f"{ARR}.actor.ppo_mini_batch_size",
            f"{ARR}.model.attn_implementation",
            "trainer.torch_threads",
            "trainer.total_training_steps",
        ):
            assert OmegaConf.select(cfg, key) == OmegaConf.select(verl_defaults, key), key
    # Data alone: no tiny model is built for the user's data (its tokenizer knows arithmetic only).
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path is required"):
        command_line(["data.train_files=/my/train.parquet"])
    # An explicit recipe wins, deleting a key does not count as giving it, and the Python API's default
    # (load_config(None), verl.TrainerConfig) stays the demo.
    assert load_config("grpo", [model]).data.max_prompt_length == 32
    assert command_line(["~data.val_files"]).data.max_prompt_length == 32
    assert load_config(None, [model]).data.max_prompt_length == 32


def test_recipe_lines_say_which_recipe_and_why() -> None:
    from verl.command_line import recipe_lines

    overrides = [f"{ARR}.model.path=/my/model"]
    head, settings = recipe_lines(None, overrides, command_line(overrides))
    assert head.startswith("recipe: grpo_verl (actor_rollout_ref.model.path given")
    assert "lr 1e-06" in settings and "prompt tokens 512" in settings and "torch threads auto" in settings
    head, settings = recipe_lines(None, [], load_config(None))
    assert head.startswith("recipe: grpo (the demo") and "torch threads auto" in settings
    assert recipe_lines("ppo_trainer", [], load_config("ppo_trainer"))[0] == "recipe: ppo_trainer"


def test_headline_says_before_and_after_rl_or_that_nothing_was_trained() -> None:
    from verl.cli_commands import _headline_line

    key = "val-core/t/acc/mean@1"
    assert (
        _headline_line(key, 0.39, 0.82) == f"held-out {key}: before RL 39.0% -> after RL 82.0% (+43.0 points)"
    )
    assert _headline_line(key, 0.005, None, trained=False) == (
        f"held-out {key}: 0.5% (trainer.val_only: no training)"
    )
