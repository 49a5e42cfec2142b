"""The fast rollout engine against the reference (HF generate) engine and the actor's log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from verl.protocol import DataProto
from verl.workers.actor import response_logprobs
from verl.workers.rollout import SamplingParams, get_rollout_class
from verl.workers.rollout.base import assemble_rollout_output
from verl.workers.rollout.fast import (
    FastRollout,
    _HFDecoder,
    _LeanDecoder,
    draw,
    lean_decoder_supported,
    sample_next,
    warp_logits,
)
from verl.workers.rollout.hf import HFRollout
from verl.workers.rollout.lean_weights import LeanWeights, _Linear

PAD = 0


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def llama_model_dir(tmp_path_factory):
    from verl.models import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-llama"),
        arch="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
    )


@pytest.fixture(params=["qwen2", "llama"])
def model(request, tiny_model_dir, llama_model_dir):
    path = tiny_model_dir if request.param == "qwen2" else llama_model_dir
    return AutoModelForCausalLM.from_pretrained(path)


def make_prompts(
    model, lengths: list[int], seed: int = 0, width: int | None = None, prefix: int = 0
) -> DataProto:
    """Random prompts of the given lengths, left-padded to ``width`` (default: the longest); with ``prefix``,
    all start with the same ``prefix`` tokens (a chat template's system prompt)."""
    gen = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    input_ids = torch.randint(3, model.config.vocab_size, (len(lengths), width), generator=gen)
    shared = torch.randint(3, model.config.vocab_size, (prefix,), generator=gen)
    for row, length in enumerate(lengths):
        input_ids[row, width - length : width - length + prefix] = shared
    attention_mask = (torch.arange(width)[None, :] >= width - torch.tensor(lengths)[:, None]).long()
    input_ids = torch.where(attention_mask.bool(), input_ids, PAD)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    )


@pytest.mark.parametrize("lean_prefill", [True, False], ids=["lean-prefill", "hf-prefill"])
def test_repeated_prompts_are_prefilled_once_and_decode_like_hf(model, lean_prefill, monkeypatch):
    """GRPO repeats each prompt rollout.n times: the prefill runs each distinct prompt once and copies its
    cache rows, and the greedy output is still HF's, row for row."""
    monkeypatch.setattr(_LeanDecoder, "lean_prefill", lean_prefill)
    prompts = make_prompts(model, [5, 9, 3], width=10).repeat(4, interleave=True)
    sampling = SamplingParams(do_sample=False, max_new_tokens=8)
    expected = HFRollout(model, [model.config.vocab_size], PAD).generate_sequences(prompts, sampling)
    rows_seen = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: rows_seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    linear_call = _Linear.__call__

    def spy(self, x):
        rows_seen.append(x.shape[0] if x.dim() == 3 else None)  # 3-D: the prefill's [prompts, width, hidden]
        return linear_call(self, x)

    monkeypatch.setattr(_Linear, "__call__", spy)
    got = FastRollout(model, [model.config.vocab_size], PAD).generate_sequences(prompts, sampling)
    hook.remove()
    assert rows_seen[0] == 3  # the prefill: 3 distinct prompts for 12 rows
    assert torch.equal(got.batch["responses"], expected.batch["responses"])


@pytest.mark.parametrize("lean_prefill", [True, False], ids=["lean-prefill", "hf-prefill"])
def test_a_prefix_all_prompts_share_is_prefilled_once_and_decodes_like_hf(model, lean_prefill, monkeypatch):
    """Prompts that start with the same tokens (a chat template's system prompt): the prefill runs those
    once, as one row, then each distinct prompt's rest; the greedy output is still HF's, row for row."""
    monkeypatch.setattr(_LeanDecoder, "lean_prefill", lean_prefill)
    prompts = make_prompts(model, [12, 16, 10], width=17, prefix=8).repeat(2, interleave=True)
    sampling = SamplingParams(do_sample=False, max_new_tokens=8)
    expected = HFRollout(model, [model.config.vocab_size], PAD).generate_sequences(prompts, sampling)
    widths = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    linear_call = _Linear.__call__

    def spy(self, x):
        widths.append(
            tuple(x.shape[:2]) if x.dim() == 3 else None
        )  # 3-D: the prefill's [rows, width, hidden]
        return linear_call(self, x)

    monkeypatch.setattr(_Linear, "__call__", spy)
    got = FastRollout(model, [model.config.vocab_size], PAD).generate_sequences(prompts, sampling)
    hook.remove()
    # The 8 shared tokens as one row, then the 3 prompts' rest: the longest has 8 more tokens.
    assert widths[0] == (1, 8) and (3, 8) in widths
    assert torch.equal(got.batch["responses"], expected.batch["responses"])


def early_eos_ids(model, prompts: DataProto, max_new_tokens: int) -> list[int]:
    """EOS ids that the model's own greedy output emits mid-sequence in some rows but not in others."""
    never = [model.config.vocab_size]  # an id no model emits
    greedy = HFRollout(model, never, PAD).generate_sequences(
        prompts, SamplingParams(do_sample=False, max_new_tokens=max_new_tokens)
    )
    responses = greedy.batch["responses"]
    # The token at position 3 of row 0 and position 6 of row 1: rows stop at their first occurrence.
    return sorted({int(responses[0, 3]), int(responses[1, 6])})


def test_registered_and_default_decoder(model):
    assert get_rollout_class("fast") is FastRollout
    assert lean_decoder_supported(model)


def test_onednn_matmuls_only_for_cpu_weights(tiny_model_dir):
    """oneDNN's ops are CPU kernels: weights on another device (a GPU; "meta" stands in) use F.linear."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert LeanWeights.gather(model).matmul in ("packed", "torch")  # torch: a build without oneDNN
    assert LeanWeights.gather(model.to("meta")).matmul == "torch"


@pytest.mark.parametrize(
    "decoder",
    [
        "lean",
        "lean-sdpa",
        "lean-onednn",
        "lean-onednn-unfused",
        "lean-torch",
        "lean-torch-unfused",
        "hf-forward",
    ],
)
def test_greedy_matches_hf_generate(model, decoder, monkeypatch):
    # lean: the default (prepacked oneDNN matmuls for a model this small, attention by two matmuls); sdpa:
    # attention by torch's fused kernel (what a bf16 cache uses); onednn: the same kernels over the module's
    # weights (models too big to prepack); torch: F.linear (no oneDNN); unfused: q/k/v and gate/up as
    # separate matmuls (models too big to copy them).
    if decoder == "lean-sdpa":
        monkeypatch.setattr(_LeanDecoder, "decode_attention", "sdpa")
    elif decoder.startswith("lean-"):
        monkeypatch.setattr(LeanWeights, "matmul_override", decoder.split("-")[1])
    if decoder.endswith("-unfused"):
        monkeypatch.setattr(LeanWeights, "fuse_limit_bytes", 0)
    # Padded beyond the longest prompt, as a dataset pads to max_prompt_length.
    prompts = make_prompts(model, [5, 9, 3, 9, 7, 6], width=12)
    max_new = 24
    eos = early_eos_ids(model, prompts, max_new)
    sampling = SamplingParams(do_sample=False, max_new_tokens=max_new)
    expected = HFRollout(model, eos, PAD).generate_sequences(prompts, sampling)
    got = FastRollout(model, eos, PAD, lean=decoder != "hf-forward").generate_sequences(prompts, sampling)

    lengths = got.batch["response_mask"].sum(-1)
    assert lengths.min() < max_new and len(set(lengths.tolist())) > 1  # uneven lengths: rows were dropped
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids", "prompts"):
        assert torch.equal(got.batch[key], expected.batch[key]), key


def test_sampled_output_layout(model):
    prompts = make_prompts(model, [4, 8, 2, 8, 5, 7, 3, 6], seed=1)
    eos = list(range(3, model.config.vocab_size // 10))  # a near-uniform random model stops often
    sampling = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=16)
    torch.manual_seed(0)
    out = FastRollout(model, eos, PAD).generate_sequences(prompts, sampling)

    responses, mask = out.batch["responses"], out.batch["response_mask"]
    assert responses.shape == (8, 16) and out.batch["rollout_log_probs"].dtype == torch.float32
    assert len(set(mask.sum(-1).tolist())) > 2  # rows of several lengths
    assert (responses < model.config.vocab_size).all()
    # The mask is 1 up to and including the first EOS, padding after it, log-prob 0 on padding.
    reference = assemble_rollout_output(prompts, responses, eos, PAD, 16)
    for key in ("response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(out.batch[key], reference.batch[key]), key
    assert (responses[mask == 0] == PAD).all()
    assert (out.batch["rollout_log_probs"][mask == 0] == 0).all()
    assert (out.batch["rollout_log_probs"][mask == 1] < 0).all()
    entropies = out.batch["rollout_entropys"]
    assert (
        entropies.shape == (8, 16) and (entropies[mask == 0] == 0).all() and (entropies[mask == 1] > 0).all()
    )
    # Plain tensors, not inference-mode ones: the update may use them under autograd.
    assert not any(t.is_inference() for t in out.batch.values())


@pytest.mark.parametrize("temperature", [0.7, 1.3])
@pytest.mark.parametrize("prefix", [0, 9], ids=["distinct", "shared-prefix"])
def test_log_probs_match_the_actor(model, temperature, prefix):
    prompts = make_prompts(model, [n + prefix for n in (6, 3, 8, 8)], seed=2, prefix=prefix)
    eos = early_eos_ids(model, prompts, 20)
    # Truncated sampling; the log-probs are still those of the untruncated tempered distribution.
    sampling = SamplingParams(temperature=temperature, top_k=20, top_p=0.9, max_new_tokens=20)
    torch.manual_seed(1)
    out = FastRollout(model, eos, PAD).generate_sequences(prompts, sampling)
    model.eval()
    with torch.no_grad():
        actor_lp, actor_entropy = response_logprobs(model, out, temperature, with_entropy=True)
    valid = out.batch["response_mask"].bool()
    torch.testing.assert_close(out.batch["rollout_log_probs"][valid], actor_lp[valid], atol=1e-5, rtol=0)
    # ... and so are the entropies (of the untruncated distribution), which give actor/entropy
    torch.testing.assert_close(out.batch["rollout_entropys"][valid], actor_entropy[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("lean_prefill", [True, False], ids=["lean-prefill", "hf-prefill"])
@pytest.mark.parametrize("prefix", [0, 9], ids=["distinct", "shared-prefix"])
def test_bf16_autocast_log_probs_match_the_actor(model, lean_prefill, prefix, monkeypatch):
    """An fp32 model decoded under bf16 autocast (what the trainer does on a CPU with bf16 instructions):
    repeated, padded prompts (GRPO's batch) decode, and the log-probs are the actor's under the same
    autocast, to bf16 rounding (different kernels: oneDNN in the lean step, F.linear in the HF forward)."""
    monkeypatch.setattr(_LeanDecoder, "lean_prefill", lean_prefill)
    prompts = make_prompts(model, [n + prefix for n in (6, 3, 8)], seed=4, prefix=prefix).repeat(
        3, interleave=True
    )
    engine = FastRollout(model, [model.config.vocab_size], PAD)
    engine.compute_dtype = torch.bfloat16
    torch.manual_seed(2)
    out = engine.generate_sequences(prompts, SamplingParams(max_new_tokens=12))
    assert out.batch["rollout_log_probs"].dtype == torch.float32
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        actor_lp, actor_entropy = response_logprobs(model, out, 1.0, with_entropy=True)
    valid = out.batch["response_mask"].bool()
    gap = (out.batch["rollout_log_probs"][valid] - actor_lp[valid].float()).abs()
    assert gap.max() < 0.1 and gap.mean() < 0.02  # bf16 has 8 bits of mantissa: ~0.4% per op
    gap = (out.batch["rollout_entropys"][valid] - actor_entropy[valid].float()).abs()
    assert gap.max() < 0.1 and gap.mean() < 0.02


def test_warpers_match_hf():
    torch.manual_seed(0)
    logits = torch.randn(16, 100) * 3
    for temperature, top_k, top_p in [(0.7, 10, 1.0), (1.0, -1, 0.8), (1.5, 30, 0.5), (1.0, 0, 1.0)]:
        expected = logits.clone()
        if temperature != 1.0:
            expected = TemperatureLogitsWarper(temperature)(None, expected)
        if top_k > 0:
            expected = TopKLogitsWarper(top_k)(None, expected)
        if top_p < 1.0:
            expected = TopPLogitsWarper(top_p)(None, expected)
        got = warp_logits(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
        assert torch.equal(got, expected), (temperature, top_k, top_p)


def test_draw_only_picks_allowed_tokens():
    torch.manual_seed(0)
    logits = torch.randn(8, 50) * 2
    for sampling in (SamplingParams(top_k=3), SamplingParams(top_p=0.3), SamplingParams(top_k=10, top_p=0.5)):
        warped = warp_logits(logits, sampling)
        allowed = torch.isfinite(warped)
        probs = torch.softmax(warped, dim=-1)
        for _ in range(200):
            tokens = draw(probs)
            assert allowed.gather(-1, tokens[:, None]).all()
    # A row with all mass on its last token: never past it, never elsewhere.
    probs = torch.zeros(2, 5)
    probs[:, 4] = 1.0
    assert (draw(probs) == 4).all()


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0.7), SamplingParams(top_k=3), SamplingParams(temperature=1.5, top_p=0.8)],
    ids=["temperature", "top-k", "top-p"],
)
def test_sample_next_frequencies(sampling):
    """Token frequencies of many draws from one row of logits against the exact warped softmax."""
    n = 20000
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])
    torch.manual_seed(4)
    tokens, log_probs, entropy = sample_next(logits.expand(n, -1), sampling)
    assert entropy is None  # not asked for
    exact = torch.softmax(warp_logits(logits, sampling), dim=-1).double()
    counts = torch.bincount(tokens, minlength=6).double()
    assert (counts[exact == 0] == 0).all()
    support = exact > 0
    expected = exact[support] * n
    chi2 = ((counts[support] - expected) ** 2 / expected).sum()
    assert chi2 < 20.5  # the 0.1% quantile of chi-square with at most 5 degrees of freedom
    # The log-probs are those of the tempered, untruncated distribution, whatever the truncation.
    scored = torch.log_softmax(logits / sampling.temperature, dim=-1)
    torch.testing.assert_close(log_probs, scored[tokens])


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=2.0, top_k=1)], ids=["T1", "T2-top-k"]
)
def test_sample_next_entropy_by_hand(sampling):
    """Two tokens with logits (ln 3, 0): p = (3/4, 1/4) at T = 1; at T = 2, p ∝ (√3, 1). The entropy is that of
    the tempered distribution, whatever top-k cuts from the draw; four equal logits give ln 4."""
    logits = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])
    _, _, entropy = sample_next(logits, sampling, with_entropy=True)
    p = 3**0.5 / (3**0.5 + 1) if sampling.temperature == 2.0 else 0.75
    expected = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert entropy.tolist() == pytest.approx([expected, math.log(2.0)], abs=1e-6)
    _, _, uniform = sample_next(torch.zeros(3, 4), SamplingParams(do_sample=False), with_entropy=True)
    assert uniform.tolist() == pytest.approx([math.log(4.0)] * 3, abs=1e-6)


def test_top_k_tokens_are_among_the_models_top_k(model):
    prompts = make_prompts(model, [5, 7, 3], seed=3)
    sampling = SamplingParams(temperature=1.0, top_k=3, max_new_tokens=12)
    torch.manual_seed(2)
    out = FastRollout(model, [model.config.vocab_size], PAD).generate_sequences(prompts, sampling)
    model.eval()
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits[:, -13:-1]
    third = logits.topk(3, dim=-1).values[..., -1]
    chosen = logits.gather(-1, out.batch["responses"][..., None]).squeeze(-1)
    assert (chosen >= third - 1e-5).all()


def test_first_token_distribution_matches_hf(tiny_model_dir):
    """Frequencies of the first sampled token, fast vs HF vs the exact top-k distribution."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    n = 3000
    one = make_prompts(model, [6], seed=4)
    prompts = DataProto.from_dict(tensors={k: v.expand(n, -1).clone() for k, v in one.batch.items()})
    sampling = SamplingParams(temperature=1.0, top_k=8, max_new_tokens=1)
    never = [model.config.vocab_size]
    torch.manual_seed(3)
    fast = FastRollout(model, never, PAD).generate_sequences(prompts, sampling).batch["responses"][:, 0]
    hf = HFRollout(model, never, PAD).generate_sequences(prompts, sampling).batch["responses"][:, 0]
    with torch.no_grad():
        logits = model(**{k: one.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
    exact = torch.softmax(warp_logits(logits[0, -1], sampling), dim=-1)
    support = exact.nonzero().squeeze(-1)
    assert torch.isin(fast, support).all() and torch.isin(hf, support).all()
    f = torch.bincount(fast, minlength=exact.numel()).double()[support]
    h = torch.bincount(hf, minlength=exact.numel()).double()[support]
    expected = exact[support].double() * n
    # Pearson chi-square, 7 degrees of freedom: 24.3 is the 0.1% quantile, and the seeds are fixed.
    assert ((f - expected) ** 2 / expected).sum() < 24.3
    assert ((f - h) ** 2 / (f + h).clamp_min(1)).sum() < 24.3  # two-sample form


def test_bf16_model_greedy_matches_hf(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    prompts = make_prompts(model, [5, 2, 7, 4], seed=6)
    sampling = SamplingParams(do_sample=False, max_new_tokens=12)
    never = [model.config.vocab_size]
    expected = HFRollout(model, never, PAD).generate_sequences(prompts, sampling)
    got = FastRollout(model, never, PAD).generate_sequences(prompts, sampling)
    assert torch.equal(got.batch["responses"], expected.batch["responses"])
    assert got.batch["rollout_log_probs"].dtype == torch.float32


def test_micro_batches_and_training_mode_restored(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    prompts = make_prompts(model, [3, 5, 4, 2, 6], seed=5)
    sampling = SamplingParams(do_sample=False, max_new_tokens=6)
    never = [model.config.vocab_size]
    whole = FastRollout(model, never, PAD).generate_sequences(prompts, sampling)
    chunked = FastRollout(model, never, PAD, micro_batch_size=2).generate_sequences(prompts, sampling)
    assert model.training
    assert torch.equal(whole.batch["responses"], chunked.batch["responses"])
    torch.testing.assert_close(whole.batch["rollout_log_probs"], chunked.batch["rollout_log_probs"])


def test_unsupported_architectures_use_the_model_forward(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.hidden_act = "gelu"  # not what the lean step computes
    assert not lean_decoder_supported(model)
    assert FastRollout(model, [1], PAD).decoder_cls is _HFDecoder
