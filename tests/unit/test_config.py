"""Tests of verl.config: schema, recipes, overrides, error messages, validation and derived sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.config import (
    ConfigError,
    DerivedSizes,
    SFTConfig,
    TrainerConfig,
    as_file_list,
    derive_sizes,
    list_recipes,
    load_config,
    sft_overrides,
    suggest_key,
    to_container,
    to_yaml,
)
from verl.config.loader import schema_fields

ARR = "actor_rollout_ref"


@pytest.fixture(autouse=True)
def _verl_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERL_HOME", raising=False)


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------------ default recipe
def test_default_recipe_values() -> None:
    cfg = load_config()
    assert isinstance(cfg, DictConfig)
    assert OmegaConf.get_type(cfg) is TrainerConfig
    assert cfg.data.train_files == "~/.cache/verl/data/arithmetic/train.parquet"
    assert cfg.data.val_files == "~/.cache/verl/data/arithmetic/test.parquet"
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length, cfg.data.train_batch_size) == (
        32,
        8,
        16,
    )
    assert cfg.data.truncation == "error"
    assert cfg[ARR].model.path == "~/.cache/verl/models/tiny-arith-sft"
    actor = cfg[ARR].actor
    assert actor.optim.lr == pytest.approx(2e-4)
    assert actor.optim.lr_warmup_steps == 100
    assert (actor.ppo_mini_batch_size, actor.ppo_epochs, actor.clip_ratio) == (16, 1, 0.2)
    assert actor.loss_agg_mode == "token-mean" and actor.use_kl_loss is False
    assert (cfg[ARR].rollout.name, cfg[ARR].rollout.n, cfg[ARR].rollout.temperature) == ("fast", 8, 1.0)
    assert cfg[ARR].model.share_prompts is True
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.trainer.total_training_steps == 600 and cfg.trainer.test_freq == 100
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
    assert cfg.data.seed is None and cfg.trainer.torch_threads == 1


def test_verl_home_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_HOME", "/data/vh")
    cfg = load_config()
    assert cfg.data.train_files == "/data/vh/data/arithmetic/train.parquet"
    assert cfg[ARR].model.path == "/data/vh/models/tiny-arith-sft"


def test_list_recipes() -> None:
    assert {"grpo", "sft"} <= set(list_recipes())
    assert list_recipes() == sorted(list_recipes())


def test_every_recipe_loads() -> None:
    for name in list_recipes():
        schema = SFTConfig if name == "sft" else TrainerConfig
        load_config(name, schema=schema)


def test_sft_default() -> None:
    cfg = load_config(schema=SFTConfig)
    assert OmegaConf.get_type(cfg) is SFTConfig
    assert cfg.data.train_files == "~/.cache/verl/data/arithmetic/train.parquet"
    assert cfg.data.response_key == "reward_model.ground_truth"
    assert cfg.optim.lr == pytest.approx(3e-3) and cfg.optim.lr_scheduler_type == "cosine"
    assert cfg.optim.grad_clip == 1.0
    assert cfg.trainer.total_training_steps == 800
    # the schema default lr differs from the RL optimizer's
    assert OmegaConf.structured(SFTConfig).optim.lr == pytest.approx(1e-5)


# ------------------------------------------------------------------------------------------------ overrides
def test_overrides_of_each_type() -> None:
    cfg = load_config(
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
        ]
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
    cfg = load_config(path, overrides=[f"{ARR}.model.path=m"])
    assert cfg.custom_reward_function.reward_kwargs.bands.high == 2


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
        ("trainer.logger=console", "trainer.logger", "list of str", "'console'"),
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
    cfg = load_config(write(tmp_path, ""), overrides=[f"{ARR}.model.path=m", "data.train_batch_size=256"])
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


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("data.truncation=middle", "data.truncation must be one of error, left, right; got 'middle'"),
        (
            f"{ARR}.actor.loss_agg_mode=sum",
            "loss_agg_mode must be one of token-mean, seq-mean-token-sum, seq-mean-token-mean, "
            "seq-mean-token-sum-norm; got 'sum'",
        ),
        (f"{ARR}.rollout.n=0", f"{ARR}.rollout.n must be >= 1; got 0"),
        ("data.train_batch_size=12", "data.train_batch_size (12) must be divisible by"),
        (f"{ARR}.actor.optim.lr_scheduler_type=linear", "lr_scheduler_type must be one of constant, cosine"),
        (f"{ARR}.model.path=''", f"{ARR}.model.path is required"),
        (f"{ARR}.actor.ppo_micro_batch_size_per_gpu=3", "must divide the mini-batch of 128 samples"),
        ("data.train_files={a: 1}", "data.train_files must be a file path or a list of file paths"),
        ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type must be one of fixed, adaptive"),
    ],
)
def test_validation_errors(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert fragment in str(info.value)
    # check=False skips value validation (types and keys are still checked)
    load_config(overrides=[override], check=False)


def test_validation_reports_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.truncation=x", f"{ARR}.rollout.n=0"])
    assert "data.truncation" in str(info.value) and f"{ARR}.rollout.n" in str(info.value)


def test_sft_validation() -> None:
    with pytest.raises(ConfigError, match="model.path is required"):
        load_config(schema=SFTConfig, overrides=["model.path=''"])
    with pytest.raises(ConfigError, match="data.truncation must be one of"):
        load_config(schema=SFTConfig, overrides=["data.truncation=both"])


# ------------------------------------------------------------------------------------------------ backends
# Every key either has an effect on the selected backend or is refused with the backend that would read it.
@pytest.mark.parametrize(
    "key",
    [
        f"{ARR}.rollout.tensor_model_parallel_size=2",
        f"{ARR}.rollout.gpu_memory_utilization=0.6",
        f"{ARR}.rollout.max_num_seqs=64",
    ],
)
def test_inference_server_keys_are_refused_by_the_built_engines(key: str) -> None:
    name, _, value = key.partition("=")
    for engine in ("fast", "hf", "dummy"):
        with pytest.raises(ConfigError) as info:
            load_config(overrides=[key, f"{ARR}.rollout.name={engine}"])
        message = str(info.value)
        assert f"{name}={value} has no effect with rollout.name={engine}" in message
        assert "read by rollout.name=vllm or sglang, not built yet" in message
    # the schema default and verl's usual values are accepted
    load_config(overrides=[f"{ARR}.rollout.tensor_model_parallel_size=1", f"{ARR}.rollout.max_num_seqs=1024"])
    load_config(overrides=[f"{ARR}.rollout.gpu_memory_utilization=0.5"])


def test_calculate_log_probs_needs_an_engine_that_returns_them() -> None:
    assert load_config(overrides=[f"{ARR}.rollout.calculate_log_probs=true"])[ARR].rollout.name == "fast"
    with pytest.raises(
        ConfigError, match=r"calculate_log_probs=true has no effect with rollout.name=hf .*fast"
    ):
        load_config(overrides=[f"{ARR}.rollout.calculate_log_probs=true", f"{ARR}.rollout.name=hf"])


def test_rollout_engines_not_built_yet() -> None:
    with pytest.raises(
        ConfigError, match=f"{ARR}.rollout.name=vllm: not built yet; available: fast, hf, dummy"
    ):
        load_config(overrides=[f"{ARR}.rollout.name=vllm"])


def test_built_rollouts_match_the_registry() -> None:
    from verl.config.backends import BUILT_ROLLOUTS
    from verl.workers.rollout import ROLLOUT_REGISTRY

    assert set(BUILT_ROLLOUTS) == set(ROLLOUT_REGISTRY), "update verl/config/backends.py with the engines"


@pytest.mark.parametrize(
    ("strategy", "fragment"),
    [
        ("fsdp2", "fsdp2: not built yet; available: dp"),
        ("fsdp", "fsdp: not built yet"),
        ("ddpp", "ddpp: unknown strategy"),
    ],
)
def test_actor_strategy(strategy: str, fragment: str) -> None:
    assert load_config(overrides=[f"{ARR}.actor.strategy=dp"])[ARR].actor.strategy == "dp"
    with pytest.raises(ConfigError, match=f"{ARR}.actor.strategy={fragment}"):
        load_config(overrides=[f"{ARR}.actor.strategy={strategy}"])


def test_model_override_config_is_refused_unless_empty() -> None:
    assert len(load_config(overrides=[f"{ARR}.model.override_config={{}}"])[ARR].model.override_config) == 0
    with pytest.raises(ConfigError, match=r"override_config=\{'attention_dropout': 0.1\}: not built yet"):
        load_config(overrides=[f"{ARR}.model.override_config.attention_dropout=0.1"])


def test_a_second_tokenizer_is_refused() -> None:
    same = [f"{ARR}.model.path=m", "data.tokenizer=m", "critic.model.tokenizer_path=m"]
    load_config(overrides=same)  # verl writes the policy's path there: harmless
    with pytest.raises(ConfigError, match=r"data.tokenizer=other has no effect.*model.tokenizer_path"):
        load_config(overrides=["data.tokenizer=other"])
    with pytest.raises(ConfigError, match=r"critic.model.tokenizer_path=other has no effect"):
        load_config(overrides=["critic.model.tokenizer_path=other"])


def test_overlong_buffer_needs_the_dapo_manager() -> None:
    load_config(overrides=["reward_model.overlong_buffer.enable=true", "reward_model.reward_manager=dapo"])
    with pytest.raises(
        ConfigError, match=r"overlong_buffer.enable=true has no effect with .*reward_manager=naive"
    ):
        load_config(overrides=["reward_model.overlong_buffer.enable=true"])


def test_sft_validation_keys_not_built_yet() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(schema=SFTConfig, overrides=["data.val_files=v.parquet", "trainer.test_freq=5"])
    assert "data.val_files='v.parquet': not built yet" in str(info.value)
    assert "trainer.test_freq=5: not built yet" in str(info.value)


# ------------------------------------------------------------------------------------------------ derived sizes
def test_derive_sizes_default_recipe() -> None:
    # 16 prompts x n=8 = 128 samples; mini-batch 16 prompts = 128 samples; no micro-batch size -> whole mini-batch
    sizes = derive_sizes(load_config())
    assert sizes == DerivedSizes(
        prompts_per_step=16,
        samples_per_step=128,
        mini_batch_samples=128,
        micro_batch_samples=128,
        grad_accum_steps=1,
        optimizer_steps_per_rl_step=1,
        critic_mini_batch_samples=128,  # critic sizes default to the actor's
        critic_micro_batch_samples=128,
        critic_ppo_epochs=1,
    )


def cfg_overrides(cfg) -> list[str]:
    return [
        f"data.train_batch_size={cfg.data.train_batch_size}",
        f"{ARR}.rollout.n={cfg[ARR].rollout.n}",
        f"{ARR}.actor.ppo_mini_batch_size={cfg[ARR].actor.ppo_mini_batch_size}",
    ]


def test_derive_sizes_with_micro_batches_and_epochs() -> None:
    cfg = load_config(
        overrides=[
            "data.train_batch_size=32",
            f"{ARR}.rollout.n=4",
            f"{ARR}.actor.ppo_mini_batch_size=8",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8",
            f"{ARR}.actor.ppo_epochs=2",
        ]
    )
    sizes = derive_sizes(cfg)
    # 32 x 4 = 128 samples; mini 8 x 4 = 32 samples; 32 / 8 = 4 accumulation steps; 2 epochs x 32/8 = 8 steps
    assert sizes.prompts_per_step == 32
    assert sizes.samples_per_step == 128
    assert sizes.mini_batch_samples == 32
    assert sizes.micro_batch_samples == 8
    assert sizes.grad_accum_steps == 4
    assert sizes.optimizer_steps_per_rl_step == 8
    text = sizes.describe()
    assert "128" in text and "4 gradient-accumulation steps" in text and "2 epochs x 4 mini-batches" in text
    assert cfg.data.train_batch_size == 32  # nothing written back
    # the critic follows the actor unless set: mini 8 x 4 = 32 samples, whole mini-batch per pass, 2 epochs
    assert (sizes.critic_mini_batch_samples, sizes.critic_micro_batch_samples, sizes.critic_ppo_epochs) == (
        32,
        32,
        2,
    )
    critic = derive_sizes(
        load_config(
            overrides=[
                *cfg_overrides(cfg),
                "critic.ppo_mini_batch_size=16",
                "critic.ppo_micro_batch_size_per_gpu=16",
            ]
        )
    )
    # 16 prompts x 4 = 64 samples per critic step, 16 per pass
    assert (critic.critic_mini_batch_samples, critic.critic_micro_batch_samples) == (64, 16)
    with pytest.raises(ConfigError, match="critic.ppo_micro_batch_size_per_gpu"):
        derive_sizes(load_config(overrides=["critic.ppo_micro_batch_size_per_gpu=7"], check=False))
    with pytest.raises(AttributeError):
        sizes.grad_accum_steps = 1  # type: ignore[misc]


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
    assert as_file_list(load_config(overrides=["data.train_files=[x,y]"]).data.train_files) == ["x", "y"]
    with pytest.raises(ConfigError):
        as_file_list(3)


def test_sft_overrides_from_prepare_settings() -> None:
    settings = load_config().prepare.sft
    overrides = sft_overrides(settings)
    assert "optim.lr=0.003" in overrides and "trainer.total_training_steps=500" in overrides
    cfg = load_config(schema=SFTConfig, overrides=[*overrides, "optim.min_lr_ratio=0.1"])
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


def test_token_budgets_follow_the_actor_and_must_hold_the_longest_sequence() -> None:
    from verl.config import derive_sizes

    cfg = load_config(
        "grpo", [f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu=100"]
    )
    sizes = derive_sizes(cfg)
    # Unset rollout / ref / critic budgets follow the actor's; the value pass follows the critic update.
    assert sizes.actor_max_tokens == sizes.log_prob_max_tokens == sizes.ref_max_tokens == 100
    assert sizes.critic_max_tokens == sizes.critic_forward_max_tokens == 100
    assert "up to 100 tokens (use_dynamic_bsz)" in sizes.describe()
    cfg = load_config(
        "grpo",
        [f"{ARR}.rollout.log_prob_use_dynamic_bsz=true", f"{ARR}.rollout.log_prob_max_token_len_per_gpu=64"],
    )
    sizes = derive_sizes(cfg)
    assert sizes.actor_max_tokens is None and sizes.log_prob_max_tokens == 64 and sizes.ref_max_tokens is None
    # The grpo recipe's sequences reach 32 + 8 = 40 tokens: a 39-token budget could never hold one.
    with pytest.raises(ConfigError, match=r"rollout\.log_prob_max_token_len_per_gpu \(here 39.*= 40"):
        load_config(
            "grpo",
            [
                f"{ARR}.rollout.log_prob_use_dynamic_bsz=true",
                f"{ARR}.rollout.log_prob_max_token_len_per_gpu=39",
            ],
        )


def test_other_frameworks_key_names_suggest_verls():
    assert suggest_key("trainer.max_steps") == "trainer.total_training_steps"
    assert suggest_key("data.seq_len") == "data.max_prompt_length"
    assert suggest_key("data.batch_size") == "data.train_batch_size"
