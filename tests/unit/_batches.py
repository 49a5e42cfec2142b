"""Rollout batches built by hand for the scoring tests: what a GRPO step hands the log-prob and update passes."""

from __future__ import annotations

import torch


def grouped_batch(vocab_size: int, groups: int = 3, n: int = 4, seed: int = 0, prefix: int = 0):
    """``groups`` prompts (left-padded, lengths differ) each followed by ``n`` right-padded responses,
    the rows of a group shuffled among the others (as balancing across ranks leaves them); with ``prefix``,
    every prompt starts with the same ``prefix`` tokens (a chat template's system prompt)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_width, response_width = 6 + prefix, 5
    prompts = torch.randint(3, vocab_size, (groups, prompt_width), generator=generator)
    prompt_mask = torch.ones_like(prompts)
    shared = torch.randint(3, vocab_size, (prefix,), generator=generator)
    for g, length in enumerate([6, 2, 4][:groups]):
        prompt_mask[g, : prompt_width - length - prefix] = 0
        prompts[g, prompt_width - length - prefix : prompt_width - length] = shared
    order = torch.randperm(groups * n, generator=generator)
    group_of_row = torch.arange(groups).repeat_interleave(n)[order]
    responses = torch.randint(3, vocab_size, (groups * n, response_width), generator=generator)
    response_lengths = torch.randint(0, response_width, (groups * n,), generator=generator)
    response_lengths[0] = 1
    response_mask = (torch.arange(response_width)[None, :] < response_lengths[:, None]).long()
    input_ids = torch.cat([prompts[group_of_row], responses], dim=1)
    attention_mask = torch.cat([prompt_mask[group_of_row], response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids, responses, response_mask
