"""SFT: the loss goes down on the answer tokens and the result is a loadable HF directory."""

from __future__ import annotations

import json

import pytest
import torch

from verl.config import SFTConfig, load_config
from verl.data import SFTDataset, collate_sft
from verl.models import load_hf_model, load_tokenizer
from verl.trainer.sft_trainer import run_sft, sft_loss

pytestmark = pytest.mark.slow


def test_sft_learns_and_saves(tiny_model_dir, arithmetic_files, tmp_path):
    train, _ = arithmetic_files
    out = tmp_path / "sft"
    config = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"data.train_files={train}",
            "data.train_batch_size=16",
            "trainer.total_training_steps=30",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}",
            "optim.lr=3e-3",
            "optim.lr_warmup_steps=5",
        ],
        schema=SFTConfig,
    )
    run_sft(config)
    losses = [json.loads(line)["train/loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5

    tokenizer = load_tokenizer(out)
    batch = collate_sft([SFTDataset(train, tokenizer)[i] for i in range(8)], tokenizer.pad_token_id)
    with torch.no_grad():
        trained = sft_loss(load_hf_model(out), batch).item()
        untrained = sft_loss(load_hf_model(tiny_model_dir), batch).item()
    assert trained < untrained


def test_sft_loss_only_counts_answer_tokens(tiny_model_dir, arithmetic_files):
    train, _ = arithmetic_files
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_hf_model(tiny_model_dir)
    batch = collate_sft([SFTDataset(train, tokenizer)[0]], tokenizer.pad_token_id)
    with torch.no_grad():
        base = sft_loss(model, batch).item()
        # Changing a prompt token changes the context but the prompt itself is never a target:
        # zeroing the loss mask except one answer token must give exactly that token's loss.
        answer_positions = batch["loss_mask"][0].nonzero().flatten()
        one = dict(batch, loss_mask=torch.zeros_like(batch["loss_mask"]))
        one["loss_mask"][0, answer_positions[0]] = 1
        logits = model(input_ids=batch["input_ids"]).logits
        t = answer_positions[0].item()
        expected = torch.nn.functional.cross_entropy(
            logits[0, t - 1 : t], batch["input_ids"][0, t : t + 1]
        ).item()
        assert sft_loss(model, one).item() == pytest.approx(expected, rel=1e-4)
    assert base > 0


def test_sft_never_writes_over_an_earlier_model(tiny_model_dir, arithmetic_files, tmp_path):
    """A second `verl sft` into the same directory is refused and leaves the first model byte-identical;
    trainer.on_existing_run=move_aside moves it to a sibling directory instead."""
    from verl.errors import RunDirError

    train, _ = arithmetic_files
    out = tmp_path / "sft"

    def config(*extra):
        base = [f"model.path={tiny_model_dir}", f"data.train_files={train}", "data.train_batch_size=4"]
        base += [
            "trainer.total_training_steps=2",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}",
        ]
        return load_config(None, base + list(extra), schema=SFTConfig)

    def files(root):
        return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file() and p.name != ".verl-run.lock"}

    run_sft(config())
    first = files(out)
    with pytest.raises(RunDirError, match="is not empty"):
        run_sft(config("optim.lr=1e-2"))
    assert files(out) == first
    run_sft(config("optim.lr=1e-2", "trainer.on_existing_run=move_aside"))
    (moved,) = tmp_path.glob("sft.moved-*")
    assert files(moved) == first
    assert (out / "model.safetensors").read_bytes() != first["model.safetensors"]
