"""Rollout through HuggingFace ``generate``: the reference engine every other engine is checked against."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from verl.protocol import DataProto
from verl.utils.precision import compute_in
from verl.workers.rollout.base import (
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    register_rollout,
)


@register_rollout("hf")
class HFRollout(RolloutEngine):
    """Generates with the actor's own module (the hybrid engine: no second copy of the weights)."""

    returns_log_probs = False  # no rollout_log_probs: the old_log_prob pass computes them when needed
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
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=prompts.batch["attention_mask"],
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            **kwargs,
        )
        self.model.train(was_training)
        responses = output[:, input_ids.shape[1] :]
        return assemble_rollout_output(
            prompts, responses, self.eos_token_ids, self.pad_token_id, sampling.max_new_tokens
        )
