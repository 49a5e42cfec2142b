"""The LoRA guard in real use: a vLLM engine whose adapter load is broken, and a separate_async run whose
rollout keeps stale adapters, both stop with the guard's one line; the normal paths pass it."""

from __future__ import annotations

import pytest
from test_async import ASYNC, run
from test_vllm_rollout import lora_policy, model_dir, train_adapters, vllm_engine, vllm_ready  # noqa: F401 - fixtures

from verl.workers.rollout.host import RolloutHost
from verl.workers.rollout.lora_guard import LoraSyncError

pytestmark = pytest.mark.slow


def test_vllm_with_an_adapter_load_that_does_nothing_fails_the_guard(vllm_ready, model_dir):  # noqa: F811
    policy = lora_policy(model_dir, ["q_proj", "v_proj", "gate_proj"])
    engine = vllm_engine(policy)
    train_adapters(policy, 0)
    engine.sync_weights(policy, 0)  # the normal path passes
    assert engine.weights_version == 0 and 0 < engine.last_guard_s < 1.0
    engine.llm.llm_engine.add_lora = lambda request: True  # the adapter load does nothing
    train_adapters(policy, 1)
    with pytest.raises(
        LoraSyncError, match=r"^LoRA guard: after the weight sync to policy version 1 the vLLM"
    ):
        engine.sync_weights(policy, 1)
    assert engine.weights_version == 0  # the failed sync did not take the version


def test_a_separate_async_run_whose_rollout_keeps_stale_adapters_stops(
    tiny_model_dir, arithmetic_files, tmp_path, monkeypatch
):
    load = RolloutHost.load_buckets

    def adapters_dropped(self, buckets, version, complete=True):
        if complete:  # the first (whole) copy goes in; every later adapter copy is lost
            return load(self, buckets, version, complete)
        return 0, 0

    monkeypatch.setattr(RolloutHost, "load_buckets", adapters_dropped)
    with pytest.raises(Exception, match="LoRA guard: after the weight sync to policy version 1 the rollout"):
        run(
            tiny_model_dir, arithmetic_files, tmp_path / "stale", ASYNC, "actor_rollout_ref.model.lora_rank=8"
        )
