"""Stopping and continuing generations on an engine that cannot stop a decode part-way (vLLM, SGLang, HF).

The streaming pool (:mod:`verl.workers.rollout.streaming`) decodes its unfinished rows together until enough
groups are complete, then leaves the others running into the next collect, possibly under new weights. The
fast engine stops its own decode loop for that (``FastRollout.decode_until``). Any other engine gets the same
contract here, as verl runs partial rollouts on vLLM: the rows are generated a chunk of tokens at a time, each
chunk a request of the row's prompt and its tokens so far (the engine prefills them again: an interrupted
request is aborted and resumed), and after each chunk the stop rule is asked.

The chunk is a quarter of the response budget (at least one token): at most about four prefills per row, and
a batch handed over at most a quarter of a response later than the fast engine would hand it. Each chunk's
requests draw with seeds taken from the pool's generator, so a run is reproducible where the engine honours
per-request seeds (vLLM does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.rollout.base import ROW_BUDGET_KEY, SamplingParams, TokenRequest

CHUNKS_PER_RESPONSE = 4


def decode_in_chunks(
    engine: Any,
    prompts: DataProto,
    sampling: SamplingParams,
    enough: Callable[[torch.Tensor], bool],
    generator: torch.Generator,
    weights_version: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``FastRollout.decode_until``'s contract through ``engine.generate_tokens``: the responses and log-probs
    [rows, max_new_tokens] (arbitrary after a row's end) and the number of decode steps taken (every row still
    unfinished then has that many tokens)."""
    mask = prompts.batch["attention_mask"].bool()
    ids = prompts.batch["input_ids"]
    prompt_ids = [ids[row][mask[row]].tolist() for row in range(len(ids))]
    width = sampling.max_new_tokens
    budgets = prompts.batch.get(ROW_BUDGET_KEY)
    budgets = [width] * len(prompt_ids) if budgets is None else [min(int(b), width) for b in budgets.tolist()]
    stops = set(sampling.stop_tokens(engine.eos_token_ids))
    tokens: list[list[int]] = [[] for _ in prompt_ids]
    log_probs: list[list[float]] = [[] for _ in prompt_ids]
    done = torch.tensor([budget <= 0 for budget in budgets])
    chunk = max(1, math.ceil(width / CHUNKS_PER_RESPONSE))
    steps = 0
    while not bool(done.all()) and not enough(done):
        running = [row for row in range(len(prompt_ids)) if not done[row]]
        step = min(chunk, max(budgets[row] - len(tokens[row]) for row in running))
        seed = int(torch.randint(0, 2**31 - 1 - len(prompt_ids), (1,), generator=generator))
        requests = [
            TokenRequest(
                f"row-{row}",
                prompt_ids[row] + tokens[row],
                dataclasses.replace(sampling, max_new_tokens=min(step, budgets[row] - len(tokens[row]))),
                weights_version,
                seed + row,
            )
            for row in running
        ]
        for row, response in zip(running, engine.generate_tokens(requests), strict=True):
            tokens[row] += response.response_ids
            log_probs[row] += response.log_probs or [0.0] * len(response.response_ids)
            ended = bool(response.response_ids) and response.response_ids[-1] in stops
            done[row] = ended or len(tokens[row]) >= budgets[row]
        steps += step
    responses = torch.full((len(prompt_ids), width), engine.pad_token_id, dtype=torch.long)
    drawn = torch.zeros(len(prompt_ids), width)
    for row, (row_tokens, row_log_probs) in enumerate(zip(tokens, log_probs, strict=True)):
        responses[row, : len(row_tokens)] = torch.tensor(row_tokens, dtype=torch.long)
        drawn[row, : len(row_log_probs)] = torch.tensor(row_log_probs)
    return responses, drawn, steps
