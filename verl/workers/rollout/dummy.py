"""A rollout engine with no model: random tokens, for checking the structure of a pipeline quickly."""

from __future__ import annotations

import torch

from verl.protocol import DataProto
from verl.workers.rollout.base import (
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    register_rollout,
)


@register_rollout("dummy")
class DummyRollout(RolloutEngine):
    """Responses of random tokens (from torch's global generator, so seeded runs repeat), each ending in
    EOS at a random length between 1 and ``max_new_tokens``. Greedy sampling gives the same response for
    every prompt. Useful to test data flow, rewards and updates without paying for generation."""

    returns_log_probs = False  # no rollout_log_probs: the old_log_prob pass computes them when needed
    label = "dummy (random tokens, no model)"

    def __init__(
        self, model: torch.nn.Module, eos_token_ids: list[int], pad_token_id: int, micro_batch_size=None
    ):
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id

    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        batch_size, length = len(prompts), sampling.max_new_tokens
        rows = 1 if not sampling.do_sample else batch_size
        responses = torch.randint(0, self.vocab_size, (rows, length))
        lengths = torch.randint(1, length + 1, (rows,))
        responses[torch.arange(rows), lengths - 1] = self.eos_token_ids[0]
        return assemble_rollout_output(
            prompts, responses.expand(batch_size, length), self.eos_token_ids, self.pad_token_id, length
        )
