"""LoRA on the actor (verl's ``actor_rollout_ref.model.lora_*`` keys, through peft) and ``model.override_config``.

The tiny model (2 layers, hidden 64) takes well under a second per forward pass, so every test builds what
it needs from the session's model directory.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf

from verl.config import ConfigError, load_config
from verl.config.schema import ActorConfig, ModelConfig
from verl.models import load_hf_model, load_value_model
from verl.models.loading import check_fits_model, model_config_dict
from verl.models.lora import (
    ADAPTER_CONFIG,
    adapter_weight_names,
    adapters_disabled,
    apply_lora,
    has_adapters,
    merged_copy,
    round_merged,
)
from verl.protocol import DataProto
from verl.workers.actor import Actor, compute_log_prob
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer
from verl.workers.engine.scoring import PolicyScorer
from verl.workers.rollout import SamplingParams, get_rollout_class
from verl.workers.rollout.decoders import lean_decoder_supported

pytest.importorskip("peft")

ARR = "actor_rollout_ref"
BATCH, PROMPT_LEN, RESPONSE_LEN = 4, 5, 4


def model_cfg(**keys):
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), {"lora_rank": 8, "lora_alpha": 16, **keys})


def actor_cfg():
    return OmegaConf.merge(
        OmegaConf.structured(ActorConfig), {"optim": {"lr": 1e-2, "lr_warmup_steps": 0}, "shuffle": False}
    )


def lora_model(model_dir, **keys):
    torch.manual_seed(0)
    return apply_lora(load_hf_model(model_dir), model_cfg(**keys))


def with_trained_adapters(model):
    """``model`` with every ``lora_B`` random (peft starts it at zero, so the adapters would change nothing)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.5 * torch.randn(param.shape, generator=g))
    return model


def batch(vocab: int) -> DataProto:
    """Prompts and responses with advantages and old log-probs, as an update gets them."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (BATCH, PROMPT_LEN + RESPONSE_LEN), generator=g)
    attention_mask = torch.ones_like(input_ids)
    response_mask = torch.ones(BATCH, RESPONSE_LEN)
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
            "responses": input_ids[:, PROMPT_LEN:],
            "response_mask": response_mask,
            "advantages": torch.randn(BATCH, RESPONSE_LEN, generator=g),
        }
    )


def log_probs(model, data: DataProto) -> torch.Tensor:
    return compute_log_prob(PolicyScorer(model), data, None, temperature=1.0)[0]


# ------------------------------------------------------------------------------------------------ LoRA


def test_only_the_adapters_train_and_the_optimizer_gets_only_them(tiny_model_dir):
    model = lora_model(tiny_model_dir)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear: every projection of every layer, never the LM head
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert len(trainable) == 2 * len(projections) * model.config.num_hidden_layers
    assert not any("lm_head" in n or "embed" in n for n in trainable)
    optimizer = build_optimizer(model.parameters(), actor_cfg().optim)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(trainable)
    assert isinstance(model, type(load_hf_model(tiny_model_dir)))  # the transformers model, not a PeftModel


def test_target_and_exclude_modules_choose_the_layers(tiny_model_dir):
    model = lora_model(
        tiny_model_dir, target_modules=["q_proj", "v_proj"], exclude_modules="model.layers.0.*"
    )
    adapted = {n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad}
    assert adapted == {"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}


def test_rank_zero_leaves_the_model_alone(tiny_model_dir):
    model = load_hf_model(tiny_model_dir)
    assert apply_lora(model, model_cfg(lora_rank=0)) is model and not has_adapters(model)
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_optimizer_step_moves_only_the_adapters(checkpointing, tiny_model_dir):
    model = lora_model(tiny_model_dir, enable_gradient_checkpointing=checkpointing)
    if checkpointing:  # as the worker does after apply_lora (prepare_for_training)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    cfg = actor_cfg()
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    actor = Actor(model, cfg, optimizer, build_lr_scheduler(optimizer, cfg.optim, 1), seed=0)
    data = batch(model.config.vocab_size)
    data.batch["old_log_probs"] = actor.compute_log_prob(data, None, temperature=1.0)[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = actor.update_policy(data, mini_batch_size=BATCH, micro_batch_size=2, temperature=1.0)
    assert metrics["actor/grad_norm"] > 0
    after = model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(".lora_" in k for k in moved)
    assert all(k in moved for k in before if ".lora_B." in k)  # B starts at 0 and gets the gradient


def test_reference_log_probs_are_the_base_models(tiny_model_dir):
    model = with_trained_adapters(lora_model(tiny_model_dir))
    data = batch(model.config.vocab_size)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    base = log_probs(load_hf_model(tiny_model_dir), data)
    with adapters_disabled(model):
        assert torch.equal(log_probs(model, data), base)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags  # the adapters train on
    assert not torch.allclose(log_probs(model, data), base, atol=1e-3)  # the adapters do change the policy


def test_adapter_weight_names_are_the_lora_weights_alone(tiny_model_dir):
    model = lora_model(tiny_model_dir, target_modules=["q_proj", "v_proj"])
    names = adapter_weight_names(model)
    assert names == {n for n, p in model.named_parameters() if p.requires_grad}
    assert adapter_weight_names(load_hf_model(tiny_model_dir)) == frozenset()


def test_merged_copy_is_base_plus_scaled_b_times_a(tiny_model_dir):
    model = with_trained_adapters(lora_model(tiny_model_dir, lora_rank=4, lora_alpha=8))
    merged = merged_copy(model)
    assert not has_adapters(merged) and has_adapters(model)
    base = load_hf_model(tiny_model_dir).state_dict()
    state = model.state_dict()
    name = "model.layers.1.mlp.down_proj"
    delta = state[f"{name}.lora_B.default.weight"] @ state[f"{name}.lora_A.default.weight"] * (8 / 4)
    torch.testing.assert_close(merged.state_dict()[f"{name}.weight"], base[f"{name}.weight"] + delta)
    assert set(merged.state_dict()) == set(base)
    data = batch(model.config.vocab_size)
    torch.testing.assert_close(log_probs(merged, data), log_probs(model, data), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("engine", ["fast", "fast-hf-forward", "hf"])
def test_rollout_engines_generate_with_the_adapters(engine, tiny_model_dir, monkeypatch):
    """The lean decode step merges each adapter into its projection's weight (once per call) and the
    model's own forward applies them: either way greedy tokens are the adapted policy's argmax and the
    fast engine's log-probs are the actor's."""
    model = with_trained_adapters(lora_model(tiny_model_dir)).eval()
    assert lean_decoder_supported(model)
    whole = batch(model.config.vocab_size).batch
    prompts = DataProto.from_dict(
        tensors={k: whole[k][:2, :PROMPT_LEN] for k in ("input_ids", "attention_mask", "position_ids")}
    )
    rollout_cls = get_rollout_class(engine.removesuffix("-hf-forward"))
    options = {"lean": False} if engine == "fast-hf-forward" else {}
    rollout = rollout_cls(model, eos_token_ids=[0], pad_token_id=1, **options)
    sampling = SamplingParams(temperature=1.0, do_sample=False, max_new_tokens=RESPONSE_LEN)
    out = rollout.generate_sequences(prompts, sampling)
    with torch.no_grad():
        ids = prompts.batch["input_ids"]
        for _ in range(RESPONSE_LEN):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    mask = out.batch["response_mask"].bool()
    assert torch.equal(out.batch["responses"][mask], ids[:, PROMPT_LEN:][mask])
    if engine != "hf":
        actor = log_probs(model, out)
        torch.testing.assert_close(out.batch["rollout_log_probs"], actor, atol=1e-5, rtol=1e-5)
    # The base model (adapters disabled) decodes other tokens: the adapters were really applied.
    with adapters_disabled(model):
        base = rollout.generate_sequences(prompts, sampling)
    assert not torch.equal(base.batch["responses"], out.batch["responses"])


def test_lean_decode_of_adapters_is_the_merged_models(tiny_model_dir):
    """The lean step's merged weights give the logits of peft's own merge (``merged_copy``), and which
    adapted modules it can merge: plain LoRA linears; not DoRA, nor an adapted embedding."""
    from verl.workers.rollout.lean_weights import LeanWeights, projection

    model = with_trained_adapters(lora_model(tiny_model_dir)).eval()
    merged = merged_copy(model)
    name = "model.layers.0.self_attn.q_proj"
    weight, _ = projection(model.get_submodule(name))
    torch.testing.assert_close(weight, merged.get_submodule(name).weight, atol=1e-6, rtol=1e-6)
    assert LeanWeights.gather(model).matmul in ("packed", "torch")  # a copy anyway: packed where oneDNN is
    from peft import LoraConfig, get_peft_model

    dora = LoraConfig(r=8, target_modules="all-linear", use_dora=True)
    assert not lean_decoder_supported(get_peft_model(load_hf_model(tiny_model_dir), dora).get_base_model())
    embedding = LoraConfig(r=8, target_modules=["embed_tokens", "q_proj"])
    assert not lean_decoder_supported(
        get_peft_model(load_hf_model(tiny_model_dir), embedding).get_base_model()
    )


def test_round_merged_rounds_bf16_up_as_often_as_the_fraction_says():
    """1 + a quarter of bf16's step at 1 (2^-7): to nearest it is 1, every time; here a quarter of the elements
    round up to 1 + 2^-7 and the rest down to 1, so the mean is the float32 value; the same for negatives."""
    step = 2.0**-7
    weight = torch.full((256, 256), 1 + step / 4)
    assert torch.equal(weight.to(torch.bfloat16).float(), torch.ones(256, 256))
    for sign in (1, -1):
        rounded = round_merged(sign * weight, torch.bfloat16, seed=0)
        assert rounded.dtype == torch.bfloat16 and rounded.shape == weight.shape
        values = rounded.float().unique().tolist()
        assert sorted(abs(v) for v in values) == [1.0, 1 + step]
        up = (rounded.float().abs() > 1).float().mean().item()
        assert abs(up - 0.25) < 0.02
    # values on bf16's grid stay; the same seed rounds the same way; another seed another way
    grid = torch.randn(64, 96).to(torch.bfloat16).float()
    assert torch.equal(round_merged(grid, torch.bfloat16, seed=3).float(), grid)
    noisy = torch.randn(64, 96)
    assert torch.equal(round_merged(noisy, torch.bfloat16, 1), round_merged(noisy, torch.bfloat16, 1))
    assert not torch.equal(round_merged(noisy, torch.bfloat16, 1), round_merged(noisy, torch.bfloat16, 2))
    # float32 is not rounded, float16 to nearest
    assert torch.equal(round_merged(noisy, torch.float32, 0), noisy)
    assert torch.equal(round_merged(noisy, torch.float16, 0), noisy.to(torch.float16))


def test_lean_decode_keeps_a_small_update_to_a_bf16_base(tiny_model_dir, monkeypatch):
    """The bf16 actor holds its LoRA base in bf16; the lean decode's merged weight in bf16 must still carry an
    update under half a bf16 step (the first steps' adapters), which rounding to nearest drops."""
    from verl.utils.precision import compute_in, hold_frozen_weights_in
    from verl.workers.rollout.lean_weights import LeanWeights

    monkeypatch.setattr(LeanWeights, "matmul_override", "torch")  # F.linear: the weight kept readable
    model = with_trained_adapters(lora_model(tiny_model_dir)).eval()
    hold_frozen_weights_in(model, torch.bfloat16)
    layers = [layer.mlp.down_proj for layer in model.model.layers]
    with torch.no_grad():
        for layer in layers:
            layer.lora_B["default"].weight.mul_(5e-6 / layer.get_delta_weight("default").abs().mean())
        base = torch.cat([layer.base_layer.weight.float().flatten() for layer in layers])
        delta = torch.cat([layer.get_delta_weight("default").float().flatten() for layer in layers])
        with compute_in(torch.bfloat16):
            weights = LeanWeights.gather(model)
    decoded = torch.cat([w.down.weight.flatten() for w in weights.layers])
    assert decoded.dtype == torch.bfloat16

    def kept(w: torch.Tensor) -> float:
        return float((w.float() - base) @ delta / (delta @ delta))

    assert kept((base + delta).to(torch.bfloat16)) < 0.5  # most of the update lost to nearest rounding
    assert 0.8 < kept(decoded) < 1.2


def test_a_target_module_that_matches_nothing_names_the_key_and_the_layers(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.target_modules=\['qproj'\]") as error:
        lora_model(tiny_model_dir, target_modules=["qproj"])
    assert "q_proj, k_proj, v_proj" in str(error.value) and "Traceback" not in str(error.value)
    with pytest.raises(
        ConfigError, match=r"target_modules=.* with actor_rollout_ref\.model\.exclude_modules"
    ):
        lora_model(tiny_model_dir, target_modules=["q_proj"], exclude_modules=["q_proj"])


def test_checkpoint_round_trip_of_a_lora_actor(tiny_model_dir, tmp_path):
    model = with_trained_adapters(lora_model(tiny_model_dir))
    cfg = actor_cfg()
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    actor = Actor(model, cfg, optimizer, build_lr_scheduler(optimizer, cfg.optim, 1), seed=0)
    actor.save_checkpoint(tmp_path / "actor", rank=0)
    assert (tmp_path / "actor" / ADAPTER_CONFIG).is_file()

    fresh = lora_model(tiny_model_dir)  # adapters initialised afresh
    optimizer = build_optimizer(fresh.parameters(), cfg.optim)
    restored = Actor(fresh, cfg, optimizer, build_lr_scheduler(optimizer, cfg.optim, 1), seed=0)
    restored.load_checkpoint(tmp_path / "actor", rank=0)
    saved = model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in fresh.state_dict().items())

    plain = load_hf_model(tiny_model_dir)
    optimizer = build_optimizer(plain.parameters(), cfg.optim)
    without = Actor(plain, cfg, optimizer, build_lr_scheduler(optimizer, cfg.optim, 1), seed=0)
    with pytest.raises(ValueError, match=r"trained with actor_rollout_ref\.model\.lora_rank=8, but this run"):
        without.load_checkpoint(tmp_path / "actor", rank=0)


# ------------------------------------------------------------------------------------------------ validation


def test_lora_keys_are_validated():
    with pytest.raises(ConfigError) as error:
        load_config(
            "grpo",
            [
                f"{ARR}.model.path=/nowhere",
                f"{ARR}.model.lora_rank=-1",
                f"{ARR}.model.lora_alpha=0",
                f"{ARR}.model.target_modules=[]",
            ],
        )
    message = str(error.value)
    assert f"{ARR}.model.lora_rank must be >= 0; got -1" in message
    assert f"{ARR}.model.lora_alpha must be > 0; got 0" in message
    assert f"{ARR}.model.target_modules must be a module name" in message
    config = load_config(
        "grpo",
        [f"{ARR}.model.path=/nowhere", f"{ARR}.model.lora_rank=8", f"{ARR}.model.target_modules=[q_proj]"],
    )
    assert config[ARR].model.lora_rank == 8 and list(config[ARR].model.target_modules) == ["q_proj"]


def test_lora_adapter_path_is_accepted_as_in_verl():
    config = load_config("grpo", [f"{ARR}.model.path=/nowhere", f"{ARR}.model.lora_adapter_path=/adapters/a"])
    assert config[ARR].model.lora_adapter_path == "/adapters/a" and not config.compat.no_effect


def test_lora_without_peft_says_what_to_install(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a)
    )
    with pytest.raises(
        ConfigError, match=rf"{ARR}\.model\.lora_rank=8 needs the peft package.*pip install peft"
    ):
        load_config("grpo", [f"{ARR}.model.path=/nowhere", f"{ARR}.model.lora_rank=8"])
    load_config("grpo", [f"{ARR}.model.path=/nowhere"])  # LoRA off: peft is not needed


# ------------------------------------------------------------------------------------------------ override_config


def test_override_config_changes_the_loaded_config(tiny_model_dir):
    overrides = OmegaConf.create({"max_position_embeddings": 4096, "attention_dropout": 0.25})
    model = load_hf_model(tiny_model_dir, override_config=overrides)
    assert model.config.max_position_embeddings == 4096 and model.config.attention_dropout == 0.25
    plain = load_hf_model(tiny_model_dir)
    assert plain.config.max_position_embeddings != 4096
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in model.state_dict().items())
    critic = load_value_model(tiny_model_dir, override_config={"attention_dropout": 0.5})
    assert critic.config.attention_dropout == 0.5 and critic.config.num_labels == 1


def test_an_unknown_override_names_the_key_and_the_config_class(tiny_model_dir):
    key = f"{ARR}.model.override_config"
    with pytest.raises(
        ConfigError,
        match=rf"{key}\.max_position_embedding: Qwen2Config has no attribute 'max_position_embedding'; "
        r"did you mean 'max_position_embeddings'\?",
    ):
        load_hf_model(tiny_model_dir, override_config={"max_position_embedding": 8}, override_key=key)


def test_an_override_the_weights_cannot_take_names_the_overrides(tiny_model_dir):
    with pytest.raises(
        ConfigError, match=r"critic\.model\.override_config=\{'hidden_size': 32\}: .* cannot be loaded"
    ):
        load_value_model(
            tiny_model_dir, override_config={"hidden_size": 32}, override_key="critic.model.override_config"
        )


def test_critic_has_its_own_override_config():
    config = load_config(
        "ppo", [f"{ARR}.model.path=/nowhere", "critic.model.override_config.attention_dropout=0.0"]
    )
    assert dict(config.critic.model.override_config) == {"attention_dropout": 0.0}


def test_a_raised_position_limit_counts_when_checking_the_lengths(tiny_model_dir):
    limit = model_config_dict(tiny_model_dir)["max_position_embeddings"]
    with pytest.raises(ConfigError, match=f"max_position_embeddings = {limit}"):
        check_fits_model(tiny_model_dir, 2 * limit, "data.max_prompt_length + data.max_response_length")
    raised = OmegaConf.create({"max_position_embeddings": 2 * limit})
    check_fits_model(tiny_model_dir, 2 * limit, "data.max_prompt_length", overrides=raised)


def test_adapters_skip_peft_input_casts_with_the_same_numbers(tiny_model_dir):
    """fp32 base and adapters: peft's cast of each adapter input to fp32 is switched off (under bf16 autocast
    it only made copies autocast undid); the bf16-autocast logits and gradients are the same with it on."""
    model = with_trained_adapters(lora_model(tiny_model_dir))
    adapted = [m for m in model.modules() if hasattr(m, "lora_A")]
    assert adapted and not any(m.cast_input_dtype_enabled for m in adapted)
    ids = batch(model.config.vocab_size).batch["input_ids"]

    def run(cast: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        for module in adapted:
            module.cast_input_dtype_enabled = cast
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        logits.float().square().mean().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    (logits_off, grads_off), (logits_on, grads_on) = run(False), run(True)
    assert torch.equal(logits_off, logits_on)
    for off, on in zip(grads_off, grads_on, strict=True):
        torch.testing.assert_close(off, on, atol=1e-6, rtol=1e-5)
