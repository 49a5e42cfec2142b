"""The agent loops of a batch are answered in waves: each engine call holds every waiting turn, in row order,
whatever the timing of the tools between turns, so a seeded run samples the same tokens every time."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.agent_loop.base import AgentLoopBase, AgentLoopOutput
from verl.agent_loop.runner import AgentLoopRunner
from verl.workers.rollout.base import SamplingParams, TokenRequest, TokenResponse, left_padded_batch

STOP, PAD = 2, 0


class SlowTool(AgentLoopBase):
    """Turn 1, a tool that takes a random time (0-20 ms), turn 2."""

    async def run(self, sampling, prompt_ids, **row):
        out = AgentLoopOutput(prompt_ids=list(prompt_ids), num_turns=1)
        out.append_sampled(await self.generate(prompt_ids, sampling, 3))
        await asyncio.sleep(random.random() / 50)
        out.append_inserted([5])
        out.append_sampled(await self.generate(list(prompt_ids) + out.response_ids, sampling, 3))
        return out


def runner(calls: list[list[int]]) -> AgentLoopRunner:
    """A runner whose engine answers a call's requests with tokens drawn from one seeded stream in the order
    given (as a batch engine does), recording each call's rows (by their prompt's first id)."""
    draws = torch.Generator().manual_seed(0)

    async def submit_all(requests: list[TokenRequest]) -> list[TokenResponse]:
        await asyncio.sleep(random.random() / 100)
        calls.append([request.prompt_ids[0] for request in requests])
        tokens = torch.randint(10, 50, (len(requests), 2), generator=draws).tolist()
        return [
            TokenResponse(r.request_id, t + [STOP], [-1.0] * 3, "stop")
            for r, t in zip(requests, tokens, strict=True)
        ]

    config = OmegaConf.from_dotlist(
        [
            "data.max_response_length=8",
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
            "actor_rollout_ref.rollout.agent.agent_loop_config_path=null",
            "actor_rollout_ref.rollout.multi_turn.enable=false",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path=null",
        ]
    )
    result = AgentLoopRunner(config, None, None, [STOP], PAD, submit_all=submit_all)
    result.loop_classes["slow_tool"] = SlowTool
    result.default_loop = "slow_tool"
    return result


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_turns_are_answered_in_row_order_waves_whatever_the_tools_timing(seed):
    prompts = left_padded_batch([[100 + row, 7] for row in range(6)], PAD)
    prompts.non_tensor_batch["uid"] = np.array([str(row) for row in range(6)], dtype=object)
    outputs = []
    for timing in (seed, seed + 10):  # two runs whose tools finish in different orders
        random.seed(timing)
        calls: list[list[int]] = []
        outputs.append(runner(calls).generate_sequences(prompts, SamplingParams(max_new_tokens=8)))
        every_row = list(range(100, 106))
        assert calls == [every_row, every_row]  # two waves of every row, in row order
    assert torch.equal(outputs[0].batch["responses"], outputs[1].batch["responses"])


def test_an_engine_error_reaches_every_loop_of_the_wave():
    async def broken(requests):
        raise RuntimeError("engine down")

    r = runner([])
    r.submit_all = broken
    prompts = left_padded_batch([[100, 7], [101, 7]], PAD)
    with pytest.raises(RuntimeError, match="engine down"):
        r.generate_sequences(prompts, SamplingParams(max_new_tokens=8))
