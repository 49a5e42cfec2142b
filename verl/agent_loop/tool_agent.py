"""``tool_agent``: sample a turn; if it calls tools, run them, insert their results, sample again.

    prompt → [assistant turn] → tool calls? ─ no ─→ done
                   ↑                 │ yes
                   └── tool messages ┘   (inserted tokens, response_mask 0)

It stops when a turn makes no tool call, a turn runs out of tokens, the trajectory would not fit in
``data.max_response_length``, or ``multi_turn.max_assistant_turns`` / ``max_user_turns`` is reached. A tool
call the parser cannot read, a tool that does not exist or a tool that fails becomes a tool message starting
with ``Error:`` (the model can recover; the sample is not lost). Each tool gets one instance per trajectory
(``create`` at its first call, ``calc_reward`` and ``release`` at the end); the step rewards and final rewards
of all of them add up to the sample's ``tool_rewards`` field, which reward functions may read.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from verl.agent_loop.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput, register_agent_loop
from verl.agent_loop.chat import ChatRenderer
from verl.agent_loop.tool_parser import TOOL_PARSERS, ToolCall
from verl.tools.base import ToolError
from verl.workers.rollout.base import SamplingParams

logger = logging.getLogger(__name__)


def truncate(text: str, limit: int, side: str) -> str:
    """``text`` cut to ``limit`` characters, keeping its start (``left``), end (``right``) or both ends
    (``middle``), with a marker where it was cut (verl's ``tool_response_truncate_side``)."""
    if limit <= 0 or len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "\n...(truncated)...\n" + text[len(text) - (limit - half) :]


def tools_kwargs_of(row: dict[str, Any]) -> dict[str, Any]:
    """The row's per-tool arguments, ``{tool: {create_kwargs, execute_kwargs, calc_reward_kwargs,
    release_kwargs}}``, from its ``tools_kwargs`` field or ``extra_info.tools_kwargs`` (verl's layouts)."""
    kwargs = row.get("tools_kwargs")
    if kwargs is None and isinstance(row.get("extra_info"), dict):
        kwargs = row["extra_info"].get("tools_kwargs")
    # parquet gives every row the union of the rows' keys, None where a row has none
    return {name: value for name, value in (kwargs or {}).items() if value is not None}


@register_agent_loop("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    def __init__(self, context: AgentLoopContext) -> None:
        super().__init__(context)
        cfg = context.multi_turn
        self.parse = TOOL_PARSERS.lookup(cfg.format)
        schemas = [tool.get_openai_tool_schema().to_dict() for tool in context.tools.values()]
        self.renderer = ChatRenderer(context.tokenizer, context.stop_token_ids, schemas or None)
        self.max_assistant_turns = cfg.max_assistant_turns
        self.max_user_turns = cfg.max_user_turns
        self.max_parallel_calls = max(1, int(cfg.max_parallel_calls))
        self.max_tool_response_length = int(cfg.max_tool_response_length)
        self.truncate_side = cfg.tool_response_truncate_side

    async def run(self, sampling: SamplingParams, prompt_ids: list[int], **row: Any) -> AgentLoopOutput:
        output = AgentLoopOutput(prompt_ids=list(prompt_ids), num_turns=1)
        instances: dict[str, str] = {}
        tool_kwargs = tools_kwargs_of(row)
        counts = {"tool_calls": 0.0, "tool_errors": 0.0, "tool_latency_s": 0.0}
        tool_rewards = 0.0
        assistant_turns = user_turns = 0
        limit = self.context.max_response_length
        try:
            while len(output.response_ids) < limit:
                turn = await self.generate(
                    prompt_ids + output.response_ids, sampling, limit - len(output.response_ids)
                )
                output.append_sampled(turn)
                assistant_turns += 1
                output.num_turns += 1
                stopped = turn.finish_reason == "stop" and turn.response_ids
                if not stopped or turn.response_ids[-1] != self.renderer.end_of_turn_id:
                    break  # cut by the budget, or ended by a stop token after which the template goes no further
                parsed = self.parse(self.tokenizer.decode(turn.response_ids, skip_special_tokens=False))
                if not parsed.has_calls:
                    break
                if self.max_assistant_turns and assistant_turns >= self.max_assistant_turns:
                    break
                if self.max_user_turns and user_turns >= self.max_user_turns:
                    break
                messages = [{"role": "tool", "content": "Error: " + error} for error in parsed.errors]
                counts["tool_errors"] += len(parsed.errors)
                for index, call in enumerate(parsed.calls):
                    if index >= self.max_parallel_calls:
                        text = f"Error: at most {self.max_parallel_calls} tool call(s) per turn; this one was not run"
                        counts["tool_errors"] += 1
                    else:
                        text, reward, failed, seconds = await self._call(call, instances, tool_kwargs)
                        tool_rewards += reward
                        counts["tool_calls"] += 1
                        counts["tool_errors"] += failed
                        counts["tool_latency_s"] += seconds
                    messages.append(
                        {
                            "role": "tool",
                            "content": truncate(text, self.max_tool_response_length, self.truncate_side),
                        }
                    )
                inserted = self.renderer.insertion_ids(messages)
                if len(output.response_ids) + len(inserted) >= limit:
                    break  # no room left for the results and an answer after them
                output.append_inserted(inserted)
                user_turns += 1
                output.num_turns += 1
        finally:
            final_rewards, failures = await self._release(instances, tool_kwargs)
            tool_rewards += final_rewards
            counts["tool_errors"] += failures
        output.metrics.update(counts)
        output.extra_fields["tool_rewards"] = tool_rewards
        return output

    async def _call(
        self, call: ToolCall, instances: dict[str, str], tool_kwargs: dict[str, Any]
    ) -> tuple[str, float, int, float]:
        """Run one call: ``(text for the model, step reward, 1 if it failed, seconds)``."""
        tool = self.context.tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(self.context.tools)) or "none"
            return f"Error: there is no tool named {call.name!r} (tools: {names})", 0.0, 1, 0.0
        kwargs = tool_kwargs.get(call.name) or {}
        start = time.perf_counter()
        try:
            if call.name not in instances:
                instances[call.name], _ = await tool.create(**(kwargs.get("create_kwargs") or {}))
            response, reward, _ = await tool.execute(
                instances[call.name], call.arguments, **(kwargs.get("execute_kwargs") or {})
            )
            return str(response.text), float(reward), 0, time.perf_counter() - start
        except ToolError as error:
            return f"Error: {error}", 0.0, 1, time.perf_counter() - start
        except Exception as error:  # a tool's bug must not fail the sample: the model sees it as an error
            logger.warning(
                "tool %r raised %s: %s (arguments %r)", call.name, type(error).__name__, error, call.arguments
            )
            return f"Error: {type(error).__name__}: {error}", 0.0, 1, time.perf_counter() - start

    async def _release(self, instances: dict[str, str], tool_kwargs: dict[str, Any]) -> tuple[float, int]:
        """``calc_reward`` then ``release`` every instance this trajectory created: the rewards' sum, and how
        many of those calls failed (logged and counted as tool errors; every instance is still released)."""
        total, failures = 0.0, 0
        for name, instance_id in instances.items():
            tool, kwargs = self.context.tools[name], tool_kwargs.get(name) or {}
            for method, key in ((tool.calc_reward, "calc_reward_kwargs"), (tool.release, "release_kwargs")):
                try:
                    result = await method(instance_id, **(kwargs.get(key) or {}))
                    total += float(result) if key == "calc_reward_kwargs" else 0.0
                except Exception as error:  # one tool's failure must not leak the others or fail the sample
                    logger.warning(
                        "tool %r: %s raised %s: %s", name, method.__name__, type(error).__name__, error
                    )
                    failures += 1
        return total, failures
