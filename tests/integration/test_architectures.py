"""Causal LMs beyond Qwen2 and Llama train through the same trainer: tiny Phi-3 (fused qkv and gate/up
projections) and Mistral models take two RL steps, full and with LoRA adapters. The fast engine decodes them
with the model's own forward (its lean step covers Llama and Qwen2 layouts only)."""

from __future__ import annotations

import json
import math

import pytest
from test_rl_steps import parity_reward, small_config
from transformers import AutoModelForCausalLM

from verl.models import make_tiny_model
from verl.trainer.rl_trainer import RLTrainer
from verl.workers.rollout.decoders import lean_decoder_supported

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("arch", ["phi3", "mistral"])
def test_the_architecture_trains_two_steps(arch, lora, arithmetic_files, tmp_path):
    model_dir = make_tiny_model(
        tmp_path / arch, arch=arch, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=128,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.model_type == arch and not lean_decoder_supported(model)
    extra = ["actor_rollout_ref.model.lora_rank=8"] if lora else []
    config = small_config(
        model_dir,
        arithmetic_files,
        tmp_path / "run",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *extra,
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0 for row in rows)
