"""``verl_sdpa``: transformers' SDPA with grouped-query heads left grouped on a CPU. The same log-probs, gradients
and generations as ``sdpa``, with less kept for the backward; the workers load ``sdpa`` models with it."""

from __future__ import annotations

import pytest
import torch

from tests.unit._batches import grouped_batch
from verl.models import load_hf_model
from verl.workers.engine.attention import GROUPED_SDPA, grouped_sdpa_attention, register_grouped_sdpa
from verl.workers.engine.scoring import PolicyScorer
from verl.workers.worker_setup import attention_for


def score_with_saved_bytes(model: torch.nn.Module, batch, share_prompts: bool):
    """The batch's log-probs, the gradients of their sum, and the bytes autograd kept for the backward."""
    kept = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            storage = t.untyped_storage()
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        log_probs, _ = PolicyScorer(model, share_prompts=share_prompts)(*batch)
    log_probs.sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return log_probs.detach(), grads, sum(kept.values())


@pytest.mark.parametrize("share_prompts", [False, True])
def test_grouped_sdpa_equals_sdpa_and_keeps_less_for_the_backward(tiny_model_dir, share_prompts):
    plain = load_hf_model(tiny_model_dir, attn_implementation="sdpa")
    grouped = load_hf_model(tiny_model_dir, attn_implementation=register_grouped_sdpa())
    assert plain.config.num_attention_heads > plain.config.num_key_value_heads  # grouped-query attention
    batch = grouped_batch(plain.config.vocab_size)
    log_probs, grads, plain_bytes = score_with_saved_bytes(plain, batch, share_prompts)
    grouped_log_probs, grouped_grads, grouped_bytes = score_with_saved_bytes(grouped, batch, share_prompts)
    torch.testing.assert_close(grouped_log_probs, log_probs, rtol=1e-5, atol=1e-6)
    assert grads.keys() == grouped_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grouped_grads[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # Each layer's keys and values kept once per key/value head instead of once per query head.
    assert grouped_bytes < plain_bytes


def test_grouped_sdpa_generates_what_sdpa_generates(tiny_model_dir):
    plain = load_hf_model(tiny_model_dir, attn_implementation="sdpa").eval()
    grouped = load_hf_model(tiny_model_dir, attn_implementation=register_grouped_sdpa()).eval()
    input_ids, attention_mask, _, responses, _ = grouped_batch(plain.config.vocab_size)
    width = input_ids.shape[1] - responses.shape[1]
    prompts, mask = input_ids[:, :width], attention_mask[:, :width]
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(grouped.generate(prompts, **kwargs), plain.generate(prompts, **kwargs))


class _Attention(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


def test_grouped_sdpa_follows_transformers_causal_rule_without_a_mask():
    # No mask and several queries: causal (a query never sees a later key), as transformers' sdpa decides.
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, 3, 8, generator=generator)
    key, value = torch.randn(1, 2, 3, 8, generator=generator), torch.randn(1, 2, 3, 8, generator=generator)
    out, _ = grouped_sdpa_attention(_Attention(), query, key, value, None)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1), is_causal=True
    )
    torch.testing.assert_close(out, expected.transpose(1, 2))
    # The first query sees only the first key: its output is that key's value.
    torch.testing.assert_close(out[0, 0, 0], value[0, 0, 0])


def test_workers_load_sdpa_models_with_the_grouped_attention():
    assert attention_for("sdpa", remove_padding=False) == GROUPED_SDPA
    assert attention_for("eager", remove_padding=False) == "eager"
    assert attention_for("sdpa", remove_padding=True) == "verl_varlen"
