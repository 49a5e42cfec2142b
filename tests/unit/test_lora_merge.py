"""``actor_rollout_ref.model.lora_merge`` (verl's ``model.lora.merge``): an engine with weights of its own gets the
LoRA policy as full weights with the adapters merged in. What it is sent is checked here against peft's own merge;
the engine side (vLLM generating from merged weights, the guard) is in tests/integration/test_vllm_rollout.py."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from verl.config import load_config
from verl.config.schema import ModelConfig
from verl.models import load_hf_model
from verl.models.lora import apply_lora
from verl.utils.precision import hold_frozen_weights_in
from verl.workers.rollout.served import merged_policy_weights, policy_weights

pytest.importorskip("peft")


def trained_lora_model(model_dir, **keys):
    torch.manual_seed(0)
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), {"lora_rank": 4, "lora_alpha": 8, **keys})
    model = apply_lora(load_hf_model(model_dir), cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # peft starts B at zero: the merge would add nothing
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.5 * torch.randn(param.shape, generator=g))
    return model


def peft_merged_state(model) -> dict[str, torch.Tensor]:
    """peft's own merge of a copy: every adapted layer's base weight += its delta, adapters removed."""
    merged = copy.deepcopy(model)
    with torch.no_grad():
        for module in merged.modules():
            if hasattr(module, "merge") and hasattr(module, "lora_A"):
                module.merge()
    return {name: tensor for name, tensor in policy_weights(merged)}


def test_merged_weights_are_peft_merge(tiny_model_dir):
    model = trained_lora_model(tiny_model_dir, target_modules=["q_proj", "o_proj", "down_proj"])
    sent = dict(merged_policy_weights(model))
    base = dict(policy_weights(model))
    expected = peft_merged_state(model)
    assert sent.keys() == base.keys() == expected.keys()  # the plain model's names, no adapter tensors
    changed = [n for n in sent if not torch.equal(sent[n], base[n])]
    assert changed and all(
        n.endswith(("q_proj.weight", "o_proj.weight", "down_proj.weight")) for n in changed
    )
    assert len(changed) == 3 * model.config.num_hidden_layers
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6)


def test_disabled_adapters_send_the_base(tiny_model_dir):
    model = trained_lora_model(tiny_model_dir)
    with model.disable_adapter() if hasattr(model, "disable_adapter") else _disabled(model):
        sent = dict(merged_policy_weights(model))
    base = dict(policy_weights(model))
    assert all(torch.equal(sent[n], base[n].float()) for n in base)


class _disabled:
    """The adapters of every LoRA layer switched off for the block (an injected model has no PeftModel shell)."""

    def __init__(self, model):
        self.layers = [m for m in model.modules() if hasattr(m, "enable_adapters") and hasattr(m, "lora_A")]

    def __enter__(self):
        for m in self.layers:
            m.enable_adapters(False)

    def __exit__(self, *exc):
        for m in self.layers:
            m.enable_adapters(True)


def test_a_bf16_base_merges_in_float32(tiny_model_dir):
    """With the frozen base held in bf16 (the bf16 actor), the merged weight is the bf16 base plus the delta in
    float32, not rounded back to bf16: a small update would mostly vanish in that rounding."""
    model = trained_lora_model(tiny_model_dir, target_modules=["o_proj"])
    hold_frozen_weights_in(model, torch.bfloat16)
    layer = model.model.layers[0].self_attn.o_proj
    sent = dict(merged_policy_weights(model))["model.layers.0.self_attn.o_proj.weight"]
    assert sent.dtype == torch.float32
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * layer.scaling["default"]
    torch.testing.assert_close(sent, layer.base_layer.weight.float() + delta)


def test_verls_key_reads_as_lora_merge():
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.model.lora.merge=true"])
    assert cfg.actor_rollout_ref.model.lora_merge is True
    assert load_config("ppo_trainer", []).actor_rollout_ref.model.lora_merge is False
