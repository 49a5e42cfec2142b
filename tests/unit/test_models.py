"""The tiny-model factory writes ordinary HF directories that load through the Auto classes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.models import build_tiny_tokenizer, load_hf_model, load_tokenizer, make_tiny_model


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_round_trip_through_auto_classes(arch, tmp_path):
    path = make_tiny_model(
        tmp_path / arch, arch=arch, hidden_size=32, num_hidden_layers=1, intermediate_size=64
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == arch
    # The loaded tokenizer must give the same ids as the one that was trained (Qwen2's pipeline is rebuilt on load).
    reference = build_tiny_tokenizer()
    text = "<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n19<|im_end|>"
    assert tokenizer(text)["input_ids"] == reference(text)["input_ids"]
    digits = tokenizer.convert_ids_to_tokens(tokenizer("123")["input_ids"])
    assert digits == ["1", "2", "3"]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4="}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer("3+4=")["input_ids"]])).logits
    assert logits.shape[-1] == len(tokenizer)


def test_loaders_pad_left_and_guard_missing_dirs(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    model = load_hf_model(tiny_model_dir, torch_dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_model(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown torch_dtype"):
        load_hf_model(tiny_model_dir, torch_dtype="float8")


def test_unknown_arch_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny-model arch"):
        make_tiny_model(tmp_path, arch="gpt5")
