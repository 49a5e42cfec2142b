"""A fast rollout engine: prefill once, then a KV-cached decode loop that drops finished rows.

Same contract as ``HFRollout`` (the actor's own module, left-padded prompts in, the
``assemble_rollout_output`` layout out) plus ``rollout_log_probs``. What HF ``generate`` spends on
a CPU beyond the model's arithmetic, measured on 1M-4M parameter models (see
``benchmarks/rollout_speed.py``), and what this engine does instead:

* its DynamicCache grows by ``torch.cat`` every step (the whole cache is copied: O(length) per
  step, over half of generate's time at batch 64 x 128 tokens): here the KV cache is preallocated
  per call and written in place;
* ``torch.multinomial`` draws one exponential per vocabulary entry (~0.6 ms per step at batch 64):
  here one uniform number per row, inverted through the CDF (same distribution);
* logits processors, stopping criteria, mask rebuilding and ~50 module calls per step: here a
  decode step for Llama-style decoders (Llama, Qwen2) is a flat sequence of torch ops over the
  module's own parameters (nothing copied that could go stale between RL steps) with fused
  q/k/v and gate/up projections and one attention mask for the whole loop (``decoders.py``). Any
  other causal LM runs its own ``forward`` with a ``DynamicCache``;
* every row runs until the longest finishes: here rows that emitted EOS leave the batch.

The lean step reproduces HF's op order (float32 RMSNorm, rotate-half RoPE, SDPA with HF's GQA
handling), so its logits are bit-identical to HF's forward in the tested configurations and
greedy decoding gives HF ``generate``'s tokens.

Sampling follows HF ``generate``: logits / temperature, then top-k (``top_k <= 0`` = off), then
top-p, then a draw from the renormalised distribution; greedy is argmax. ``rollout_log_probs``
(float32, [batch, response_length]) is the log-probability of each emitted token under
``softmax(logits / T)`` WITHOUT the top-k / top-p truncation (T = the sampling temperature, 1 when
it is not positive), i.e. what the actor recomputes with ``response_logprobs(..., temperature)``;
0 after the first EOS. With top-k / top-p on, the tokens are drawn from the truncated distribution
but scored under the untruncated one, exactly as the actor scores them.
``rollout_entropys`` (same shape) is the entropy of that untruncated distribution at each response token,
what the actor's ``with_entropy`` pass gives: ``actor/entropy`` without a pass of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from verl.models.kv_cache import leading_padding_columns
from verl.protocol import DataProto
from verl.utils.precision import compute_in
from verl.workers.rollout.base import (
    ROLLOUT_ENTROPY_KEY,
    ROW_BUDGET_KEY,
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    register_rollout,
)
from verl.workers.rollout.decoders import _HFDecoder, _LeanDecoder, lean_decoder_supported
from verl.workers.rollout.lean_weights import LeanWeights

# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------


def warp_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """HF's warpers, in HF's order: temperature, top-k, top-p. Removed tokens get -inf."""
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=False)
        cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_remove = cum_probs <= (1 - sampling.top_p)
        sorted_remove[..., -1:] = False  # always keep the most likely token
        remove = sorted_remove.scatter(-1, sorted_idx, sorted_remove)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def scoring_temperature(sampling: SamplingParams) -> float:
    """The temperature the returned log-probs use: the sampling one, or 1 when it is not positive."""
    return sampling.temperature if sampling.temperature > 0 else 1.0


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from (unnormalised) probabilities, by inverting the CDF.

    Exact like ``torch.multinomial`` (which HF uses) but ~15x cheaper on a CPU: one uniform number per
    row instead of one exponential per vocabulary entry. Zero-probability tokens (cut by top-k / top-p)
    are never drawn: their CDF step is flat, and the draw is clamped to the last token with mass. The
    float32 running sum reproduces each token's probability to within half an ulp of the sum (< 3e-8
    of the total), the same precision as the float32 probabilities themselves.
    """
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:].contiguous()
    u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device, generator=generator) * total
    drawn = torch.searchsorted(cdf, u, right=True)
    return torch.minimum(drawn, torch.searchsorted(cdf, total)).squeeze(-1)


class Draw(NamedTuple):
    """One decode step's draw, per row: the token, its log-prob and (when asked) the entropy of the
    distribution both are measured under, softmax(logits / T) untruncated."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None


class Decoded(NamedTuple):
    """What a decode loop returns: responses ``[batch, max_new]``, their log-probs and entropies (None unless
    asked), and the number of decode steps taken."""

    responses: torch.Tensor
    log_probs: torch.Tensor
    entropies: torch.Tensor | None
    steps: int


def sample_next(
    logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
    with_entropy: bool = False,
) -> Draw:
    """The next token of each row and its log-prob under softmax(logits / T), untruncated; drawn from
    ``generator`` (None: torch's default one). ``with_entropy``: also that distribution's entropy, as the
    actor computes it (``-(p * log p).sum()``)."""
    logits = logits.float()
    temperature = scoring_temperature(sampling)
    scaled = logits / temperature if temperature != 1.0 else logits
    log_probs = torch.log_softmax(scaled, dim=-1)
    truncated = 0 < sampling.top_k < logits.shape[-1] or sampling.top_p < 1.0
    probs = log_probs.exp() if with_entropy or (sampling.do_sample and not truncated) else None
    if not sampling.do_sample:
        tokens = logits.argmax(dim=-1)
    elif truncated:
        tokens = draw(torch.softmax(warp_logits(logits, sampling), dim=-1), generator)
    else:
        # no truncation: the scoring distribution is the sampling one
        tokens = draw(probs, generator)
    entropy = -(probs * log_probs).sum(-1) if with_entropy else None
    return Draw(tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), entropy)


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


@register_rollout("fast")
class FastRollout(RolloutEngine):
    """KV-cached decoding with finished rows dropped, sampling in torch ops, log-probs returned.

    ``lean``: use the lean Llama-style decode step (default: whenever ``lean_decoder_supported``),
    or False to run the model's own forward (any HF causal LM).
    ``compact_fraction``: finished rows leave the active batch once at least this fraction of it
    has finished; selecting the cache rows copies the whole cache, so dropping rows one at a time
    would not pay. Measured (1M model, 64 rows, 128 tokens, lengths spread around 37): 0.125 6.9k,
    0.25 7.6k, 0.5 7.3k tokens/s; never dropping rows 4.6k.
    """

    compact_fraction = 0.25
    label = "fast (verl's KV-cached sampler)"
    # Its ``rollout_log_probs`` are the actor's log-probs of the same weights (tests/unit/test_fast_rollout.py),
    # so before any update they can stand in for the old_log_prob pass.
    returns_log_probs = True

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        micro_batch_size: int | None = None,
        lean: bool | None = None,
    ) -> None:
        self.model = model
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.micro_batch_size = micro_batch_size
        use_lean = lean_decoder_supported(model) if lean is None else lean
        self.decoder_cls = _LeanDecoder if use_lean else _HFDecoder
        self.generator: torch.Generator | None = None
        """where ``generate_sequences`` draws (None: torch's default generator). A server in a process that
        trains (the generative reward model's) sets its own, so its draws never move the trainer's stream."""

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        chunks = prompts.split(self.micro_batch_size) if self.micro_batch_size else [prompts]
        outputs = self._in_eval(
            lambda weights: [self._generate(chunk, sampling, weights) for chunk in chunks]
        )
        return DataProto.concat(outputs) if len(outputs) > 1 else outputs[0]

    @torch.no_grad()
    def decode_until(
        self,
        prompts: DataProto,
        sampling: SamplingParams,
        enough: Callable[[torch.Tensor], bool],
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Decode every row together until ``enough(finished)`` (a bool per row) says stop, or all rows finish.

        Returns the responses and log-probs [batch, max_new] (entries after a row's stop token, or after the
        last step, are arbitrary) and the number of decode steps taken: a row still unfinished then has that
        many tokens. ``generator``: where the draws come from (None: torch's default generator). The
        streaming rollout interrupts generations this way (`verl.workers.rollout.streaming`).
        """

        def decode(weights: LeanWeights | None) -> tuple[torch.Tensor, torch.Tensor, int]:
            with torch.inference_mode():
                out = self._decode(prompts, sampling, weights, enough, generator)
            return out.responses.clone(), out.log_probs.clone(), out.steps

        return self._in_eval(decode)

    def _in_eval(self, fn: Callable[[LeanWeights | None], Any]) -> Any:
        """``fn(weights)`` with the module in eval mode, under the engine's compute dtype."""
        was_training = self.model.training
        self.model.eval()
        try:
            with compute_in(self.compute_dtype, next(self.model.parameters()).device):
                return fn(self.decoder_cls.prepare(self.model))  # under the autocast: it picks the dtype
        finally:
            self.model.train(was_training)

    def _generate(
        self, prompts: DataProto, sampling: SamplingParams, weights: LeanWeights | None
    ) -> DataProto:
        with torch.inference_mode():
            out = self._decode(prompts, sampling, weights, generator=self.generator, with_entropy=True)
        # Inference-mode tensors cannot be saved for backward, and the update uses these: plain copies.
        output = assemble_rollout_output(
            prompts,
            out.responses.clone(),
            sampling.stop_tokens(self.eos_token_ids),
            self.pad_token_id,
            sampling.max_new_tokens,
            prompts.batch.get(ROW_BUDGET_KEY),
        )
        mask = output.batch["response_mask"]
        output.batch["rollout_log_probs"] = out.log_probs.clone() * mask
        output.batch[ROLLOUT_ENTROPY_KEY] = out.entropies.clone() * mask
        return output

    def _decode(
        self,
        prompts: DataProto,
        sampling: SamplingParams,
        weights: LeanWeights | None,
        enough: Callable[[torch.Tensor], bool] | None = None,
        generator: torch.Generator | None = None,
        with_entropy: bool = False,
    ) -> Decoded:
        """Responses [batch, max_new], their log-probs and (``with_entropy``) entropies (entries after a
        row's EOS are arbitrary), and the decode steps taken; ``enough``: see :meth:`decode_until`."""
        input_ids, attention_mask = _strip_common_left_padding(
            prompts.batch["input_ids"], prompts.batch["attention_mask"]
        )
        batch, max_new = input_ids.shape[0], sampling.max_new_tokens
        responses = input_ids.new_full((batch, max_new), self.pad_token_id)
        log_probs = torch.zeros(batch, max_new, dtype=torch.float32, device=input_ids.device)
        entropies = torch.zeros_like(log_probs) if with_entropy else None
        decoder = self.decoder_cls(self.model, weights)
        logits = decoder.prefill(input_ids, attention_mask, max_new)
        # A lookup table over the vocabulary: one indexing op per step (torch.isin sorts, ~60 us).
        stop_ids = sampling.stop_tokens(self.eos_token_ids)
        is_stop = torch.zeros(max([logits.shape[-1], *(i + 1 for i in stop_ids)]), dtype=torch.bool)
        is_stop[stop_ids] = True
        is_stop = is_stop.to(input_ids.device)
        rows = torch.arange(batch, device=input_ids.device)  # the output row of each active row
        finished = torch.zeros_like(rows, dtype=torch.bool)
        budgets = prompts.batch.get(ROW_BUDGET_KEY)  # each row's own max_new_tokens (an agent loop's turns)
        done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)  # by output row, for `enough`
        for t in range(max_new):
            tokens, token_log_probs, entropy = sample_next(logits, sampling, generator, with_entropy)
            responses[rows, t] = tokens
            log_probs[rows, t] = token_log_probs
            if entropies is not None:
                entropies[rows, t] = entropy
            finished |= is_stop[tokens]
            if budgets is not None:
                finished |= budgets[rows] <= t + 1
            n_finished = int(finished.sum())
            if t == max_new - 1 or n_finished == len(rows):
                break
            if enough is not None:
                done[rows] = finished
                if enough(done):
                    break
            if n_finished >= max(1.0, self.compact_fraction * len(rows)):
                keep = (~finished).nonzero().squeeze(-1)
                decoder.keep_rows(keep)
                rows, tokens, finished = rows[keep], tokens[keep], finished[keep]
            logits = decoder.step(tokens)
        return Decoded(responses, log_probs, entropies, t + 1)


def _strip_common_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row: they are never attended to."""
    first = leading_padding_columns(attention_mask)
    if first == 0 or first >= input_ids.shape[1]:
        return input_ids, attention_mask
    return input_ids[:, first:], attention_mask[:, first:]
