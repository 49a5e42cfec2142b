"""Tests of verl.config key and type errors: unknown keys with a suggestion (from overrides and YAML files),
values of the wrong type, malformed overrides and interpolations, and other frameworks' key names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _config_helpers import ARR, _verl_home, write  # noqa: F401  (_verl_home: autouse fixture)

from verl.config import ConfigError, SFTConfig, load_config, suggest_key


# ------------------------------------------------------------------------------------------------ unknown keys
@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("data.train_batch_szie", "data.train_batch_size"),
        (f"{ARR}.actor.lrr", f"{ARR}.actor.optim.lr"),  # leaf-only match in a child section
        (f"{ARR}.actor.lr", f"{ARR}.actor.optim.lr"),
        ("trainer.lr", f"{ARR}.actor.optim.lr"),  # right leaf, wrong section
        ("data.total_epochs", "trainer.total_epochs"),
        (f"{ARR}.rollout.ppo_epochs", f"{ARR}.actor.ppo_epochs"),
        ("data.train.batch_size", "data.train_batch_size"),  # dot instead of underscore
        (f"{ARR}.rollot.n", f"{ARR}.rollout.n"),  # typo in a section name
        (f"{ARR}.actr", f"{ARR}.actor"),
        (f"{ARR}.rollout.temp", f"{ARR}.rollout.temperature"),  # abbreviation
        ("trainer.total_steps", "trainer.total_training_steps"),  # whole words
        (f"{ARR}.actor.kl_coef", f"{ARR}.actor.kl_loss_coef"),  # nearby section wins over a far exact leaf
        ("algorithm.kl_coef", "algorithm.kl_ctrl.kl_coef"),
        (f"{ARR}.actor.micro_batch_size", f"{ARR}.actor.ppo_micro_batch_size_per_gpu"),
        ("rollout.n", f"{ARR}.rollout.n"),  # missing top-level section
        ("model.path", f"{ARR}.model.path"),
        ("trainer.loggers", "trainer.logger"),
        ("algorithm.adv_estimater", "algorithm.adv_estimator"),
    ],
)
def test_unknown_override_key_suggests(typo: str, suggestion: str) -> None:
    assert suggest_key(typo) == suggestion
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{typo}=1"])
    msg = str(info.value)
    assert f"unknown config key '{typo}'" in msg
    assert f"did you mean '{suggestion}'?" in msg
    assert f"override '{typo}=1'" in msg
    assert "\n" not in msg


def test_unknown_key_without_close_match_lists_section_keys() -> None:
    assert suggest_key("data.foo") is None
    with pytest.raises(
        ConfigError, match=r"unknown config key 'data\.foo'; valid keys under 'data': tokenizer, "
    ):
        load_config(overrides=["data.foo=1"])
    with pytest.raises(ConfigError, match="valid top-level keys: data, actor_rollout_ref"):
        load_config(overrides=["xyz=1"])


def test_suggestions_for_sft_schema() -> None:
    assert suggest_key("optim.lrr", SFTConfig) == "optim.lr"
    assert suggest_key("data.max_len", SFTConfig) == "data.max_length"
    with pytest.raises(ConfigError, match="did you mean 'trainer.total_training_steps'"):
        load_config(schema=SFTConfig, overrides=["trainer.total_training_step=3"])


def test_sub_key_of_a_leaf_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"'data\.max_prompt_length' expects int, not a mapping"):
        load_config(overrides=["data.max_prompt_length.x=3"])


def test_unknown_key_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, f"data:\n  train_batch_size: 8\n{ARR}:\n  actor:\n    lrr: 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg
    assert f"unknown config key '{ARR}.actor.lrr'" in msg and f"did you mean '{ARR}.actor.optim.lr'" in msg


def test_section_given_a_scalar(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'data' is a section"):
        load_config(overrides=["data=3"])
    path = write(tmp_path, "trainer: 5\n")
    with pytest.raises(ConfigError, match=f"{path}: 'trainer' is a section"):
        load_config(path)


# ------------------------------------------------------------------------------------------------ wrong types
@pytest.mark.parametrize(
    ("override", "key", "expected", "got"),
    [
        ("data.train_batch_size=abc", "data.train_batch_size", "int", "'abc'"),
        (f"{ARR}.rollout.n=2.5", f"{ARR}.rollout.n", "int", "2.5"),
        (f"{ARR}.actor.optim.lr=fast", f"{ARR}.actor.optim.lr", "float", "'fast'"),
        (f"{ARR}.actor.use_kl_loss=maybe", f"{ARR}.actor.use_kl_loss", "bool", "'maybe'"),
        (f"{ARR}.actor.optim.betas=[a,1]", f"{ARR}.actor.optim.betas", "list of float", "['a', 1]"),
        ("data.seed=1.5", "data.seed", "int or null", "1.5"),
        ("trainer.seed=null", "trainer.seed", "int", "None"),
    ],
)
def test_wrong_type(override: str, key: str, expected: str, got: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    msg = str(info.value)
    assert f"'{key}' expects {expected}, got {got}" in msg
    assert "\n" not in msg


def test_wrong_type_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "data:\n  max_prompt_length: long\n")
    with pytest.raises(ConfigError, match=f"{path}: 'data.max_prompt_length' expects int, got 'long'"):
        load_config(path)


def test_malformed_override() -> None:
    with pytest.raises(ConfigError, match="malformed override 'trainer.seed': expected key=value"):
        load_config(overrides=["trainer.seed"])
    with pytest.raises(ConfigError, match="malformed override"):
        load_config(overrides=["=3"])


def test_bad_interpolation() -> None:
    with pytest.raises(ConfigError, match=r"cannot resolve .*trainer\.nope"):
        load_config(overrides=["trainer.project_name=${trainer.nope}"])


def test_other_frameworks_key_names_suggest_verls():
    assert suggest_key("trainer.max_steps") == "trainer.total_training_steps"
    assert suggest_key("data.seq_len") == "data.max_prompt_length"
    assert suggest_key("data.batch_size") == "data.train_batch_size"
