"""The agent-loop interface: one coroutine per sample that turns a prompt into a trajectory.

An agent loop talks to the rollout engine token-in / token-out (:meth:`AgentLoopBase.generate`: prompt ids
and sampling settings in, sampled ids and their log-probs out) and returns an :class:`AgentLoopOutput`:
the prompt's ids, the response (every sampled token and every inserted one, in order), a mask that is 1 on
sampled tokens and 0 on inserted ones, and the sampled tokens' log-probs. Many samples are in flight at
once: every ``await`` lets the others run, and the rollout server batches their requests.

Loops are registered by name (``@register_agent_loop("my_agent")``), chosen per sample by the data's
``agent_name`` column or ``actor_rollout_ref.rollout.agent.default_agent_loop``; a user loop is a class in
a file, named in ``rollout.agent.agent_loop_config_path`` (see verl.agent_loop.runner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from verl.utils.registry import Registry
from verl.workers.rollout.base import SamplingParams, TokenResponse

AGENT_LOOPS = Registry("agent loop (actor_rollout_ref.rollout.agent.default_agent_loop / agent_name)")


def register_agent_loop(name: str) -> Callable:
    """Class decorator: make an :class:`AgentLoopBase` subclass available under ``name``."""
    return AGENT_LOOPS.register(name)


@dataclass
class AgentLoopOutput:
    """One trajectory. ``response_mask[i]`` is 1 when ``response_ids[i]`` was sampled, 0 when it was inserted
    (a tool result, a user turn, the template's separators); ``response_logprobs`` has one entry per response
    token, 0 on inserted ones (None when the engine returns none)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = field(default_factory=list)
    num_turns: int = 0
    """assistant and inserted turns, verl's ``__num_turns__`` (a single-turn sample has 2: prompt and reply)"""
    metrics: dict[str, float] = field(default_factory=dict)
    """per-sample numbers summarised by verl.agent_loop.metrics (tool_calls, tool_errors, tool_latency_s, ...)"""
    extra_fields: dict[str, Any] = field(default_factory=dict)
    """per-sample values added to the batch's non-tensor fields (e.g. ``tool_rewards``)"""

    def append_sampled(self, response: TokenResponse) -> None:
        self.response_ids += response.response_ids
        self.response_mask += [1] * len(response.response_ids)
        if self.response_logprobs is not None:
            if response.log_probs is None:
                self.response_logprobs = None
            else:
                self.response_logprobs += list(response.log_probs)

    def append_inserted(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        if self.response_logprobs is not None:
            self.response_logprobs += [0.0] * len(ids)


@dataclass
class AgentLoopContext:
    """What every loop of one rollout call shares: the engine client, the tokenizer, the settings."""

    generate: Callable[[list[int], SamplingParams], Awaitable[TokenResponse]]
    """token-in / token-out: one request to the rollout server"""
    tokenizer: Any
    stop_token_ids: list[int]
    max_response_length: int
    """the whole trajectory after the prompt (sampled + inserted tokens) fits in this"""
    multi_turn: Any
    """``actor_rollout_ref.rollout.multi_turn``"""
    tools: dict[str, Any] = field(default_factory=dict)
    """name -> verl.tools.BaseTool"""


class AgentLoopBase:
    """Subclass and implement :meth:`run`. One instance serves every sample of a rollout call that names it."""

    def __init__(self, context: AgentLoopContext) -> None:
        self.context = context
        self.tokenizer = context.tokenizer

    async def generate(self, ids: list[int], sampling: SamplingParams, budget: int) -> TokenResponse:
        """Sample one turn continuing ``ids``, at most ``budget`` new tokens (the rest of the response budget)."""
        return await self.context.generate(ids, dataclasses.replace(sampling, max_new_tokens=budget))

    async def run(self, sampling: SamplingParams, prompt_ids: list[int], **row: Any) -> AgentLoopOutput:
        """The trajectory of one sample. ``row`` holds the sample's other fields (``raw_prompt``,
        ``extra_info``, ``tools_kwargs``, ...)."""
        raise NotImplementedError


@register_agent_loop("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """One sampled reply: what a rollout without an agent loop does."""

    async def run(self, sampling: SamplingParams, prompt_ids: list[int], **row: Any) -> AgentLoopOutput:
        output = AgentLoopOutput(prompt_ids=list(prompt_ids), num_turns=2)
        output.append_sampled(await self.generate(prompt_ids, sampling, self.context.max_response_length))
        return output
