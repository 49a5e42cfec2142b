"""LoRA as verl users expect it, on the worker itself (dp and fsdp2, one rank): the reference is the actor's
module with its adapters disabled (no second copy), checkpoints hold the adapters alone and check the base
they resume on, ``verl export`` writes the merged model or a PEFT adapter that both generate what the
trained policy generates, and ``lora_adapter_path`` starts from a saved adapter."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests._fp32 import FP32
from verl.config import load_config
from verl.errors import InputError
from verl.models import load_hf_model
from verl.models.base_fingerprint import FILE_NAME as FINGERPRINT
from verl.models.lora import ADAPTER_CONFIG, adapters_disabled
from verl.protocol import DataProto
from verl.trainer.checkpointing import export_hf
from verl.workers.actor import compute_log_prob
from verl.workers.engine.fsdp import gathered
from verl.workers.engine.scoring import PolicyScorer
from verl.workers.roles import ActorRolloutRefWorker

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow

ARR = "actor_rollout_ref"
RANK, ALPHA, TARGETS = 4, 32, ["q_proj", "v_proj", "up_proj"]
ROWS, PROMPT, RESPONSE = 4, 5, 4


def worker(model_dir, *extra: str, strategy: str = "dp", lora: bool = True) -> ActorRolloutRefWorker:
    keys = [f"{ARR}.model.lora_rank={RANK}", f"{ARR}.model.lora_alpha={ALPHA}"] if lora else []
    config = load_config(
        "grpo",
        [
            f"{ARR}.model.path={model_dir}",
            *keys,
            f"{ARR}.model.target_modules=[{','.join(TARGETS)}]",
            f"{ARR}.actor.optim.lr=1e-2",
            f"{ARR}.actor.optim.lr_warmup_steps=0",
            f"{ARR}.actor.strategy={strategy}",
            f"{ARR}.actor.shuffle=false",
            *FP32,  # sharded and replicated, adapters on and off, compared in exact arithmetic
            *extra,
        ],
    )
    return ActorRolloutRefWorker(config, need_ref=True)


def batch() -> DataProto:
    """Random prompts, each answered ``7 11 7 11`` with advantage +1: a few updates make the adapted policy's
    greedy answer differ from the base model's."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (ROWS, PROMPT + RESPONSE), generator=g)
    ids[:, PROMPT:] = torch.tensor([7, 11, 7, 11])
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": mask.cumsum(-1) - 1,
            "responses": ids[:, PROMPT:],
            "response_mask": torch.ones(ROWS, RESPONSE),
            "advantages": torch.ones(ROWS, RESPONSE),
        }
    )


def actor_log_probs(w: ActorRolloutRefWorker, data: DataProto) -> torch.Tensor:
    return w.actor.compute_log_prob(data, None, temperature=1.0)[0]


def ref_log_probs(w: ActorRolloutRefWorker, data: DataProto) -> torch.Tensor:
    return w.compute_ref_log_prob(data).batch["ref_log_prob"]


def train(w: ActorRolloutRefWorker, data: DataProto, steps: int = 3) -> None:
    for _ in range(steps):
        data.batch["old_log_probs"] = actor_log_probs(w, data)
        w.actor.update_policy(data, mini_batch_size=ROWS, micro_batch_size=2, temperature=1.0)


def greedy(model: torch.nn.Module, data: DataProto, scorer: torch.nn.Module | None = None) -> torch.Tensor:
    prompt = data.batch["input_ids"][:, :PROMPT]
    with torch.no_grad(), gathered(scorer if scorer is not None else model):
        return model.eval().generate(
            input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False
        )


def as_checkpoint(w: ActorRolloutRefWorker, root: Path) -> Path:
    """``w``'s actor part in a checkpoint directory, with what the driver adds (trainer_state.pt, config.yaml)."""
    step = root / "global_step_1"
    w.save_checkpoint(str(step / "actor"))
    torch.save({"global_step": 1}, step / "trainer_state.pt")
    OmegaConf.save(w.config, step / "config.yaml")
    return step


def parameters_reachable(w: ActorRolloutRefWorker) -> dict[int, torch.nn.Parameter]:
    """Every parameter a module held by the worker, or by one of its attributes' objects, reaches."""
    found: dict[int, torch.nn.Parameter] = {}
    for value in vars(w).values():
        holders = [value, *vars(value).values()] if hasattr(value, "__dict__") else [value]
        for module in holders:
            if isinstance(module, torch.nn.Module):
                found.update((id(p), p) for p in module.parameters())
    return found


@pytest.fixture(scope="module", params=["dp", "fsdp2"])
def trained(request, tiny_model_dir, tmp_path_factory):
    """A LoRA worker after 3 updates, its checkpoint, and the batch it trained on."""
    w = worker(tiny_model_dir, strategy=request.param)
    data = batch()
    before_ref = ref_log_probs(w, data)
    train(w, data)
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    return w, as_checkpoint(w, root), data, before_ref


# ------------------------------------------------------------------------------------------------ reference


def test_the_reference_is_the_actor_with_its_adapters_disabled(trained, tiny_model_dir):
    w, _, data, before = trained
    assert w.ref_in_actor and w.ref_model is None and w.ref_scorer is None
    base = load_hf_model(tiny_model_dir, attn_implementation=w.actor_model.config._attn_implementation)
    scorer = w.actor.scorer
    copy_scorer = PolicyScorer(base, scorer.remove_padding, scorer.chunk_size, scorer.share_prompts)
    separate = compute_log_prob(copy_scorer, data, None, temperature=1.0)[0]
    ref = ref_log_probs(w, data)
    torch.testing.assert_close(ref, separate, atol=1e-6, rtol=0)
    assert torch.equal(ref, before)  # the updates moved the adapters, never the reference
    actor = actor_log_probs(w, data)
    assert (actor - ref).abs().max() > 0.1  # the trained adapters are back on after the reference pass
    assert torch.equal(actor_log_probs(w, data), actor)
    trainable = {n for n, p in w.actor_model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)


def test_the_worker_holds_no_second_copy_of_the_weights(trained, tiny_model_dir):
    w = trained[0]
    mine = parameters_reachable(w)
    actor = {id(p) for p in w.actor_model.parameters()}
    assert set(mine) == actor
    plain = worker(tiny_model_dir, lora=False)  # without LoRA the reference is a copy: the count sees it
    assert len(parameters_reachable(plain)) == 2 * len(list(plain.actor_model.parameters()))


def test_adapters_come_back_after_an_exception(trained):
    w, _, data, _ = trained
    flags = {n: p.requires_grad for n, p in w.actor_model.named_parameters()}
    expected = actor_log_probs(w, data)
    with pytest.raises(RuntimeError, match="boom"), adapters_disabled(w.actor_model):
        assert not any(p.requires_grad for p in w.actor_model.parameters())
        raise RuntimeError("boom")
    assert {n: p.requires_grad for n, p in w.actor_model.named_parameters()} == flags
    assert torch.equal(actor_log_probs(w, data), expected)


# ------------------------------------------------------------------------------------------------ checkpoints


def test_a_lora_checkpoint_holds_the_adapters_and_their_optimizer_only(trained, tiny_model_dir, tmp_path):
    w, step, _, _ = trained
    part = step / "actor"
    config = json.loads((part / ADAPTER_CONFIG).read_text())
    assert (
        config["r"] == RANK
        and config["lora_alpha"] == ALPHA
        and sorted(config["target_modules"]) == sorted(TARGETS)
    )
    fingerprint = json.loads((part / FINGERPRINT).read_text())
    assert fingerprint["path"] == str(tiny_model_dir) and "config.json" in fingerprint["files"]
    if w.actor.sharded:
        import torch.distributed.checkpoint as dcp

        keys = list(dcp.FileSystemReader(str(part / "model_optim")).read_metadata().state_dict_metadata)
        weights = [k.removeprefix("model.") for k in keys if k.startswith("model.")]
        optimizer = {k.split(".state.", 1)[1].rsplit(".", 1)[0] for k in keys if k.startswith("optim.state.")}
    else:
        with safe_open(str(part / "model.safetensors"), "pt") as f:
            weights = list(f.keys())
        optimizer = set()
    assert weights and all(".lora_" in k for k in weights)  # no frozen base weight
    assert len(weights) == 2 * len(TARGETS) * w.actor_model.config.num_hidden_layers
    assert optimizer <= set(weights)

    full = worker(tiny_model_dir, lora=False, strategy="fsdp2" if w.actor.sharded else "dp")
    full.save_checkpoint(str(tmp_path / "full"))
    lora_bytes = sum(
        f.stat().st_size for f in part.rglob("*") if f.is_file() and "huggingface" not in f.parts
    )
    full_bytes = sum(
        f.stat().st_size
        for f in (tmp_path / "full").rglob("*")
        if f.is_file() and "huggingface" not in f.parts
    )
    print(f"checkpoint part without huggingface/: LoRA {lora_bytes} bytes, full {full_bytes} bytes")
    assert lora_bytes * 4 < full_bytes


def test_a_resume_is_exact_and_takes_the_base_from_model_path(trained, tiny_model_dir, tmp_path):
    w, step, data, _ = trained
    strategy = "fsdp2" if w.actor.sharded else "dp"
    moved = Path(shutil.copytree(tiny_model_dir, tmp_path / "moved"))  # the same files elsewhere: accepted
    resumed = worker(moved, strategy=strategy)
    resumed.load_checkpoint(str(step / "actor"))
    assert torch.equal(actor_log_probs(resumed, data), actor_log_probs(w, data))
    assert torch.equal(ref_log_probs(resumed, data), ref_log_probs(w, data))
    # ... and trains on exactly as the original does: same adapters, optimizer state and LR schedule
    state = w.get_state()  # (the original is shared with the other tests: put back after)
    try:
        train(w, data, steps=1)
        train(resumed, data, steps=1)
        assert torch.equal(actor_log_probs(resumed, data), actor_log_probs(w, data))
    finally:
        w.set_state(state)


def other_base(model_dir: Path, out: Path) -> Path:
    """A model of the same architecture and shapes as ``model_dir`` with other weights (another fine-tune)."""
    model = load_hf_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def test_a_resume_on_another_base_model_is_refused(trained, tiny_model_dir, tmp_path):
    w, step, _, _ = trained
    other = worker(other_base(tiny_model_dir, tmp_path / "other"), strategy="dp")
    with pytest.raises(
        InputError, match=rf"{ARR}\.model\.path=.*other is not the base model .* model.safetensors"
    ):
        other.load_checkpoint(str(step / "actor"))
    with pytest.raises(InputError, match=r"--base-model=.*other is not the base model"):
        export_hf(step, tmp_path / "out", base_model=str(tmp_path / "other"))


# ------------------------------------------------------------------------------------------------ export


def test_merged_and_adapter_exports_generate_what_the_trained_policy_generates(
    trained, tiny_model_dir, tmp_path
):
    w, step, data, _ = trained
    live = greedy(w.actor_model, data, w.actor.scorer)
    base_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(live, greedy(base_model, data))  # the adapters changed the greedy answers

    merged_dir = export_hf(step, tmp_path / "merged")
    assert not (merged_dir / ADAPTER_CONFIG).exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert torch.equal(greedy(merged, data), live)

    adapter_dir = export_hf(step, tmp_path / "adapter", adapter=True)
    assert {p.name for p in adapter_dir.iterdir()} >= {ADAPTER_CONFIG, "adapter_model.safetensors"}
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (
        RANK,
        ALPHA,
        sorted(TARGETS),
    )
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all(n.startswith("base_model.model.") and ".default." not in n for n in names)
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir)
    assert torch.equal(greedy(loaded, data), live)

    with pytest.raises(InputError, match="is not empty"):
        export_hf(step, adapter_dir, adapter=True)
    export_hf(step, adapter_dir, adapter=True, overwrite=True)


def test_exporting_the_adapter_of_a_checkpoint_without_lora_is_refused(tiny_model_dir, tmp_path):
    step = as_checkpoint(worker(tiny_model_dir, lora=False), tmp_path)
    with pytest.raises(InputError, match=r"--adapter: .* was not trained with LoRA"):
        export_hf(step, tmp_path / "out", adapter=True)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ lora_adapter_path


def test_lora_adapter_path_starts_from_the_saved_adapter(trained, tiny_model_dir, tmp_path, caplog):
    w, step, data, _ = trained
    adapter_dir = export_hf(step, tmp_path / "adapter", adapter=True)
    # lora_rank=0: the adapter alone turns LoRA on and brings its rank (verl's rule)
    started = worker(tiny_model_dir, f"{ARR}.model.lora_adapter_path={adapter_dir}", lora=False)
    torch.testing.assert_close(actor_log_probs(started, data), actor_log_probs(w, data), atol=1e-6, rtol=0)
    assert started.ref_in_actor
    torch.testing.assert_close(ref_log_probs(started, data), ref_log_probs(w, data), atol=1e-6, rtol=0)
    assert all(".lora_" in n for n, p in started.actor_model.named_parameters() if p.requires_grad)
    with caplog.at_level(logging.WARNING):
        other_keys = worker(
            tiny_model_dir, f"{ARR}.model.lora_adapter_path={adapter_dir}", f"{ARR}.model.lora_rank=8"
        )
    assert other_keys.actor_model.peft_config["default"].r == RANK  # the adapter's own config wins
    assert f"{ARR}.model.lora_rank=8 (the adapter's: {RANK})" in caplog.text


def test_a_lora_adapter_path_that_is_no_adapter_names_the_key(tiny_model_dir, tmp_path):
    key = rf"{ARR}\.model\.lora_adapter_path"
    with pytest.raises(InputError, match=rf"{key}=.*nowhere: does not exist"):
        worker(tiny_model_dir, f"{ARR}.model.lora_adapter_path={tmp_path / 'nowhere'}")
    with pytest.raises(InputError, match=rf"{key}=.* has no adapter_config.json"):
        worker(tiny_model_dir, f"{ARR}.model.lora_adapter_path={tiny_model_dir}")
    # An adapter that also trains weights outside lora_A / lora_B (which checkpoints, the reference and the
    # engines do not know) is refused before anything loads.
    from verl.models.lora import check_adapter_dir

    for extra, said in (
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "lora_only"}, "bias"),
    ):
        adapter = tmp_path / said
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, **extra}))
        (adapter / "adapter_model.safetensors").write_bytes(b"")
        with pytest.raises(InputError, match=rf"{key}=.*trains weights outside its LoRA layers \({said}="):
            check_adapter_dir(adapter, f"{ARR}.model.lora_adapter_path")


# ------------------------------------------------------------------------------------------------ two FSDP2 ranks


def _two_rank_worker(rank: int, port: int, model_dir: Path, out: Path) -> None:
    """One of two FSDP2 ranks (every weight sharded over both): reference and actor log-probs before and
    after 3 updates, then a checkpoint written by both."""
    import os

    from verl.workers.engine.distributed import destroy_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        w = worker(model_dir, "trainer.torch_threads=1", strategy="fsdp2")
        data = batch()
        before = ref_log_probs(w, data)
        train(w, data)
        result = {"before": before, "ref": ref_log_probs(w, data), "actor": actor_log_probs(w, data)}
        w.save_checkpoint(str(out / "actor"))
        if rank == 0:
            torch.save(result, out / "result.pt")
    finally:
        destroy_distributed()


def test_two_sharded_ranks_disable_their_adapters_and_save_the_adapters_alone(tiny_model_dir, tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_two_rank_worker, args=(port, tiny_model_dir, tmp_path), nprocs=2)
    result = torch.load(tmp_path / "result.pt")
    one = worker(tiny_model_dir)  # one dp rank reads the two ranks' shards
    scorer = one.actor.scorer
    base = load_hf_model(tiny_model_dir, attn_implementation=one.actor_model.config._attn_implementation)
    copy_scorer = PolicyScorer(base, scorer.remove_padding, scorer.chunk_size, scorer.share_prompts)
    separate = compute_log_prob(copy_scorer, batch(), None, temperature=1.0)[0]
    torch.testing.assert_close(result["ref"], separate, atol=1e-6, rtol=0)
    torch.testing.assert_close(result["before"], result["ref"], atol=1e-6, rtol=0)
    assert (result["actor"] - result["ref"]).abs().max() > 0.1
    one.load_checkpoint(str(tmp_path / "actor"))
    torch.testing.assert_close(actor_log_probs(one, batch()), result["actor"], atol=1e-6, rtol=0)


def test_verl_export_adapter_on_the_command_line(trained, tmp_path, capsys):
    from verl.cli import main

    step = trained[1]
    assert main(["export", str(step), str(tmp_path / "a"), "--adapter"]) == 0
    assert "PEFT adapter written to" in capsys.readouterr().out
    assert main(["export", str(step), str(tmp_path / "b"), "--format", "adapter"]) == 0
    assert (tmp_path / "a" / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "b" / "adapter_model.safetensors"
    ).read_bytes()
    assert main(["export", str(step), str(tmp_path / "a"), "--adapter"]) == 3  # not empty: refused
    assert "is not empty" in capsys.readouterr().err
