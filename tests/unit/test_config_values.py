"""Tests of the numeric ranges of verl.config validation: every bad value is a ConfigError naming the full key,
its value and the allowed range; the boundary values load. Also that the rollout honours do_sample (greedy
only with do_sample=false) and that the group estimators need rollout.n >= 2.

Choices, file lists and batch divisibility are in test_config.py.
"""

from __future__ import annotations

import pytest
from _config_helpers import ARR, _verl_home  # noqa: F401  (_verl_home: autouse fixture)
from omegaconf import OmegaConf

from verl.algorithms import ADV_ESTIMATOR_REGISTRY, estimator_needs
from verl.config import ConfigError, SFTConfig, load_config
from verl.workers.rollout import SamplingParams

R = f"{ARR}.rollout"
V = f"{ARR}.rollout.val_kwargs"
A = f"{ARR}.actor"

GREEDY = "temperature 0 is greedy decoding: set {}.do_sample=false for it"


def refused(*overrides: str, schema: type | None = None) -> str:
    """The message of the ConfigError that loading ``overrides`` raises (one line)."""
    with pytest.raises(ConfigError) as info:
        if schema is None:
            load_config(None, list(overrides))
        else:
            load_config(None, ["model.path=m", *overrides], schema=schema)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------------ bad values
@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        # sampling: the training rollout's temperature also divides the actor's and reference's logits
        ([f"{R}.temperature=0"], f"{R}.temperature must be > 0; got 0.0 (the actor and reference score"),
        ([f"{R}.temperature=0", f"{R}.do_sample=false"], f"{R}.temperature must be > 0; got 0.0"),
        ([f"{R}.temperature=-0.5"], f"{R}.temperature must be > 0; got -0.5"),
        (
            [f"{V}.do_sample=true"],  # val_kwargs.temperature defaults to 0
            f"{V}.temperature must be > 0 when {V}.do_sample=true; got 0.0 ({GREEDY.format(V)})",
        ),
        ([f"{V}.do_sample=true", f"{V}.temperature=-1"], f"{V}.temperature must be > 0; got -1.0"),
        ([f"{V}.temperature=-1"], f"{V}.temperature must be >= 0; got -1.0"),
        ([f"{R}.top_p=0"], f"{R}.top_p must be in (0, 1]; got 0.0"),
        ([f"{R}.top_p=1.01"], f"{R}.top_p must be in (0, 1]; got 1.01"),
        ([f"{V}.top_p=-0.1"], f"{V}.top_p must be in (0, 1]; got -0.1"),
        ([f"{R}.top_k=-2"], f"{R}.top_k must be -1 or 0 (off) or >= 1; got -2"),
        ([f"{V}.top_k=-5"], f"{V}.top_k must be -1 or 0 (off) or >= 1; got -5"),
        # PPO clipping
        ([f"{A}.clip_ratio=0"], f"{A}.clip_ratio must be > 0; got 0.0"),
        ([f"{A}.clip_ratio_low=0"], f"{A}.clip_ratio_low must be > 0 or null (clip_ratio); got 0.0"),
        ([f"{A}.clip_ratio_high=-0.1"], f"{A}.clip_ratio_high must be > 0 or null (clip_ratio); got -0.1"),
        ([f"{A}.clip_ratio_final=0"], f"{A}.clip_ratio_final must be > 0 or null (clip_ratio); got 0.0"),
        ([f"{A}.clip_ratio_c=1"], f"{A}.clip_ratio_c must be > 1; got 1.0"),
        ([f"{A}.clip_ratio_c=0.5"], f"{A}.clip_ratio_c must be > 1; got 0.5"),
        # actor loss
        ([f"{A}.grad_clip=0"], f"{A}.grad_clip must be > 0; got 0.0"),
        ([f"{A}.kl_loss_coef=-0.001"], f"{A}.kl_loss_coef must be >= 0; got -0.001"),
        (
            [f"{A}.loss_scale_factor=0"],
            f"{A}.loss_scale_factor must be > 0 or null (max_response_length); got 0.0",
        ),
        ([f"{A}.ppo_max_token_len_per_gpu=0"], f"{A}.ppo_max_token_len_per_gpu must be >= 1; got 0"),
        ([f"{A}.policy_loss.clip_cov_ratio=0"], f"{A}.policy_loss.clip_cov_ratio must be in (0, 1]; got 0.0"),
        ([f"{A}.policy_loss.kl_cov_ratio=1.5"], f"{A}.policy_loss.kl_cov_ratio must be in (0, 1]; got 1.5"),
        (
            [f"{A}.policy_loss.clip_cov_lb=5"],
            f"{A}.policy_loss.clip_cov_lb (5.0) must be < {A}.policy_loss.clip_cov_ub (5.0)",
        ),
        ([f"{A}.policy_loss.ppo_kl_coef=-1"], f"{A}.policy_loss.ppo_kl_coef must be >= 0; got -1.0"),
        ([f"{A}.policy_loss.tau_pos=0"], f"{A}.policy_loss.tau_pos must be > 0; got 0.0"),
        ([f"{A}.policy_loss.tau_neg=-1"], f"{A}.policy_loss.tau_neg must be > 0; got -1.0"),
        # optimizers (actor and critic)
        ([f"{A}.optim.lr=-1e-6"], f"{A}.optim.lr must be >= 0; got -1e-06"),
        ([f"{A}.optim.lr=.nan"], f"{A}.optim.lr must be >= 0; got nan"),
        ([f"{A}.optim.weight_decay=-0.01"], f"{A}.optim.weight_decay must be >= 0; got -0.01"),
        ([f"{A}.optim.betas=[1.0,0.999]"], f"{A}.optim.betas[0] must be in [0, 1); got 1.0"),
        ([f"{A}.optim.betas=[0.9,-0.1]"], f"{A}.optim.betas[1] must be in [0, 1); got -0.1"),
        (
            [f"{A}.optim.lr_warmup_steps=-2"],
            f"{A}.optim.lr_warmup_steps must be -1 (use lr_warmup_steps_ratio) or >= 0; got -2",
        ),
        (["critic.optim.lr=-1"], "critic.optim.lr must be >= 0; got -1.0"),
        (["critic.optim.betas=[0.9,1.5]"], "critic.optim.betas[1] must be in [0, 1); got 1.5"),
        # critic
        (["critic.grad_clip=0"], "critic.grad_clip must be > 0; got 0.0"),
        (["critic.cliprange_value=0"], "critic.cliprange_value must be > 0; got 0.0"),
        (["critic.ppo_mini_batch_size=0"], "critic.ppo_mini_batch_size must be >= 1; got 0"),
        (["critic.ppo_epochs=0"], "critic.ppo_epochs must be >= 1; got 0"),
        (
            ["critic.forward_micro_batch_size_per_gpu=0"],
            "critic.forward_micro_batch_size_per_gpu must be >= 1; got 0",
        ),
        # rollout / reference passes
        (
            [f"{R}.log_prob_micro_batch_size_per_gpu=0"],
            f"{R}.log_prob_micro_batch_size_per_gpu must be >= 1; got 0",
        ),
        (
            [f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=-4"],
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu must be >= 1; got -4",
        ),
        ([f"{ARR}.model.log_prob_chunk_size=-1"], f"{ARR}.model.log_prob_chunk_size must be >= 0; got -1"),
        # algorithm
        (["algorithm.gamma=1.01"], "algorithm.gamma must be in [0, 1]; got 1.01"),
        (["algorithm.gamma=-0.1"], "algorithm.gamma must be in [0, 1]; got -0.1"),
        (["algorithm.gamma=.inf"], "algorithm.gamma must be in [0, 1]; got inf"),
        (["algorithm.lam=2"], "algorithm.lam must be in [0, 1]; got 2.0"),
        (["algorithm.kl_ctrl.kl_coef=-0.001"], "algorithm.kl_ctrl.kl_coef must be >= 0; got -0.001"),
        (["algorithm.kl_ctrl.horizon=0"], "algorithm.kl_ctrl.horizon must be >= 1; got 0"),
        (["algorithm.kl_ctrl.target_kl=0"], "algorithm.kl_ctrl.target_kl must be > 0; got 0.0"),
        (
            ["algorithm.filter_groups.max_num_gen_batches=-1"],
            "algorithm.filter_groups.max_num_gen_batches must be >= 0; got -1",
        ),
        # data
        (["data.max_prompt_length=0"], "data.max_prompt_length must be >= 1; got 0"),
        (["data.max_response_length=-3"], "data.max_response_length must be >= 1; got -3"),
        (["data.train_max_samples=0"], "data.train_max_samples must be -1 (all rows) or >= 1; got 0"),
        (["data.val_max_samples=-2"], "data.val_max_samples must be -1 (all rows) or >= 1; got -2"),
        (["data.seed=-1"], "data.seed must be in [0, 4294967295] or null (trainer.seed); got -1"),
        # reward
        (["reward_model.num_examine=-1"], "reward_model.num_examine must be >= 0; got -1"),
        (
            ["reward_model.timeout_s=0"],
            "reward_model.timeout_s must be > 0 or null (no limit); got 0.0 (seconds)",
        ),
        (["reward_model.overlong_buffer.len=0"], "reward_model.overlong_buffer.len must be >= 1; got 0"),
        (
            [
                "reward_model.reward_manager=dapo",
                "reward_model.overlong_buffer.enable=true",
                "reward_model.overlong_buffer.len=8",
            ],
            "reward_model.overlong_buffer.len must be < data.max_response_length (8); got 8",
        ),
        (
            ["reward_model.overlong_buffer.penalty_factor=-1"],
            "reward_model.overlong_buffer.penalty_factor must be >= 0; got -1.0",
        ),
        # trainer
        (
            ["trainer.total_training_steps=0"],
            "trainer.total_training_steps must be >= 1 or null (total_epochs of data); got 0",
        ),
        (["trainer.total_epochs=0"], "trainer.total_epochs must be >= 1; got 0"),
        (["trainer.test_freq=0"], "trainer.test_freq must be -1 (never) or >= 1; got 0"),
        (["trainer.save_freq=-2"], "trainer.save_freq must be -1 (never) or >= 1; got -2"),
        (["trainer.critic_warmup=-1"], "trainer.critic_warmup must be >= 0; got -1"),
        (
            ["trainer.torch_threads=0"],
            "trainer.torch_threads must be auto, an integer >= 1 or null (torch's default); got 0",
        ),
        (
            ["trainer.torch_threads=many"],
            "trainer.torch_threads must be auto, an integer >= 1 or null (torch's default); got 'many'",
        ),
        (["trainer.seed=-1"], "trainer.seed must be in [0, 4294967295]; got -1"),
        ([f"trainer.seed={2**32}"], "trainer.seed must be in [0, 4294967295]; got 4294967296"),
        (["prepare.seed=-7"], "prepare.seed must be in [0, 4294967295] or null (trainer.seed); got -7"),
    ],
)
def test_bad_value_names_key_value_and_range(overrides: list[str], fragment: str) -> None:
    assert fragment in refused(*overrides)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("optim.grad_clip=0", "optim.grad_clip must be > 0; got 0.0"),
        ("optim.lr=-1", "optim.lr must be >= 0; got -1.0"),
        ("optim.betas=[0.9,1.0]", "optim.betas[1] must be in [0, 1); got 1.0"),
        ("data.train_max_samples=0", "data.train_max_samples must be -1 (all rows) or >= 1; got 0"),
        ("trainer.total_epochs=0", "trainer.total_epochs must be >= 1; got 0"),
        ("trainer.total_training_steps=0", "trainer.total_training_steps must be >= 1 or null"),
        ("trainer.seed=-1", "trainer.seed must be in [0, 4294967295]; got -1"),
    ],
)
def test_sft_bad_value(override: str, fragment: str) -> None:
    assert fragment in refused(override, schema=SFTConfig)


def test_every_problem_in_one_error() -> None:
    message = refused(f"{R}.top_p=0", "algorithm.gamma=2", "trainer.total_epochs=0", f"{A}.clip_ratio_c=1")
    assert message.startswith("invalid config: ")
    for key in (f"{R}.top_p", "algorithm.gamma", "trainer.total_epochs", f"{A}.clip_ratio_c"):
        assert f"{key} must be" in message


def test_check_false_skips_the_ranges() -> None:
    cfg = load_config(None, [f"{R}.top_p=0", "algorithm.gamma=2"], check=False)
    assert cfg[ARR].rollout.top_p == 0.0 and cfg.algorithm.gamma == 2.0


# ------------------------------------------------------------------------------------------------ boundaries
def test_boundary_values_load() -> None:
    cfg = load_config(
        None,
        [
            f"{R}.temperature=0.001",
            f"{R}.do_sample=false",  # greedy training rollouts keep a positive temperature
            f"{R}.top_p=1.0",
            f"{R}.top_k=0",
            f"{V}.temperature=0",  # greedy validation
            f"{V}.do_sample=false",
            f"{V}.top_p=0.01",
            f"{V}.top_k=1",
            f"{A}.clip_ratio=0.001",
            f"{A}.clip_ratio_low=0.001",
            f"{A}.clip_ratio_high=10",
            f"{A}.clip_ratio_final=0.01",
            f"{A}.clip_ratio_c=1.001",
            f"{A}.grad_clip=0.001",
            f"{A}.kl_loss_coef=0",
            f"{A}.loss_scale_factor=1",
            f"{A}.policy_loss.clip_cov_ratio=1",
            f"{A}.policy_loss.kl_cov_ratio=1",
            f"{A}.policy_loss.ppo_kl_coef=0",
            f"{A}.optim.lr=0",
            f"{A}.optim.weight_decay=0",
            f"{A}.optim.betas=[0,0.999999]",
            f"{A}.optim.lr_warmup_steps=-1",
            f"{A}.optim.lr_warmup_steps_ratio=1",
            f"{ARR}.model.log_prob_chunk_size=0",
            "critic.optim.lr=0",
            "algorithm.gamma=0",
            "algorithm.lam=1",
            "algorithm.kl_ctrl.kl_coef=0",
            "algorithm.kl_ctrl.horizon=1",
            "algorithm.filter_groups.max_num_gen_batches=0",
            "data.max_response_length=1",
            "data.train_max_samples=-1",
            "data.val_max_samples=1",
            "data.seed=0",
            "reward_model.num_examine=0",
            "reward_model.timeout_s=0.001",
            "reward_model.overlong_buffer.penalty_factor=0",
            "trainer.total_training_steps=1",
            "trainer.total_epochs=1",
            "trainer.test_freq=1",
            "trainer.save_freq=-1",
            "trainer.torch_threads=1",
            f"trainer.seed={2**32 - 1}",
            "prepare.seed=0",
        ],
    )
    assert cfg[ARR].rollout.temperature == 0.001 and cfg[ARR].rollout.val_kwargs.temperature == 0.0
    assert cfg[ARR].actor.clip_ratio_c == 1.001 and cfg.algorithm.gamma == 0.0
    assert cfg.trainer.seed == 2**32 - 1 and cfg.reward_model.timeout_s == 0.001


def test_nulls_load() -> None:
    cfg = load_config(
        None,
        [
            "trainer.total_training_steps=null",
            "trainer.torch_threads=null",
            "reward_model.timeout_s=null",
            f"{A}.clip_ratio_low=null",
            f"{A}.loss_scale_factor=null",
            "data.seed=null",
        ],
    )
    assert cfg.trainer.total_training_steps is None and cfg.reward_model.timeout_s is None


def test_sampling_validation_in_val_kwargs() -> None:
    cfg = load_config(
        None, [f"{V}.do_sample=true", f"{V}.temperature=0.6", f"{V}.top_k=20", f"{V}.top_p=0.95"]
    )
    assert cfg[ARR].rollout.val_kwargs.do_sample is True
    # a greedy decode ignores the temperature, so any non-negative one is accepted
    load_config(None, [f"{V}.do_sample=false", f"{V}.temperature=0.7"])


def test_dapo_overlong_buffer_just_below_the_response_length_loads() -> None:
    cfg = load_config("dapo", ["reward_model.overlong_buffer.len=7", "data.max_response_length=8"])
    assert cfg.reward_model.overlong_buffer.len == 7


def test_sft_boundaries_load() -> None:
    cfg = load_config(
        None,
        [
            "model.path=m",
            "data.train_files=d.parquet",
            "optim.grad_clip=0.01",
            "optim.lr=0",
            "data.train_max_samples=1",
            "trainer.seed=0",
        ],
        schema=SFTConfig,
    )
    assert cfg.optim.grad_clip == 0.01 and cfg.data.train_max_samples == 1


# ------------------------------------------------------------------------------------------------ group estimators
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline")
"""the built-in estimators whose baseline comes from the other responses to the same prompt"""


@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
def test_group_estimators_need_two_responses_per_prompt(estimator: str) -> None:
    message = refused(f"algorithm.adv_estimator={estimator}", f"{R}.n=1")
    assert f"algorithm.adv_estimator={estimator} compares the responses to each prompt" in message
    assert f"needs {R}.n >= 2 (the group size); got 1" in message
    assert load_config(None, [f"algorithm.adv_estimator={estimator}", f"{R}.n=2"])[ARR].rollout.n == 2


@pytest.mark.parametrize("estimator", ["gae", "reinforce_plus_plus", "remax"])
def test_single_response_estimators_accept_n_1(estimator: str) -> None:
    cfg = load_config(None, [f"algorithm.adv_estimator={estimator}", f"{R}.n=1"])
    assert cfg[ARR].rollout.n == 1


def test_every_registered_estimator_declares_what_it_needs() -> None:
    # what each built-in estimator declared at registration (estimator_needs), checked against this hand
    # list; a new estimator is added here on purpose. Other tests register estimators of their own.
    builtin = {name for name, fn in ADV_ESTIMATOR_REGISTRY.items() if fn.__module__.startswith("verl.")}
    assert builtin == set(GROUP_ESTIMATORS) | {"gae", "reinforce_plus_plus", "remax"}
    declared = {name: estimator_needs(name) for name in builtin}
    assert {name for name, needs in declared.items() if needs.groups} == set(GROUP_ESTIMATORS)
    assert {name for name, needs in declared.items() if needs.critic} == {"gae"}
    assert {name for name, needs in declared.items() if needs.greedy_baseline} == {"remax"}


def test_n_0_reports_the_lower_bound_only() -> None:
    message = refused(f"{R}.n=0")
    assert f"{R}.n must be >= 1; got 0" in message and "group size" not in message


# ------------------------------------------------------------------------------------------------ the rollout
def _section(**values):
    base = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    return OmegaConf.create({**base, **values})


def test_rollout_decodes_greedily_only_with_do_sample_false() -> None:
    greedy = SamplingParams.from_config(_section(do_sample=False, temperature=0.7), max_new_tokens=4)
    assert greedy.do_sample is False and greedy.temperature == 0.7
    sampled = SamplingParams.from_config(_section(temperature=0.7), max_new_tokens=4)
    assert sampled.do_sample is True and sampled.temperature == 0.7
    assert SamplingParams.from_config(_section(do_sample=False, temperature=0.0), 4).do_sample is False


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_rollout_refuses_sampling_without_a_positive_temperature(temperature: float) -> None:
    # formerly turned into greedy decoding without a word
    with pytest.raises(ConfigError, match="temperature must be > 0 when do_sample=true"):
        SamplingParams.from_config(_section(temperature=temperature), max_new_tokens=4)
    with pytest.raises(ValueError, match="sampling needs a temperature > 0"):
        SamplingParams(do_sample=True, temperature=temperature)
