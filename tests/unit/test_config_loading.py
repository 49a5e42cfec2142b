"""Tests of verl.config loading: the default and bundled recipes, overrides of each type, recipes by path,
the read-only result, and the helpers around it (YAML round trip, file lists, SFT overrides, schema fields).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _config_helpers import ARR, _verl_home, write  # noqa: F401  (_verl_home: autouse fixture)
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.config import (
    ConfigError,
    SFTConfig,
    TrainerConfig,
    as_file_list,
    list_recipes,
    load_config,
    sft_overrides,
    to_container,
    to_yaml,
)
from verl.config.loader import schema_fields
from verl.trainer.prepare import resolve_inputs


# ------------------------------------------------------------------------------------------------ default recipe
def test_default_recipe_values() -> None:
    cfg = load_config()
    assert isinstance(cfg, DictConfig)
    assert OmegaConf.get_type(cfg) is TrainerConfig
    # the data and the model are built by prepare (keyed artifacts under prepare.cache_dir)
    assert cfg.data.train_files is None and cfg.data.val_files is None and cfg[ARR].model.path == ""
    assert cfg.prepare.cache_dir == "~/.cache/verl"
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length, cfg.data.train_batch_size) == (
        32,
        8,
        16,
    )
    assert cfg.data.truncation == "error"
    actor = cfg[ARR].actor
    assert actor.optim.lr == pytest.approx(1e-4)
    assert actor.optim.lr_warmup_steps == 300
    assert (actor.ppo_mini_batch_size, actor.ppo_epochs, actor.clip_ratio) == (16, 1, 0.2)
    assert actor.loss_agg_mode == "token-mean" and actor.use_kl_loss is False
    assert (cfg[ARR].rollout.name, cfg[ARR].rollout.n, cfg[ARR].rollout.temperature) == ("fast", 8, 1.0)
    assert cfg[ARR].model.share_prompts is True
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.trainer.total_training_steps == 1200 and cfg.trainer.test_freq == 100
    assert cfg.prepare.seed == 5 and cfg.prepare.sft.torch_threads == 1  # one warm start (the shipped one)
    assert list(cfg.trainer.logger) == ["console", "jsonl"]
    assert cfg.trainer.experiment_name == "grpo-arithmetic"
    assert cfg.trainer.default_local_dir == "outputs/verl/grpo-arithmetic"  # interpolation resolved
    assert cfg.prepare.enable is True and cfg.prepare.task == "arithmetic"
    assert dict(cfg.prepare.task_kwargs) == {"max_operand": 99, "holdout_frac": 0.2, "seed": 0}
    assert cfg.prepare.tiny_model.arch == "qwen2" and cfg.prepare.tiny_model.hidden_size == 128
    assert cfg.prepare.sft.lr == pytest.approx(3e-3) and cfg.prepare.sft.total_training_steps == 500
    # schema defaults not set by the recipe
    assert cfg[ARR].rollout.val_kwargs.temperature == 0.0 and cfg[ARR].rollout.val_kwargs.do_sample is False
    assert cfg[ARR].actor.policy_loss.loss_mode == "vanilla"
    assert cfg.algorithm.kl_ctrl.kl_coef == pytest.approx(0.001)
    assert cfg.data.seed is None and cfg.trainer.torch_threads == "auto"


def test_verl_home_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_HOME", "/data/vh")
    cfg = resolve_inputs(load_config())
    assert cfg.prepare.cache_dir == "/data/vh"
    assert cfg.data.train_files.startswith("/data/vh/artifacts/arithmetic-data-")
    assert cfg[ARR].model.path.startswith("/data/vh/artifacts/tiny-model-sft-")


def test_list_recipes() -> None:
    assert {"grpo", "sft"} <= set(list_recipes())
    assert list_recipes() == sorted(list_recipes())


def test_every_recipe_loads() -> None:
    for name in list_recipes():
        if "sft" in name:  # `verl sft` fine-tunes the user's model on the user's data: both must be given
            load_config(name, ["model.path=m", "data.train_files=t.parquet"], schema=SFTConfig)
        elif name == "grpo_verl":  # verl's defaults for the user's model: it must be given
            load_config(name, ["actor_rollout_ref.model.path=m"])
        elif name.startswith("distill"):  # the teacher is the user's to give
            load_config(name, ["distillation.teacher_models.teacher_model.model_path=t"])
        else:
            load_config(name)


def test_sft_default() -> None:
    with pytest.raises(ConfigError, match="model.path is required"):
        load_config(schema=SFTConfig)
    cfg = load_config(overrides=["model.path=m", "data.train_files=t.parquet"], schema=SFTConfig)
    assert OmegaConf.get_type(cfg) is SFTConfig
    assert cfg.data.response_key == "reward_model.ground_truth"
    assert cfg.optim.lr == pytest.approx(3e-3) and cfg.optim.lr_scheduler_type == "cosine"
    assert cfg.optim.grad_clip == 1.0
    assert cfg.trainer.total_training_steps == 800
    # the schema default lr differs from the RL optimizer's
    assert OmegaConf.structured(SFTConfig).optim.lr == pytest.approx(1e-5)


# ------------------------------------------------------------------------------------------------ overrides
def test_overrides_of_each_type() -> None:
    cfg = load_config(
        "grpo",
        overrides=[
            "data.train_batch_size=16",  # int
            f"{ARR}.actor.optim.lr=3e-5",  # float, short exponent form
            f"{ARR}.actor.use_kl_loss=true",  # bool
            "trainer.logger=[console]",  # list
            f"{ARR}.rollout.val_kwargs.n=4",  # nested
            "algorithm.kl_ctrl.type=adaptive",
            "data.train_files=[a.parquet,b.parquet]",  # Any: list
            "trainer.experiment_name=exp1",
            "trainer.total_training_steps=null",
        ],
    )
    assert cfg.data.train_batch_size == 16
    assert cfg[ARR].actor.optim.lr == pytest.approx(3e-5) and isinstance(cfg[ARR].actor.optim.lr, float)
    assert cfg[ARR].actor.use_kl_loss is True
    assert list(cfg.trainer.logger) == ["console"]
    assert cfg[ARR].rollout.val_kwargs.n == 4
    assert cfg.algorithm.kl_ctrl.type == "adaptive"
    assert list(cfg.data.train_files) == ["a.parquet", "b.parquet"]
    assert cfg.trainer.default_local_dir == "outputs/verl/exp1"  # interpolation sees the override
    assert cfg.trainer.total_training_steps is None


def test_later_override_wins_and_plus_prefix() -> None:
    cfg = load_config(overrides=["trainer.seed=3", "+trainer.seed=4"])
    assert cfg.trainer.seed == 4


def test_int_given_to_float_field_is_float() -> None:
    cfg = load_config(overrides=[f"{ARR}.actor.clip_ratio=1"])
    assert cfg[ARR].actor.clip_ratio == 1.0


def test_free_form_dicts_accept_any_keys(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            "prepare.task_kwargs.brand_new=5",
            "prepare.tiny_model.rope_theta=10000.0",
            "prepare.sft.whatever.nested=[1,2]",
            "custom_reward_function.reward_kwargs.scale=0.1",
        ]
    )
    assert cfg.prepare.task_kwargs.brand_new == 5
    assert cfg.prepare.task_kwargs.max_operand == 99  # merged, not replaced
    assert cfg.prepare.tiny_model.rope_theta == 10000.0
    assert list(cfg.prepare.sft.whatever.nested) == [1, 2]
    assert cfg.custom_reward_function.reward_kwargs.scale == 0.1
    path = write(tmp_path, "custom_reward_function:\n  reward_kwargs:\n    bands: {low: 1, high: 2}\n")
    # schema defaults: adv_estimator=grpo needs a group of responses per prompt
    cfg = load_config(path, overrides=[f"{ARR}.model.path=m", f"{ARR}.rollout.n=2"])
    assert cfg.custom_reward_function.reward_kwargs.bands.high == 2


# ------------------------------------------------------------------------------------------------ recipes
def test_unknown_recipe_lists_available() -> None:
    with pytest.raises(ConfigError, match=r"unknown recipe 'grpoo'; available recipes: .*grpo.*sft"):
        load_config("grpoo")


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("no/such/file.yaml")


def test_recipe_by_path(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "data:\n  train_files: [x.parquet]\n  train_batch_size: 4\n"
        f"{ARR}:\n  model:\n    path: some/model\n  actor:\n    ppo_mini_batch_size: 2\n"
        "algorithm:\n  adv_estimator: reinforce_plus_plus\n"  # the schema's grpo needs rollout.n >= 2
        "trainer:\n  experiment_name: mine-${data.train_batch_size}\n",
    )
    for given in (path, str(path)):
        cfg = load_config(given, overrides=["trainer.seed=7"])
        assert cfg.data.train_batch_size == 4 and cfg[ARR].actor.ppo_mini_batch_size == 2
        assert cfg[ARR].model.path == "some/model"
        assert cfg.trainer.experiment_name == "mine-4" and cfg.trainer.seed == 7
        assert cfg[ARR].rollout.n == 1  # schema default: nothing from the grpo recipe
    assert load_config("grpo.yaml").trainer.experiment_name == "grpo-arithmetic"


def test_empty_yaml_uses_schema_defaults(tmp_path: Path) -> None:
    overrides = [f"{ARR}.model.path=m", "data.train_batch_size=256", f"{ARR}.rollout.n=2"]  # grpo: n >= 2
    cfg = load_config(write(tmp_path, ""), overrides=overrides)
    assert cfg.data.max_prompt_length == 512 and cfg[ARR].actor.ppo_mini_batch_size == 256


# ------------------------------------------------------------------------------------------------ read-only
def test_config_is_read_only() -> None:
    cfg = load_config()
    with pytest.raises(OmegaConfBaseException):
        cfg.data.train_batch_size = 3
    with pytest.raises(OmegaConfBaseException):
        cfg.trainer.logger.append("wandb")
    with pytest.raises(OmegaConfBaseException):
        cfg.prepare.task_kwargs.new = 1
    with pytest.raises(OmegaConfBaseException):
        cfg.data.not_a_key  # noqa: B018


# ------------------------------------------------------------------------------------------------ helpers
def test_yaml_and_container_round_trip() -> None:
    cfg = load_config()
    plain = to_container(cfg)
    assert isinstance(plain, dict) and plain["trainer"]["logger"] == ["console", "jsonl"]
    text = to_yaml(cfg)
    assert "train_batch_size: 16" in text and "${" not in text
    again = OmegaConf.merge(OmegaConf.structured(TrainerConfig), OmegaConf.create(text))
    assert again == cfg


def test_as_file_list() -> None:
    assert as_file_list(None) == []
    assert as_file_list("a.parquet") == ["a.parquet"]
    assert as_file_list(["a", "b"]) == ["a", "b"]
    assert as_file_list(load_config("grpo", overrides=["data.train_files=[x,y]"]).data.train_files) == [
        "x",
        "y",
    ]
    with pytest.raises(ConfigError):
        as_file_list(3)


def test_sft_overrides_from_prepare_settings() -> None:
    settings = load_config().prepare.sft
    overrides = sft_overrides(settings)
    assert "optim.lr=0.003" in overrides and "trainer.total_training_steps=500" in overrides
    cfg = load_config(
        schema=SFTConfig,
        overrides=[*overrides, "optim.min_lr_ratio=0.1", "model.path=m", "data.train_files=t.parquet"],
    )
    assert cfg.data.train_batch_size == 64 and cfg.optim.lr_warmup_steps == 50
    assert cfg.optim.lr_scheduler_type == "cosine" and cfg.optim.min_lr_ratio == pytest.approx(0.1)
    assert sft_overrides({"model.path": "a b/c"}) == ['model.path="a b/c"']
    with pytest.raises(ConfigError, match="did you mean 'optim.lr'"):
        sft_overrides({"lrr": 1.0})


def test_schema_fields_cover_verl_names() -> None:
    fields = schema_fields(TrainerConfig)
    for key in [
        "data.reward_fn_key",
        f"{ARR}.model.use_remove_padding",
        f"{ARR}.actor.ppo_max_token_len_per_gpu",
        f"{ARR}.actor.policy_loss.loss_mode",
        f"{ARR}.actor.clip_ratio_c",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
        "algorithm.norm_adv_by_std_in_grpo",
        "custom_reward_function.name",
        "custom_reward_function.reward_kwargs",
        "reward_model.reward_manager",
        "trainer.critic_warmup",
    ]:
        assert key in fields, key
    assert fields["prepare.task_kwargs"].freeform and not fields["data.train_files"].freeform


def test_a_bare_word_for_a_list_of_strings_key_is_that_list():
    """verl's quick start passes `trainer.logger=console`; a list stays a list, a typo is still named."""
    assert list(load_config(None, ["trainer.logger=console"]).trainer.logger) == ["console"]
    assert list(load_config(None, ["trainer.logger=[console,jsonl]"]).trainer.logger) == ["console", "jsonl"]
    with pytest.raises(ConfigError, match="got 'wandbb' \\(did you mean 'wandb'\\?\\)"):
        load_config(None, ["trainer.logger=wandbb"])


def test_a_broken_interpolation_is_a_config_error_naming_the_key() -> None:
    # OmegaConf parses a value that starts like ${...} when the config is built (found by the CLI fuzzer).
    with pytest.raises(
        ConfigError, match=r"custom_reward_function.name: not a valid \$\{\.\.\.\} interpolation"
    ):
        load_config("grpo", ["custom_reward_function.name=${a x}"])
