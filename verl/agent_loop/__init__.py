"""Agent loops: multi-turn rollouts with tools, token-in / token-out (see verl.agent_loop.base)."""

from verl.agent_loop import tool_agent  # noqa: F401  (registers tool_agent)
from verl.agent_loop.base import (
    AGENT_LOOPS,
    AgentLoopBase,
    AgentLoopContext,
    AgentLoopOutput,
    SingleTurnAgentLoop,
    register_agent_loop,
)
from verl.agent_loop.runner import AgentLoopRunner, uses_agent_loop

__all__ = [
    "AGENT_LOOPS",
    "AgentLoopBase",
    "AgentLoopContext",
    "AgentLoopOutput",
    "AgentLoopRunner",
    "SingleTurnAgentLoop",
    "register_agent_loop",
    "uses_agent_loop",
]
