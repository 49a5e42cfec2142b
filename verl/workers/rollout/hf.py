"""Rollout through HuggingFace ``generate``: the reference engine every other engine is checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel

from verl.protocol import DataProto
from verl.utils.precision import compute_in
from verl.workers.rollout.base import (
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    register_rollout,
)
from verl.workers.rollout.fast import scoring_temperature


@register_rollout("hf")
class HFRollout(RolloutEngine):
    """Generates with the actor's own module (the hybrid engine: no second copy of the weights).

    With ``calculate_log_probs`` each response comes with its log-probs (``rollout_log_probs``) under
    softmax(logits / T), untruncated, from the logits ``generate`` returns: what the fast engine returns. They
    are not taken for π_old (``returns_log_probs`` stays False) except in rollout-correction bypass mode: the
    old_log_prob pass computes it, and the two are compared (``training/rollout_probs_diff_*``). They are
    gathered step by step (one step's distribution kept at a time). ``ignore_eos`` (``SamplingParams``): no
    token stops a response.
    """

    returns_log_probs = False  # π_old comes from the old_log_prob pass when needed
    label = "hf (transformers' generate)"
    package = "transformers"

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: list[int],
        pad_token_id: int,
        micro_batch_size: int | None = None,
    ) -> None:
        self.model = model
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.micro_batch_size = micro_batch_size

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        chunks = prompts.split(self.micro_batch_size) if self.micro_batch_size else [prompts]
        with compute_in(self.compute_dtype, self.model.device):
            outputs = [self._generate(chunk, sampling) for chunk in chunks]
        return DataProto.concat(outputs) if len(outputs) > 1 else outputs[0]

    def _generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        was_training = self.model.training
        self.model.eval()
        kwargs = {"do_sample": sampling.do_sample}
        if sampling.do_sample:
            kwargs.update(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                # top_k=0 switches HF's top-k off; its generation_config default (50) would otherwise apply.
                top_k=max(sampling.top_k, 0),
            )
        input_ids = prompts.batch["input_ids"]
        stop_tokens = sampling.stop_tokens(self.eos_token_ids)
        recorder = _SampledLogProbs(scoring_temperature(sampling)) if self.calculate_log_probs else None
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=prompts.batch["attention_mask"],
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=stop_tokens,  # [] with ignore_eos: nothing stops a row
            pad_token_id=self.pad_token_id,
            use_cache=True,
            logits_processor=LogitsProcessorList([recorder] if recorder else []),
            **kwargs,
        )
        self.model.train(was_training)
        responses = output[:, input_ids.shape[1] :]
        result = assemble_rollout_output(
            prompts, responses, stop_tokens, self.pad_token_id, sampling.max_new_tokens
        )
        if recorder is not None:
            log_probs = recorder.finish(output[:, -1:])
            log_probs = F.pad(log_probs, (0, sampling.max_new_tokens - log_probs.shape[1]))
            result.batch["rollout_log_probs"] = log_probs * result.batch["response_mask"]
        return result


class _SampledLogProbs(LogitsProcessor):
    """Each generated token's log-prob under softmax(logits / T), gathered as ``generate`` goes: it sees each
    step's logits before the temperature and the top-k / top-p warpers (which ``generate`` appends after the
    processors it is given) and keeps one step's log-softmax, from which the token sampled there is read at the
    next step (``output_logits`` would keep every step's [rows, vocab] logits)."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.previous: torch.Tensor | None = None
        self.log_probs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:  # the token the previous step sampled is input_ids' last column
            self.log_probs.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = F.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """``[rows, steps]``, given the last step's sampled tokens ``[rows, 1]``."""
        if self.previous is not None:
            self.log_probs.append(self.previous.gather(-1, last_tokens).squeeze(-1))
            self.previous = None
        if not self.log_probs:
            return last_tokens.new_zeros((last_tokens.shape[0], 0), dtype=torch.float32)
        return torch.stack(self.log_probs, dim=1)
