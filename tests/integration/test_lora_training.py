"""LoRA RL through the normal trainer: the base weights stay, the adapters learn, a resumed run is the same
run, and ``verl export`` writes a plain HuggingFace model with the adapters merged."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from _fp32 import FP32
from _small_run import small_run
from _weights import assert_same_adam_update
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from verl.config import load_config
from verl.config.schema import ActorConfig, ModelConfig
from verl.models import load_hf_model
from verl.models.lora import ADAPTER_CONFIG, apply_lora, has_adapters
from verl.protocol import DataProto
from verl.trainer.checkpointing import export_hf
from verl.trainer.metrics import WALL_CLOCK_PREFIXES
from verl.trainer.rl_trainer import RLTrainer
from verl.workers.actor import Actor
from verl.workers.engine.distributed import destroy_distributed, init_distributed
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer

pytest.importorskip("peft")
pytestmark = pytest.mark.slow

RANK, ALPHA, STEPS = 8, 16, 3


def lora_config(model_dir, files, out_dir, *extra):
    return load_config(
        "grpo",
        [
            *small_run(model_dir, files),
            f"actor_rollout_ref.model.lora_rank={RANK}",
            f"actor_rollout_ref.model.lora_alpha={ALPHA}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 optimizer steps: old log-probs
            "actor_rollout_ref.actor.use_kl_loss=true",  # the reference pass runs
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
            "actor_rollout_ref.rollout.n=4",
            f"trainer.total_training_steps={STEPS}",
            "trainer.test_freq=-1",
            "trainer.save_freq=1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out_dir}",
            "prepare.enable=false",
            *FP32,  # the exported model and the actor compared in exact arithmetic
            *extra,
        ],
    )


def parity_reward(data, return_dict=False):
    """Share of even token ids in the response, on its last token: random samples differ in it."""
    mask = data.batch["response_mask"].float()
    even = ((data.batch["responses"] % 2 == 0).float() * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    reward = torch.zeros_like(mask)
    reward[torch.arange(len(mask)), (mask.sum(-1) - 1).clamp_min(0).long()] = even
    return {"reward_tensor": reward, "reward_extra_info": {}} if return_dict else reward


def metrics_by_step(out_dir):
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_PREFIXES)} for r in rows}


def train(config):
    """Fit ``config``; the trained actor module (still carrying its adapters)."""
    trainer = RLTrainer(config, reward_fn=parity_reward)
    try:
        trainer.fit()
        return trainer.controller.group("actor_rollout").workers[0].actor_model
    finally:
        trainer.shutdown()


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, arithmetic_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora-run")
    return out, train(lora_config(tiny_model_dir, arithmetic_files, out))


def test_lora_rl_trains_the_adapters_only(lora_run, tiny_model_dir):
    out, actor = lora_run
    assert has_adapters(actor)
    base = load_hf_model(tiny_model_dir).state_dict()
    state = actor.state_dict()
    frozen = {k.replace(".base_layer", ""): v for k, v in state.items() if ".lora_" not in k}
    # (computing in bf16 the frozen base is held in bf16: verl.utils.precision.hold_frozen_weights_in)
    assert frozen.keys() == base.keys() and all(
        torch.equal(v, base[k].to(v.dtype)) for k, v in frozen.items()
    )
    adapters_b = [v for k, v in state.items() if ".lora_B." in k]
    assert adapters_b and all(v.abs().max() > 0 for v in adapters_b)  # B starts at 0: it learned
    last = metrics_by_step(out)[STEPS]
    assert last["actor/grad_norm"] > 0 and "actor/kl_loss" in last
    part = out / f"global_step_{STEPS}" / "actor"
    assert (part / ADAPTER_CONFIG).is_file() and (part / "base_model.json").is_file()
    saved = load_file(part / "model.safetensors")  # the adapters alone: the base comes from model.path
    assert saved.keys() == {k for k in state if ".lora_" in k}


def test_export_merges_the_adapters_into_a_plain_model(lora_run, tiny_model_dir, tmp_path):
    out, actor = lora_run
    exported = export_hf(out / f"global_step_{STEPS}", tmp_path / "hf")
    assert not (exported / ADAPTER_CONFIG).exists()
    model = AutoModelForCausalLM.from_pretrained(exported).eval()  # plain transformers: no peft involved
    assert not has_adapters(model)
    base_model = load_hf_model(tiny_model_dir).eval()
    merged, base, trained = model.state_dict(), base_model.state_dict(), actor.state_dict()
    assert merged.keys() == base.keys()
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        delta = trained[f"{name}.lora_B.default.weight"] @ trained[f"{name}.lora_A.default.weight"]
        torch.testing.assert_close(merged[f"{name}.weight"], base[f"{name}.weight"] + delta * (ALPHA / RANK))
    ids = torch.arange(3, 15)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        assert not torch.allclose(logits, base_model(input_ids=ids).logits, atol=1e-4)
        torch.testing.assert_close(logits, actor.eval()(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_a_resumed_lora_run_is_the_same_run(lora_run, tiny_model_dir, arithmetic_files, tmp_path):
    out, actor = lora_run
    config = lora_config(
        tiny_model_dir, arithmetic_files, tmp_path, f"trainer.resume_mode={out / 'global_step_1'}"
    )
    resumed = train(config)
    expected, got = metrics_by_step(out), metrics_by_step(tmp_path)
    assert sorted(got) == list(range(2, STEPS + 1))  # it resumed: step 1 came from the checkpoint
    for step in range(2, STEPS + 1):
        assert got[step] == expected[step], f"step {step} differs after resuming from step 1"
    trained = actor.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in resumed.state_dict().items())


# ------------------------------------------------------------------------------------------------ data parallel

DP_BATCH, DP_PROMPT, DP_RESPONSE, DP_LR = 8, 4, 4, 1e-2


def dp_update(model_dir, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """One LoRA policy update of this rank's contiguous share of a fixed batch (one global mini-batch, two
    micro-batches per rank); the weights after it. Under DDP only the adapters are reduced."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 200, (DP_BATCH, DP_PROMPT + DP_RESPONSE), generator=g)
    mask = torch.ones_like(input_ids)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": mask.cumsum(-1) - 1,
        "responses": input_ids[:, DP_PROMPT:],
        "response_mask": torch.ones(DP_BATCH, DP_RESPONSE),
        "advantages": torch.randn(DP_BATCH, DP_RESPONSE, generator=g),
    }
    shard = DP_BATCH // world_size
    data = DataProto.from_dict(tensors={k: v[rank * shard : (rank + 1) * shard] for k, v in tensors.items()})
    torch.manual_seed(0)  # the same adapters everywhere (DDP would broadcast rank 0's anyway)
    model_cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), {"lora_rank": RANK})
    model = apply_lora(load_hf_model(model_dir), model_cfg)
    cfg = OmegaConf.merge(OmegaConf.structured(ActorConfig), {"optim": {"lr": DP_LR, "lr_warmup_steps": 0}})
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    actor = Actor(model, cfg, optimizer, build_lr_scheduler(optimizer, cfg.optim, 1), seed=0)
    data.batch["old_log_probs"] = actor.compute_log_prob(data, None, temperature=1.0)[0]
    actor.update_policy(data, mini_batch_size=DP_BATCH, micro_batch_size=2, temperature=1.0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _dp_worker(rank: int, world_size: int, port: int, model_dir, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    assert init_distributed("gloo")
    try:
        torch.save(dp_update(model_dir, rank, world_size), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        destroy_distributed()


def test_data_parallel_lora_update_matches_one_process(tiny_model_dir, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = dp_update(tiny_model_dir, 0, 1)
    finally:
        torch.set_num_threads(threads)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_dp_worker, args=(2, port, tiny_model_dir, str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    base = load_hf_model(tiny_model_dir).state_dict()
    for weights in ranks:
        assert all(torch.equal(weights[k], ranks[0][k]) for k in weights)  # the ranks agree exactly
        frozen = {k.replace(".base_layer", ""): v for k, v in weights.items() if ".lora_" not in k}
        assert all(torch.equal(v, base[k]) for k, v in frozen.items())
    adapters = {k: v for k, v in ranks[0].items() if ".lora_" in k}
    assert all(v.abs().max() > 0 for k, v in adapters.items() if ".lora_B." in k)  # they moved from 0
    assert_same_adam_update(adapters, {k: single[k] for k in adapters}, DP_LR, optimizer_steps=1)
