"""Issue 41: rollout keys that act only on a GPU are reported at start-up when the rollout runs without one."""

from __future__ import annotations

import pytest
import torch
from _config_helpers import ARR, _verl_home  # noqa: F401  (_verl_home: autouse fixture)

from verl.config import load_config, verl_compat
from verl.config.backends import rollout_without_gpu

R = f"{ARR}.rollout"


@pytest.fixture(autouse=True)
def _engines_installed(monkeypatch) -> None:
    # rollout.name=vllm stays vllm (not mapped onto fast) whether or not vLLM is installed here
    monkeypatch.setattr(verl_compat, "engine_installed", lambda engine: True)
    monkeypatch.setattr(verl_compat, "vllm_installed", lambda: True)


def notices(*overrides: str) -> list[str]:
    return verl_compat.notices(load_config(overrides=list(overrides)))


def about(key: str, lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith(f"{R}.{key}=")]


def test_gpu_memory_utilization_on_a_cpu_is_reported_with_the_value_and_why() -> None:
    assert not torch.cuda.is_available()  # what this test is about: a machine with no CUDA device
    (line,) = about("gpu_memory_utilization", notices(f"{R}.name=vllm", f"{R}.gpu_memory_utilization=0.9"))
    assert line.startswith(
        f"{R}.gpu_memory_utilization=0.9 has no effect with rollout.name=vllm without a GPU"
    )
    assert "trainer.device=cpu" in line and "KV cache is sized to the run" in line
    # trainer.device=auto on this machine: the reason is that there is no CUDA device
    (line,) = about(
        "gpu_memory_utilization",
        notices(f"{R}.name=vllm", f"{R}.gpu_memory_utilization=0.9", "trainer.device=auto"),
    )
    assert "torch.cuda.is_available() is False" in line


def test_defaults_and_keys_that_act_on_a_cpu_are_not_reported() -> None:
    assert notices() == []
    assert notices(f"{R}.name=vllm") == []
    assert notices(f"{R}.name=vllm", f"{R}.gpu_memory_utilization=0.5") == []  # the default
    # these act on vLLM's CPU backend too
    acting = [
        f"{R}.enforce_eager=false",  # torch.compile on
        f"{R}.enable_chunked_prefill=false",
        f"{R}.enable_prefix_caching=false",
        f"{R}.max_num_batched_tokens=4096",
        f"{R}.max_num_seqs=64",
        f"{R}.free_cache_engine=true",
    ]
    assert notices(f"{R}.name=vllm", *acting) == []


def test_free_cache_engine_and_enforce_eager_are_reported_only_where_inert() -> None:
    lines = notices(f"{R}.name=vllm", f"{R}.free_cache_engine=false", f"{R}.enforce_eager=true")
    (sleep,) = about("free_cache_engine", lines)
    assert sleep.startswith(f"{R}.free_cache_engine=false has no effect with rollout.name=vllm without a GPU")
    (eager,) = about("enforce_eager", lines)
    assert "vLLM runs eagerly on a CPU already" in eager


def test_on_a_gpu_the_keys_are_read_and_not_reported(monkeypatch) -> None:
    gpu_keys = [f"{R}.gpu_memory_utilization=0.9", f"{R}.free_cache_engine=false", f"{R}.enforce_eager=true"]
    assert notices(f"{R}.name=vllm", "trainer.device=cuda", *gpu_keys) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert notices(f"{R}.name=vllm", "trainer.device=auto", *gpu_keys) == []
    assert rollout_without_gpu(load_config(overrides=["trainer.device=auto"])) is None


def test_kv_cache_memory_bytes_null_hands_the_cpu_cache_back_to_gpu_memory_utilization() -> None:
    # vLLM's CPU worker sizes its cache from gpu_memory_utilization when kv_cache_memory_bytes is None
    lines = notices(
        f"{R}.name=vllm",
        f"{R}.gpu_memory_utilization=0.9",
        f"{R}.engine_kwargs.vllm.kv_cache_memory_bytes=null",
    )
    assert about("gpu_memory_utilization", lines) == []


def test_another_engine_keeps_its_own_notice_and_gets_no_second_one() -> None:
    (line,) = about("gpu_memory_utilization", notices(f"{R}.gpu_memory_utilization=0.9"))  # rollout.name=fast
    assert "has no effect with rollout.name=fast (it sizes" in line
