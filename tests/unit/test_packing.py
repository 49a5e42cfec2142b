"""Padding-free forward passes: packing by hand, and packed == padded for log-probs, entropies, values
and their gradients; the chunked LM head never holds more than one chunk of logits."""

from __future__ import annotations

import pytest
import torch

from tests.unit._batches import grouped_batch
from verl.models import load_hf_model, load_value_model, make_tiny_model
from verl.workers.engine.packing import pack, packed_attention_implementation, packed_positions
from verl.workers.engine.scoring import PolicyScorer, ValueScorer, response_positions


def test_pack_keeps_the_real_tokens_in_row_order():
    # Row 0: 2 prompt pads, prompt (5, 6), response (7); row 1: prompt (1, 2, 3), response (4), one pad.
    input_ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 0]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    position_ids = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]])
    packed = pack(input_ids, attention_mask, position_ids)
    assert packed.input_ids.tolist() == [[5, 6, 7, 1, 2, 3, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    assert packed.cu_seq_lens.tolist() == [0, 3, 7]
    assert packed.max_length == 4
    assert packed.token_index.tolist() == [2, 3, 4, 5, 6, 7, 8]
    # The positions that predict each response token (response length 1): flat 3 (row 0) and 7 (row 1).
    positions = response_positions(torch.tensor([[1], [0]]), width=5)
    assert positions.tolist() == [3]
    assert packed_positions(packed, torch.tensor([3, 7]), 10).tolist() == [1, 5]
    with pytest.raises(ValueError, match="padding"):
        packed_positions(packed, torch.tensor([0]), 10)


def ragged_batch(vocab_size: int, seed: int = 0):
    """Left-padded prompts and right-padded responses of very different lengths (one response empty)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths, response_lengths = [7, 3, 5, 1, 7, 2], [9, 1, 4, 9, 0, 6]
    rows, prompt_width, response_width = len(prompt_lengths), 7, 9
    input_ids = torch.randint(3, vocab_size, (rows, prompt_width + response_width), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        attention_mask[row, : prompt_width - p] = 0
        attention_mask[row, prompt_width + r :] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    responses = input_ids[:, prompt_width:]
    return input_ids, attention_mask, position_ids, responses, attention_mask[:, prompt_width:]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_dir(request, tmp_path_factory):
    # Grouped-query attention (4 query heads, 2 key/value heads), as in Qwen2 and SmolLM2.
    return make_tiny_model(
        tmp_path_factory.mktemp(request.param),
        arch=request.param,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk_size", [0, 5])
def test_packed_log_probs_entropy_and_gradients_equal_padded(model_dir, chunk_size):
    padded_model = load_hf_model(model_dir, attn_implementation="sdpa")
    packed_model = load_hf_model(model_dir, attn_implementation=packed_attention_implementation("sdpa"))
    batch = ragged_batch(padded_model.config.vocab_size)
    response_mask = batch[-1]
    results = []
    for scorer in (PolicyScorer(padded_model), PolicyScorer(packed_model, True, chunk_size)):
        log_probs, entropy = scorer(*batch, temperature=0.7, with_entropy=True)
        ((log_probs + 0.1 * entropy) * response_mask).sum().backward()
        results.append((log_probs, entropy, grads(scorer.hf_model)))
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results
    assert (lp_a[response_mask == 0] == 0).all() and (lp_b[response_mask == 0] == 0).all()
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-5, rtol=1e-4)


def test_packed_attention_does_not_cross_sequences(model_dir):
    """The same packed input through plain SDPA (one causal sequence) scores differently: the per-row
    attention is what keeps the rows apart."""
    varlen = load_hf_model(model_dir, attn_implementation=packed_attention_implementation("eager"))
    plain = load_hf_model(model_dir, attn_implementation="sdpa")
    batch = ragged_batch(varlen.config.vocab_size)
    separate, _ = PolicyScorer(varlen, remove_padding=True)(*batch)
    crossed, _ = PolicyScorer(plain, remove_padding=True)(*batch)
    reference, _ = PolicyScorer(plain)(*batch)
    torch.testing.assert_close(separate, reference, atol=1e-5, rtol=1e-5)
    assert (crossed - reference).abs().max() > 1e-2


def test_chunked_head_never_holds_more_than_a_chunk_of_logits(model_dir):
    model = load_hf_model(model_dir, attn_implementation="sdpa")
    batch = ragged_batch(model.config.vocab_size)
    shapes = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, i, out: shapes.append(out.shape))
    log_probs, _ = PolicyScorer(model, chunk_size=8)(*batch)
    log_probs.sum().backward()  # the backward pass recomputes each chunk: the hook sees them again
    handle.remove()
    real_tokens = int(batch[-1].sum())  # 29: 4 chunks of at most 8
    forward, backward = [s[0] for s in shapes[:4]], [s[0] for s in shapes[4:]]
    assert forward == [8, 8, 8, 5] and sum(forward) == real_tokens
    assert sorted(backward) == [5, 8, 8, 8]  # recomputed, last chunk first


def test_packed_values_equal_padded(model_dir):
    padded = load_value_model(model_dir, attn_implementation="sdpa")
    packed = load_value_model(model_dir, attn_implementation=packed_attention_implementation("sdpa"))
    packed.load_state_dict(padded.state_dict())  # the value head is new, random: share it
    batch = ragged_batch(padded.config.vocab_size)
    ids, mask, pos, _, response_mask = batch
    a = ValueScorer(padded)(ids, mask, pos, response_mask)
    b = ValueScorer(packed, remove_padding=True)(ids, mask, pos, response_mask)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert (a[response_mask == 0] == 0).all()


def test_generation_is_unchanged_by_the_packed_attention(model_dir):
    """The rollout shares the actor's module: without cu_seq_lens the varlen implementation is SDPA."""
    plain = load_hf_model(model_dir, attn_implementation="sdpa")
    varlen = load_hf_model(model_dir, attn_implementation=packed_attention_implementation("sdpa"))
    ids, mask, *_ = ragged_batch(plain.config.vocab_size)
    prompt_ids, prompt_mask = ids[:, :7], mask[:, :7]
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    out_plain = plain.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    out_varlen = varlen.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    assert torch.equal(out_plain, out_varlen)


@pytest.mark.parametrize("prefix", [0, 9], ids=["distinct", "shared-prefix"])
def test_shared_prompts_give_the_same_log_probs_and_gradients(model_dir, prefix):
    """Each distinct prompt runs once; with ``prefix`` all prompts start alike (a system prompt) and those tokens
    run once, as one row, before them. The same log-probs, entropies and gradients."""
    model = load_hf_model(model_dir, attn_implementation="eager")
    batch = grouped_batch(model.config.vocab_size, prefix=prefix)
    passes = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda m, args, kwargs: passes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    results = []
    for share in (False, True):
        model.zero_grad()
        log_probs, entropy = PolicyScorer(model, share_prompts=share)(
            *batch, temperature=0.9, with_entropy=True
        )
        ((log_probs - 0.1 * entropy) * batch[-1]).sum().backward()
        results.append((log_probs, entropy, grads(model)))
    hook.remove()
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-5, rtol=1e-4)
    # Unshared: all 12 rows at full width (prefix + 6 prompt + 5 response columns). Shared: the prefix once, the
    # 3 distinct prompts' rest (the longest: 6 tokens), then the 12 rows' responses cut to the longest (response
    # lengths are drawn from 0..4) less its last token, which predicts nothing.
    longest = int(batch[-1].sum(-1).max())
    assert longest > 1
    prefix_pass = [(1, prefix)] if prefix else []
    assert passes == [(12, prefix + 11), *prefix_pass, (3, 6), (12, longest - 1)]
