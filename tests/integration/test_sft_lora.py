"""`verl sft` on whole chats (data.messages_key) and with LoRA (model.lora_rank): the loss goes down, and
the saved model is a plain transformers directory (adapters merged, no peft needed to load it)."""

from __future__ import annotations

import json

import pytest
import torch

from verl.config import SFTConfig, load_config
from verl.data import SFTDataset, collate_sft, write_rows
from verl.models import load_tokenizer
from verl.trainer.sft_trainer import run_sft, sft_loss

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    """Arithmetic chats: one or two question/answer turns, some with a system message."""
    rows = []
    for a in range(8):
        for b in range(8):
            chat = [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]
            if (a + b) % 3 == 0:
                chat = [{"role": "system", "content": "You add numbers."}, *chat]
            if a % 2:
                chat += [
                    {"role": "user", "content": f"{b}+{a}="},
                    {"role": "assistant", "content": str(a + b)},
                ]
            rows.append({"messages": chat, "data_source": "chat"})
    return write_rows(tmp_path_factory.mktemp("chats") / "chats.parquet", rows)


def sft_config(model_dir, train, out, steps, *extra):
    return load_config(
        schema=SFTConfig,
        overrides=[
            f"model.path={model_dir}",
            f"data.train_files={train}",
            "data.messages_key=messages",
            "data.max_length=64",
            "data.train_batch_size=16",
            f"trainer.total_training_steps={steps}",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}",
            "optim.lr_warmup_steps=2",
            *extra,
        ],
    )


def losses(out):
    return [json.loads(line)["train/loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def held_loss(model_dir, train, tokenizer):
    from verl.models import load_hf_model

    ds = SFTDataset(train, tokenizer, messages_key="messages", max_length=64)
    batch = collate_sft([ds[i] for i in range(16)], tokenizer.pad_token_id)
    with torch.no_grad():
        return sft_loss(load_hf_model(model_dir), batch).item()


def test_sft_on_chats_learns(tiny_model_dir, chat_file, tmp_path):
    out = tmp_path / "sft"
    run_sft(sft_config(tiny_model_dir, chat_file, out, 20, "optim.lr=3e-3"))
    seen = losses(out)
    assert len(seen) == 20
    assert sum(seen[-5:]) / 5 < 0.7 * sum(seen[:5]) / 5
    tokenizer = load_tokenizer(out)
    assert held_loss(out, chat_file, tokenizer) < held_loss(tiny_model_dir, chat_file, tokenizer)


def test_sft_lora_saves_a_merged_plain_model(tiny_model_dir, chat_file, tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora"
    run_sft(sft_config(tiny_model_dir, chat_file, out, 10, "model.lora_rank=8", "optim.lr=1e-2"))
    assert losses(out)[-1] < losses(out)[0]
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" in names and "config.json" in names
    assert not [n for n in names if n.startswith("adapter_")], names

    trained = AutoModelForCausalLM.from_pretrained(out)  # plain transformers, no peft
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trained_state, base_state = trained.state_dict(), base.state_dict()
    assert trained_state.keys() == base_state.keys()
    assert not any("lora" in k for k in trained_state)
    changed = [k for k in base_state if not torch.equal(trained_state[k], base_state[k])]
    # The adapters sit on the linear layers; merged, they change those weights and nothing else.
    assert any("q_proj" in k for k in changed) and any("mlp" in k for k in changed)
    assert all(k.endswith(".weight") and "norm" not in k and "embed" not in k for k in changed), changed
    tokenizer = load_tokenizer(out)
    assert held_loss(out, chat_file, tokenizer) < held_loss(tiny_model_dir, chat_file, tokenizer)
