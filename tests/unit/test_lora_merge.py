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
    sent = dict(merged_policy_weights(model, torch.float32))
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
        sent = dict(merged_policy_weights(model, torch.bfloat16))
    base = dict(policy_weights(model))
    assert all(torch.equal(sent[n], base[n]) for n in base)


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


def test_a_bf16_base_keeps_a_small_update(tiny_model_dir):
    """With the frozen base held in bf16 (the bf16 actor) and an update mostly under half a bf16 step, a float32
    engine gets the exact sum, and a bf16 engine a rounding of it that moves the weights by the update on
    average; rounded to nearest, most elements come back to their base value and most of the update is lost."""
    model = trained_lora_model(tiny_model_dir, target_modules=["o_proj"])
    hold_frozen_weights_in(model, torch.bfloat16)
    names = [f"model.layers.{i}.self_attn.o_proj.weight" for i in range(model.config.num_hidden_layers)]
    layers = [model.get_submodule(name.removesuffix(".weight")) for name in names]
    with torch.no_grad():
        for layer in layers:
            layer.lora_B["default"].weight.mul_(3e-5)
        base = torch.cat([layer.base_layer.weight.float().flatten() for layer in layers])
        delta = torch.cat([layer.get_delta_weight("default").float().flatten() for layer in layers])

    def kept(weights: torch.Tensor) -> float:
        """How much of the update the weights carry: their move from the base projected on the update."""
        return float((weights.float() - base) @ delta / (delta @ delta))

    nearest = (base + delta).to(torch.bfloat16)
    assert (nearest.float() == base).float().mean() > 0.8 and kept(nearest) < 0.5
    exact = dict(merged_policy_weights(model, torch.float32))
    assert all(exact[name].dtype == torch.float32 for name in names)
    torch.testing.assert_close(torch.cat([exact[name].flatten() for name in names]), base + delta)
    sent = dict(merged_policy_weights(model, torch.bfloat16))
    rounded = torch.cat([sent[name].flatten() for name in names])
    assert rounded.dtype == torch.bfloat16 and 0.8 < kept(rounded) < 1.2
    # each element is one of the two bf16 neighbours of the sum
    error = (rounded.float() - base - delta).abs()
    assert bool((error <= torch.finfo(torch.bfloat16).eps * (base + delta).abs()).all())


def test_verls_key_reads_as_lora_merge():
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.model.lora.merge=true"])
    assert cfg.actor_rollout_ref.model.lora_merge is True
    assert load_config("ppo_trainer", []).actor_rollout_ref.model.lora_merge is False
