"""Rollout through HuggingFace ``generate``: the reference engine every other engine is checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

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
    are not taken for π_old (``returns_log_probs`` stays False): the old_log_prob pass still computes that,
    and the two are compared (``training/rollout_probs_diff_*``). ``ignore_eos`` (``SamplingParams``): no
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
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=prompts.batch["attention_mask"],
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=stop_tokens,  # [] with ignore_eos: nothing stops a row
            pad_token_id=self.pad_token_id,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=self.calculate_log_probs,
            **kwargs,
        )
        self.model.train(was_training)
        responses = output.sequences[:, input_ids.shape[1] :]
        result = assemble_rollout_output(
            prompts, responses, stop_tokens, self.pad_token_id, sampling.max_new_tokens
        )
        if self.calculate_log_probs:
            result.batch["rollout_log_probs"] = (
                _token_log_probs(output.logits, responses, sampling) * (result.batch["response_mask"])
            )
        return result


def _token_log_probs(
    logits: tuple[torch.Tensor, ...], responses: torch.Tensor, sampling: SamplingParams
) -> torch.Tensor:
    """``[rows, max_new_tokens]``: each generated token's log-prob under softmax(logits / T) (zeros past the
    steps taken)."""
    steps = torch.stack(logits, dim=1).float() / scoring_temperature(sampling)
    taken = responses[:, : steps.shape[1]]
    log_probs = F.log_softmax(steps, dim=-1).gather(-1, taken.unsqueeze(-1)).squeeze(-1)
    return F.pad(log_probs, (0, sampling.max_new_tokens - log_probs.shape[1]))
