"""Rollout engines: the response layout every engine shares, and the model-free dummy engine."""

from __future__ import annotations

import torch

from verl.protocol import DataProto
from verl.workers.rollout import SamplingParams, get_rollout_class
from verl.workers.rollout.base import assemble_rollout_output, response_mask_from_ids


def test_response_mask_stops_after_first_eos():
    # eos = 9: everything after the first 9 is masked, the 9 itself is kept
    ids = torch.tensor([[5, 9, 7, 9], [5, 6, 7, 8], [9, 1, 1, 1]])
    assert response_mask_from_ids(ids, [9]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_assemble_pads_and_builds_full_sequences():
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[0, 3, 4]]), "attention_mask": torch.tensor([[0, 1, 1]])}
    )
    out = assemble_rollout_output(
        prompts, torch.tensor([[5, 9, 7]]), eos_token_ids=[9], pad_token_id=0, response_length=4
    )
    assert out.batch["responses"].tolist() == [[5, 9, 0, 0]]  # after EOS: pad, and padded to length 4
    assert out.batch["response_mask"].tolist() == [[1, 1, 0, 0]]
    assert out.batch["input_ids"].tolist() == [[0, 3, 4, 5, 9, 0, 0]]
    assert out.batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 0, 0]]
    assert out.batch["position_ids"].tolist() == [[0, 0, 1, 2, 3, 3, 3]]


def test_dummy_rollout_layout_and_seeding():
    model = torch.nn.Module()
    model.get_input_embeddings = lambda: torch.nn.Embedding(50, 2)
    engine = get_rollout_class("dummy")(model, eos_token_ids=[7], pad_token_id=0)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": torch.ones(3, 4, dtype=torch.long),
            "attention_mask": torch.ones(3, 4, dtype=torch.long),
        }
    )
    torch.manual_seed(0)
    first = engine.generate_sequences(prompts, SamplingParams(max_new_tokens=6))
    torch.manual_seed(0)
    again = engine.generate_sequences(prompts, SamplingParams(max_new_tokens=6))
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert first.batch["responses"].shape == (3, 6)
    lengths = first.batch["response_mask"].sum(-1)
    assert ((lengths >= 1) & (lengths <= 6)).all()
    greedy = engine.generate_sequences(prompts, SamplingParams(do_sample=False, max_new_tokens=6))
    assert (greedy.batch["responses"] == greedy.batch["responses"][0]).all()
