"""The FSDP2 strategy's configuration: which strategy a run trains with, what fsdp_config keys are read and
said, the seed API's fsdp_config, and the equal micro-batch counts FSDP ranks need."""

from __future__ import annotations

import pytest
import torch

from verl.config import ConfigError, load_config
from verl.config.backends import DTYPE_NAMES, backend_notices, training_strategy
from verl.models.loading import DTYPES
from verl.protocol import DataProto
from verl.trainer.seed_api import fsdp_updates
from verl.workers.engine.batching import lockstep_micro_batches, micro_batches

ARR = "actor_rollout_ref"


def test_the_strategy_is_fsdp2_when_more_than_one_rank_trains_unless_set() -> None:
    assert training_strategy(load_config("grpo")) == "dp"
    two = ["trainer.backend=ray", "trainer.n_gpus_per_node=2"]
    assert training_strategy(load_config("grpo", two)) == "fsdp2"
    assert training_strategy(load_config("grpo", [*two, f"{ARR}.actor.strategy=dp"])) == "dp"
    assert training_strategy(load_config("grpo", [f"{ARR}.actor.strategy=fsdp"])) == "fsdp2"


def test_fsdp_settings_are_said_to_do_nothing_under_dp_and_fsdp_is_named_as_fsdp2() -> None:
    dp = load_config(
        "grpo", [f"{ARR}.actor.fsdp_config.fsdp_size=2", "critic.model.fsdp_config.param_offload=true"]
    )
    lines = backend_notices(dp)
    assert any(
        f"{ARR}.actor.fsdp_config.fsdp_size=2 has no effect with strategy=dp" in line for line in lines
    )
    assert any("critic.model.fsdp_config.param_offload=true has no effect" in line for line in lines)
    fsdp = load_config("grpo", [f"{ARR}.actor.strategy=fsdp", f"{ARR}.actor.fsdp_config.fsdp_size=2"])
    lines = backend_notices(fsdp)
    assert any("strategy=fsdp trains with FSDP2" in line for line in lines)
    assert not any("fsdp_size" in line for line in lines)


def test_fsdp_values_that_cannot_work_are_refused_with_the_key() -> None:
    with pytest.raises(
        ConfigError, match=rf"{ARR}.ref.fsdp_config.mixed_precision.param_dtype=bf17: not a dtype"
    ):
        load_config(
            "grpo", [f"{ARR}.actor.strategy=fsdp2", f"{ARR}.ref.fsdp_config.mixed_precision.param_dtype=bf17"]
        )
    with pytest.raises(ConfigError, match="critic.model.fsdp_config.fsdp_size=0"):
        load_config("grpo", [f"{ARR}.actor.strategy=fsdp2", "critic.model.fsdp_config.fsdp_size=0"])
    with pytest.raises(ConfigError, match=r"strategy=megatron: not built"):
        load_config("grpo", [f"{ARR}.actor.strategy=megatron"])


def test_the_dtype_names_a_config_accepts_are_the_ones_models_load_with() -> None:
    assert set(DTYPE_NAMES) == set(DTYPES)


def test_verl_spellings_of_the_fsdp_keys() -> None:
    cfg = load_config(
        "ppo_trainer",
        [
            "critic.fsdp.param_offload=true",  # verl >= 0.8
            "critic.fsdp.model_dtype=bf16",
            f"{ARR}.actor.fsdp_config.model_dtype=bf16",
            f"{ARR}.actor.fsdp_config.forward_prefetch=true",
        ],
    )
    assert cfg.critic.model.fsdp_config.param_offload is True
    assert (cfg.critic.model.torch_dtype, cfg[ARR].model.torch_dtype) == ("bf16", "bf16")
    assert f"{ARR}.actor.fsdp_config.forward_prefetch" in cfg.compat.no_effect
    assert cfg[ARR].actor.strategy == "fsdp"  # verl's default, trained as FSDP2


def test_the_seed_api_fsdp_config() -> None:
    updates = fsdp_updates({"param_offload": True, "mixed_precision": {"param_dtype": "bf16"}})
    assert updates[f"{ARR}.actor.strategy"] == "fsdp2"
    for role in (f"{ARR}.actor", f"{ARR}.ref", "critic.model"):
        assert updates[f"{role}.fsdp_config.param_offload"] is True
        assert updates[f"{role}.fsdp_config.mixed_precision.param_dtype"] == "bf16"
    assert (
        fsdp_updates({"sharding_strategy": "SHARD_GRAD_OP"})[f"{ARR}.actor.fsdp_config.reshard_after_forward"]
        is False
    )
    assert fsdp_updates({"sharding_strategy": "NO_SHARD"}) == {f"{ARR}.actor.strategy": "dp"}
    with pytest.raises(ConfigError, match="HYBRID_SHARD.*fsdp_size"):
        fsdp_updates({"sharding_strategy": "HYBRID_SHARD"})
    with pytest.raises(ConfigError, match="unknown"):
        fsdp_updates({"sharding_strategy": "SHARD_EVERYTHING"})


def _rows(n: int, lengths: list[int] | None = None) -> DataProto:
    lengths = lengths or [3] * n
    mask = torch.tensor([[1] * k + [0] * (max(lengths) - k) for k in lengths])
    return DataProto.from_dict(tensors={"attention_mask": mask, "x": torch.arange(n)})


def test_micro_batches_split_the_largest_until_there_are_enough() -> None:
    data = _rows(5)
    micros, order = micro_batches(data, 4, count=3)  # [0..3], [4] -> [0, 1], [2, 3], [4]
    assert [m.batch["x"].tolist() for m in micros] == [[0, 1], [2, 3], [4]] and order is None
    micros, _ = micro_batches(data, None, count=9)  # never below one row
    assert [m.batch["x"].tolist() for m in micros] == [[0], [1], [2], [3], [4]]
    by_tokens = _rows(4, [4, 1, 4, 1])
    micros, order = micro_batches(by_tokens, None, max_tokens=5, count=3)
    assert sorted(sum((m.batch["x"].tolist() for m in micros), [])) == [0, 1, 2, 3] and len(micros) == 3
    assert order.tolist() == sum((m.batch["x"].tolist() for m in micros), [])


def test_lockstep_is_plain_micro_batching_for_one_rank() -> None:
    data = _rows(4)
    micros, order, real = lockstep_micro_batches(data, 2, None, lockstep=True)
    assert real == len(micros) == 2 and order is None


def test_the_ray_watchdog_keys_are_said_to_do_nothing_in_process() -> None:
    local = backend_notices(load_config("grpo", ["trainer.heartbeat_timeout_s=60"]))
    assert [line for line in local if "timeout_s" in line] == [
        "trainer.heartbeat_timeout_s=60.0 has no effect with trainer.backend=local (the workers run in this "
        "process's threads, which nothing can stop from outside; it bounds the calls to worker processes with "
        "trainer.backend=ray)"
    ]
    assert not any("timeout_s" in line for line in backend_notices(load_config("grpo", [])))  # the defaults
    on_ray = load_config("grpo", ["trainer.backend=ray", "trainer.worker_timeout_s=60"])
    assert not any("timeout_s" in line for line in backend_notices(on_ray))
