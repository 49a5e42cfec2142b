"""A tiny model whose responses end at any step: ragged lengths for the streaming rollout's tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def ragged_model(path, eos_logit: float = 8.0):
    """The tiny model with its stop token's output row pointed along the mean hidden state: the stop token
    then comes at any step, with a probability that varies a lot from step to step (ragged lengths)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (16, 6), generator=gen)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[-1].reshape(-1, model.config.hidden_size)
        mean = hidden.mean(0)
        model.get_output_embeddings().weight[model.config.eos_token_id] = eos_logit * mean / mean.dot(mean)
    return model


def save_ragged_model(path: str | Path, out: str | Path) -> Path:
    """`ragged_model` of the tiny model at ``path`` as a model directory of its own (tokenizer copied)."""
    out = Path(out)
    shutil.copytree(path, out, dirs_exist_ok=True)
    ragged_model(path).save_pretrained(out)
    return out
