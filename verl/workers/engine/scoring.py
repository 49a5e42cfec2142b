"""The forward passes of the actor and critic: per-response-token log-probs, entropies and values.

Both take a padded rollout batch (left-padded prompt + right-padded response per row) and return
``[rows, response_length]`` tensors, zero where ``response_mask`` is 0. Two things keep the work to the
real tokens:

* ``remove_padding``: the batch is packed into one sequence (`verl.workers.engine.packing`), so no
  layer computes on padding;
* ``share_prompts``: each distinct prompt of a micro-batch goes through the model once and its
  responses (GRPO's ``rollout.n`` samples) attend to its cached keys and values: the same log-probs
  and gradients with the prompt computed once per group instead of once per sample; the tokens all
  the prompts start with (a chat template's system prompt) go through once per micro-batch;
* only the positions that predict a real response token go through the LM head, ``chunk_size``
  tokens at a time: full-vocabulary logits never exist for more than one chunk. With gradients the
  chunk's head is recomputed in the backward pass (activation checkpointing), so the logits are not
  kept either — the memory that dominates an update when the vocabulary is large.

The scorers are ``nn.Module`` wrappers around the HF model so that DDP can wrap them: DDP must see
the whole forward to reduce the gradients.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from verl.models.kv_cache import (
    cache_keyword,
    common_prefix,
    distinct_rows,
    forward_prompts,
    new_cache,
    no_prefix,
)
from verl.models.plumbing import activation_checkpointing_on
from verl.utils.precision import compute_in
from verl.workers.engine.distributed import all_reduce_max
from verl.workers.engine.fsdp import needs_lockstep
from verl.workers.engine.packing import pack, packed_positions

# Config attributes of models whose logits are more than ``lm_head(hidden)``: they use the HF forward.
_SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def response_mask_of(data: Any) -> torch.Tensor:
    """The batch's ``response_mask``, or (older batches without one) the response part of its attention mask."""
    batch = data.batch
    if "response_mask" in batch:
        return batch["response_mask"]
    return batch["attention_mask"][:, -batch["responses"].shape[1] :]


def response_positions(response_mask: torch.Tensor, width: int) -> torch.Tensor:
    """Flat positions in the padded ``[rows, width]`` batch of the tokens that predict each real
    response token: the logit at position t predicts token t+1, so the one just before it."""
    rows, response_length = response_mask.shape
    first = width - response_length - 1
    grid = torch.arange(rows, device=response_mask.device)[:, None] * width
    grid = grid + first + torch.arange(response_length, device=response_mask.device)[None, :]
    return grid.flatten()[response_mask.flatten().bool()]


class HeadOutputs(NamedTuple):
    """What the LM-head step computes per scored position (``[N]``, or ``[N, k]``): the label's log-prob, and as
    asked the entropy, the log-probs at given ids (with gradients: on-policy distillation's student side at the
    teacher's top-k) and the position's own top-k ids and log-probs (detached)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    at_ids_log_probs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_log_probs: torch.Tensor | None = None


def head_chunk(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    at_ids: torch.Tensor | None,
    temperature: float,
    with_entropy: bool,
    topk: int,
) -> HeadOutputs:
    """One chunk of positions through the LM head: logits / temperature, log-softmax in fp32, and from the same
    log-probs everything `HeadOutputs` holds (what was not asked for is None). The one place the per-position
    head math lives: the actor, the reference and the distillation teachers all score through it."""
    logits = head(hidden)
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = F.log_softmax(logits.float(), dim=-1)
    token_log_probs = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if with_entropy else None
    at_ids_log_probs = topk_ids = topk_log_probs = None
    if at_ids is not None:
        at_ids_log_probs = log_probs.gather(-1, at_ids.long())
    if topk:
        top = log_probs.detach().topk(min(topk, log_probs.shape[-1]), dim=-1)
        topk_ids, topk_log_probs = top.indices, top.values
    return HeadOutputs(token_log_probs, entropy, at_ids_log_probs, topk_ids, topk_log_probs)


class _Scorer(torch.nn.Module):
    def __init__(
        self,
        hf_model: torch.nn.Module,
        remove_padding: bool = False,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.hf_model = hf_model
        self.remove_padding = remove_padding
        self.compute_dtype = compute_dtype
        """autocast dtype of the model's body (`verl.utils.precision`); None computes in the weights' dtype"""

    def _run(
        self,
        forward: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        """``forward``'s first output at the positions that predict the real response tokens, in row-major
        order of ``response_mask``: ``[N, ...]``."""
        positions = response_positions(response_mask, input_ids.shape[1])
        if self.remove_padding:
            packed = pack(input_ids, attention_mask, position_ids)
            out = forward(**packed.model_kwargs(), use_cache=False)[0]
            index = packed_positions(packed, positions, input_ids.numel())
        else:
            out = forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            )[0]
            index = positions
        return out.flatten(0, 1)[index]


def _scatter(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-real-token ``values`` back into a zero ``[rows, response_length]`` tensor."""
    out = values.new_zeros(response_mask.shape)
    out.view(-1)[response_mask.flatten().bool().nonzero().squeeze(-1)] = values
    return out


def scatter_k(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-real-token rows ``[N, k]`` back into a zero ``[rows, response_length, k]`` tensor (gradients flow)."""
    out = values.new_zeros((*response_mask.shape, values.shape[-1]))
    out.view(-1, values.shape[-1])[response_mask.flatten().bool()] = values
    return out


def real_token_rows(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[rows, response_length, k]`` -> ``[N, k]`` at the real response tokens, in `scatter_k`'s order."""
    return values.reshape(-1, values.shape[-1])[response_mask.flatten().bool()]


def shared_prompt_hidden(
    decoder: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_mask: torch.Tensor,
    lockstep: bool = False,
) -> torch.Tensor:
    """The decoder's last hidden states at the positions that predict the real response tokens
    (``[N, hidden]``, row-major), computing each distinct prompt once.

    The distinct prompts (left-padded) run first, the tokens they all start with (a chat template's system
    prompt) once as one row (`verl.models.kv_cache.forward_prompts`), and their keys and values are kept;
    the cache is then gathered to one copy per row (its backward adds the rows' gradients into their
    prompt's). The responses run last, cut to the longest one less its last token, attending to that cache. The
    first response token is predicted by the prompt's last position, the others by the response positions before
    them.
    ``lockstep``: FSDP ranks must make the same passes, so the prefix is shared only where every rank shares.
    """
    width = input_ids.shape[1] - response_mask.shape[1]
    prompt_mask = attention_mask[:, :width]
    representative, inverse = distinct_rows(torch.cat([input_ids[:, :width], prompt_mask], dim=1))
    prompts = input_ids[representative, :width], prompt_mask[representative]
    prefix = common_prefix(*prompts)
    if lockstep and all_reduce_max(int(prefix.length == 0)):
        prefix = no_prefix(prompts[1])
    cache = new_cache(decoder.config)
    keyword = cache_keyword(decoder)
    prompt_out = forward_prompts(
        decoder, *prompts, position_ids[representative, :width], cache, prefix, **{keyword: cache}
    )[0]
    cache.reorder_cache(inverse)
    # Up to the last token scored in any row (its last response_mask 1, not the count of them: a multi-turn
    # response has unscored tool tokens in between); later columns predict nothing that is scored.
    scored = response_mask.bool().any(0).nonzero()
    used = int(scored[-1]) + 1 if len(scored) else 1
    # The last of those columns predicts nothing scored and no earlier column attends to it: it is not run (one
    # column is, when the prompt alone predicts every scored token, so that the pass always happens).
    run = max(used - 1, 1)
    response_out = decoder(
        input_ids=input_ids[:, width : width + run],
        attention_mask=torch.cat([prefix.cache_mask()[inverse], attention_mask[:, width : width + run]], 1),
        position_ids=position_ids[:, width : width + run],
        use_cache=True,
        **{keyword: cache},
    )[0]
    hidden = torch.cat([prompt_out[inverse, -1:], response_out[:, : used - 1]], dim=1)
    return hidden.flatten(0, 1)[response_mask[:, :used].flatten().bool()]


class PolicyScorer(_Scorer):
    """log p(response token | prefix) (and the entropy of that distribution) from a causal LM.

    With ``at_ids`` (``[rows, response_length, k]`` token ids) or ``topk`` the head step also returns, per
    response position, the log-probs at those ids (with gradients) and the position's own top-k ids and
    log-probs, all from the very logits the token's log-prob is taken from (`head_chunk`): on-policy
    distillation's student side, and a teacher's top-k.
    """

    def __init__(
        self,
        hf_model: torch.nn.Module,
        remove_padding: bool = False,
        chunk_size: int = 0,
        share_prompts: bool = False,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(hf_model, remove_padding, compute_dtype)
        self.chunk_size = chunk_size
        config = getattr(hf_model, "config", None)
        self.plain_head = not any(getattr(config, key, None) for key in _SCALED_LOGITS)
        self.share_prompts = share_prompts and not remove_padding

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        responses: torch.Tensor,
        response_mask: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = False,
        at_ids: torch.Tensor | None = None,
        topk: int = 0,
    ) -> (
        tuple[torch.Tensor, torch.Tensor | None]
        | tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]
    ):
        """``(log_probs, entropy)`` of the responses, ``[rows, response_length]``; with ``at_ids`` or ``topk`` a
        third item, ``{"at_ids_log_probs", "topk_ids", "topk_log_probs"}`` (those asked for), each
        ``[rows, response_length, k]``. Everything is zero at padding."""
        labels = responses.flatten()[response_mask.flatten().bool()]
        # Gradient checkpointing switches HF's cache off, and the shared prompts need it.
        checkpointing = self.hf_model.training and activation_checkpointing_on(self.hf_model)
        # Sharing reads each row's last prompt position, so the prompts must be left-padded.
        left_padded = bool(attention_mask[:, input_ids.shape[1] - responses.shape[1] - 1].all())
        if self.share_prompts and needs_lockstep(self):
            # Sharing runs the decoder twice; every FSDP rank must make the same number of passes.
            left_padded = not all_reduce_max(int(not left_padded))
        with compute_in(self.compute_dtype, input_ids.device):
            if self.plain_head and self.share_prompts and left_padded and not checkpointing:
                hidden = shared_prompt_hidden(
                    self.hf_model.get_decoder(),
                    input_ids,
                    attention_mask,
                    position_ids,
                    response_mask,
                    lockstep=needs_lockstep(self),
                )
                head = self.hf_model.get_output_embeddings()
            elif self.plain_head:
                hidden = self._run(
                    self.hf_model.get_decoder(), input_ids, attention_mask, position_ids, response_mask
                )
                head = self.hf_model.get_output_embeddings()
            else:
                hidden = self._run(self.hf_model, input_ids, attention_mask, position_ids, response_mask)
                head = torch.nn.Identity()  # ``hidden`` are already the logits
            # The head computes in the autocast dtype too (as verl's); the log-softmax is always fp32.
            ids = None if at_ids is None else real_token_rows(at_ids, response_mask)
            out = self._chunked_head(head, hidden, labels, temperature, with_entropy, ids, topk)
        log_probs = _scatter(out.log_probs, response_mask)
        entropy = _scatter(out.entropy, response_mask) if with_entropy else None
        if at_ids is None and not topk:
            return log_probs, entropy
        extras = {
            name: scatter_k(getattr(out, name), response_mask)
            for name in ("at_ids_log_probs", "topk_ids", "topk_log_probs")
            if getattr(out, name) is not None
        }
        return log_probs, entropy, extras

    def _chunked_head(
        self,
        head: torch.nn.Module,
        hidden: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        at_ids: torch.Tensor | None = None,
        topk: int = 0,
    ) -> HeadOutputs:
        """`head_chunk` over ``chunk_size`` positions at a time; with gradients each chunk is recomputed in the
        backward pass, so no chunk's full-vocabulary logits are kept."""
        size = self.chunk_size if self.chunk_size > 0 else max(len(labels), 1)
        recompute = torch.is_grad_enabled() and len(labels) > size
        score = functools.partial(
            head_chunk, head, temperature=temperature, with_entropy=with_entropy, topk=topk
        )
        parts = []
        # At least one (maybe empty) chunk: the head stays in the graph, which DDP expects of every parameter.
        for start in range(0, max(len(labels), 1), size):
            chunk = slice(start, start + size)
            args = (hidden[chunk], labels[chunk], None if at_ids is None else at_ids[chunk])
            parts.append(checkpoint(score, *args, use_reentrant=False) if recompute else score(*args))
        return HeadOutputs(
            *(None if first is None else torch.cat([p[i] for p in parts]) for i, first in enumerate(parts[0]))
        )


class ValueScorer(_Scorer):
    """V(state before each response token) from a token-classification model with one label."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        with compute_in(self.compute_dtype, input_ids.device):
            values = self._run(self.hf_model, input_ids, attention_mask, position_ids, response_mask)
        return _scatter(values.squeeze(-1).float(), response_mask)
