"""``verl_sdpa``: transformers' SDPA with grouped-query heads left grouped on a CPU. The same log-probs, gradients
and generations as ``sdpa``, with less kept for the backward; the workers load ``sdpa`` models with it."""

from __future__ import annotations

import pytest
import torch

from tests.unit._batches import grouped_batch
from verl.models import load_hf_model
from verl.workers.engine.attention import (
    GROUPED_SDPA,
    grouped_matmul_attention,
    grouped_sdpa_attention,
    register_grouped_sdpa,
)
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


def _reference(query, key, value, allowed):
    """SDPA over keys and values repeated to every query head, from a boolean mask (True: may attend)."""
    group = query.shape[1] // key.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(group, 1), value.repeat_interleave(group, 1), attn_mask=allowed
    )


def test_matmul_attention_equals_sdpa_with_any_mask_form():
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 6, 5, 8, generator=generator)
    key, value = torch.randn(2, 2, 7, 8, generator=generator), torch.randn(2, 2, 7, 8, generator=generator)
    allowed = torch.rand(2, 1, 5, 7, generator=generator) > 0.3
    allowed[..., 0] = True  # every query may attend somewhere
    expected = _reference(query, key, value, allowed)
    for mask in (allowed, torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))):
        out = grouped_matmul_attention(query, key, value, mask, 8**-0.5, causal=False)
        torch.testing.assert_close(out, expected)
    # a mask per query head: each head's own rows
    per_head = torch.rand(2, 6, 5, 7, generator=generator) > 0.3
    per_head[..., 0] = True
    out = grouped_matmul_attention(query, key, value, per_head, 8**-0.5, causal=False)
    torch.testing.assert_close(out, _reference(query, key, value, per_head))
    # causal without a mask, with more keys than queries (a cached prefix): the last queries' causal window
    causal = torch.ones(5, 7, dtype=torch.bool).tril(2)
    out = grouped_matmul_attention(query, key, value, None, 8**-0.5, causal=True)
    torch.testing.assert_close(out, _reference(query, key, value, causal))


def test_matmul_attention_is_finite_for_a_query_that_attends_to_nothing_and_float32_under_autocast():
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(1, 4, 3, 8, generator=generator, requires_grad=True)
    key, value = torch.randn(1, 2, 3, 8, generator=generator), torch.randn(1, 2, 3, 8, generator=generator)
    allowed = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    allowed[0, 0, 0] = False  # a padding query: its output is never read, but its gradient must not be NaN
    out = grouped_matmul_attention(query, key, value, allowed, 8**-0.5, causal=False)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(query.grad).all()
    torch.testing.assert_close(out[:, :, 1:], _reference(query, key, value, allowed)[:, :, 1:])
    # in a bf16 forward the inputs are bf16; the scores are computed in float32 all the same
    q16, k16, v16 = query.detach().bfloat16(), key.bfloat16(), value.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out16 = grouped_matmul_attention(q16, k16, v16, allowed, 8**-0.5, causal=False)
    expected = _reference(q16.float(), k16.float(), v16.float(), allowed)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16[:, :, 1:].float(), expected[:, :, 1:], rtol=0, atol=1e-2)
