"""``tool_agent``: sample a turn; if it calls tools, run them, insert their results, sample again.

    prompt → [assistant turn] → tool calls? ─ no ─→ done
                   ↑                 │ yes
                   └── tool messages ┘   (inserted tokens, response_mask 0)

It stops when a turn makes no tool call, a turn runs out of tokens, the trajectory would not fit in
``data.max_response_length``, or ``multi_turn.max_assistant_turns`` / ``max_user_turns`` is reached. A tool
call the parser cannot read, a tool that does not exist or a tool that fails (raises anything, ``sys.exit()``
included, or runs past ``multi_turn.tool_call_timeout_s``) becomes a tool message starting with ``Error:``
(the model can recover; the sample is not lost). Tools run in a thread of their own, each call under a time
limit (verl.agent_loop.tool_calls). Each tool gets one instance per trajectory
(``create`` at its first call, ``calc_reward`` and ``release`` at the end); the step rewards and final rewards
of all of them add up to the sample's ``tool_rewards`` field, which reward functions may read.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from typing import Any

from verl.agent_loop.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput, register_agent_loop
from verl.agent_loop.chat import ChatRenderer
from verl.agent_loop.tool_calls import (
    CANCEL_GRACE_S,
    DEFAULT_TIMEOUT_S,
    TIMEOUT_KEY,
    RunStopping,
    ToolBlocked,
    ToolFailed,
    ToolThread,
    ToolTimeout,
    check_timeout,
)
from verl.agent_loop.tool_parser import TOOL_PARSERS, ParsedTurn, ToolCall
from verl.config.errors import ConfigError
from verl.tools.base import ToolError
from verl.workers.rollout.base import SamplingParams

logger = logging.getLogger(__name__)

WARN_EVERY_S = 30.0
"""a tool's failures are logged at most once per this many seconds (see ToolAgentLoop._warn)"""


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
        try:
            self.tool_timeout = check_timeout(getattr(cfg, "tool_call_timeout_s", DEFAULT_TIMEOUT_S))
        except ValueError as error:
            raise ConfigError(str(error)) from None
        self.tool_threads: dict[str, ToolThread] = {}
        """each tool's own thread (verl.agent_loop.tool_calls), made at its first call"""
        self._warned: dict[str, tuple[float, int]] = {}
        """per tool: when its failures were last logged, and how many were not logged since"""

    async def run(self, sampling: SamplingParams, prompt_ids: list[int], **row: Any) -> AgentLoopOutput:
        output = AgentLoopOutput(prompt_ids=list(prompt_ids), num_turns=1)
        instances: dict[str, str] = {}
        tool_kwargs = tools_kwargs_of(row)
        counts = {"tool_calls": 0.0, "tool_errors": 0.0, "tool_latency_s": 0.0, "tool_timeouts": 0.0}
        tool_rewards = 0.0
        assistant_turns = user_turns = 0
        limit = self.context.max_response_length
        cancelled = False
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
                parsed = self._parse(self.tokenizer.decode(turn.response_ids, skip_special_tokens=False))
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
                        counts["tool_errors"] += bool(failed)
                        counts["tool_timeouts"] += failed == "timeout"
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
        except asyncio.CancelledError:  # the rollout is cancelled: release the tools within the grace period
            cancelled = True
            raise
        finally:
            timeout = CANCEL_GRACE_S if cancelled else self.tool_timeout
            final_rewards, failures = await self._release(instances, tool_kwargs, timeout)
            tool_rewards += final_rewards
            counts["tool_errors"] += failures
        output.metrics.update(counts)
        output.extra_fields["tool_rewards"] = tool_rewards
        return output

    def _warn(self, tool: str, message: str, *args: Any) -> None:
        """Log a tool's failure: its first, then at most one line per WARN_EVERY_S with how many more there
        were (a hung tool fails every call of every sample: a line each would bury the run's output)."""
        now = time.monotonic()
        last, unlogged = self._warned.get(tool, (-math.inf, 0))
        if now - last < WARN_EVERY_S:
            self._warned[tool] = (last, unlogged + 1)
            return
        if unlogged:
            message += f" (and {unlogged} more failure(s) of this tool in the last %.0f s)"
            args = (*args, now - last)
        logger.warning(message, *args)
        self._warned[tool] = (now, 0)

    def _thread(self, name: str) -> ToolThread:
        if name not in self.tool_threads:
            self.tool_threads[name] = ToolThread(f"verl-tool-{name}")
        return self.tool_threads[name]

    def _parse(self, text: str) -> ParsedTurn:
        """The turn's calls; a parser that raises (a user's format) is one parse error, never a lost sample."""
        try:
            return self.parse(text)
        except Exception as error:
            logger.warning("the tool-call parser raised %s: %s", type(error).__name__, error)
            return ParsedTurn([], [f"the tool calls could not be read ({type(error).__name__})"])

    async def _call(
        self, call: ToolCall, instances: dict[str, str], tool_kwargs: dict[str, Any]
    ) -> tuple[str, float, str, float]:
        """Run one call: ``(text for the model, step reward, why it failed ("" if it did not: "error" or
        "timeout"), seconds)``. ``create`` (at the tool's first call) and ``execute`` each run under the time
        limit, on the tool thread."""
        tool = self.context.tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(self.context.tools)) or "none"
            return f"Error: there is no tool named {call.name!r} (tools: {names})", 0.0, "error", 0.0
        kwargs = tool_kwargs.get(call.name) or {}
        start = time.perf_counter()
        try:
            if call.name not in instances:
                instance_id = await self._thread(call.name).call(
                    lambda: _create(tool, kwargs.get("create_kwargs") or {}),
                    self.tool_timeout,
                    f"tool {call.name!r} (create)",
                )
                instances[call.name] = instance_id
            text, reward = await self._thread(call.name).call(
                lambda: _execute(
                    tool, instances[call.name], call.arguments, kwargs.get("execute_kwargs") or {}
                ),
                self.tool_timeout,
                f"tool {call.name!r}",
            )
            return text, reward, "", time.perf_counter() - start
        except RunStopping:  # not the tool's error: the run ends
            raise
        except ToolTimeout as error:
            self._warn(call.name, "tool %r: %s (%s); the model is told", call.name, error, TIMEOUT_KEY)
            return f"Error: {error}", 0.0, "timeout", time.perf_counter() - start
        except ToolError as error:
            return f"Error: {error}", 0.0, "error", time.perf_counter() - start
        except (ToolFailed, ToolBlocked) as error:
            self._warn(call.name, "tool %r: %s (arguments %.200r)", call.name, error, call.arguments)
            return f"Error: {error}", 0.0, "error", time.perf_counter() - start
        except Exception as error:  # a tool's bug must not fail the sample: the model sees it as an error
            self._warn(
                call.name,
                "tool %r raised %s: %s (arguments %.200r)",
                call.name,
                type(error).__name__,
                error,
                call.arguments,
            )
            return f"Error: {type(error).__name__}: {error}", 0.0, "error", time.perf_counter() - start

    async def _release(
        self, instances: dict[str, str], tool_kwargs: dict[str, Any], timeout: float | None
    ) -> tuple[float, int]:
        """``calc_reward`` then ``release`` every instance this trajectory created, each within ``timeout``:
        the rewards' sum, and how many of those calls failed (logged and counted as tool errors; every
        instance is still released)."""
        total, failures = 0.0, 0
        for name, instance_id in instances.items():
            tool, kwargs = self.context.tools[name], tool_kwargs.get(name) or {}
            for method, key in (("calc_reward", "calc_reward_kwargs"), ("release", "release_kwargs")):
                arguments = kwargs.get(key) or {}
                try:
                    result = await self._thread(name).call(
                        functools.partial(getattr(tool, method), instance_id, **arguments),
                        timeout,
                        f"tool {name!r} ({method})",
                    )
                    if method == "calc_reward":
                        total += _finite(result, f"tool {name!r}: calc_reward")
                except RunStopping:  # the run ends: nothing to release into
                    return total, failures
                except Exception as error:  # one tool's failure must not leak the others or fail the sample
                    self._warn(name, "tool %r: %s raised %s: %s", name, method, type(error).__name__, error)
                    failures += 1
        return total, failures


async def _create(tool: Any, kwargs: dict[str, Any]) -> str:
    result = await tool.create(**kwargs)
    instance_id = result[0] if isinstance(result, tuple) and result else result
    if not isinstance(instance_id, str):
        raise ToolError(f"the tool's create returned {type(result).__name__}, not (instance_id, response)")
    return instance_id


async def _execute(
    tool: Any, instance_id: str, arguments: dict[str, Any], kwargs: dict[str, Any]
) -> tuple[str, float]:
    """The tool's answer as ``(text, step reward)``, read on the tool thread (a hostile ``__str__`` blocks
    the tool thread, not the rollout); an answer of the wrong shape is the tool's error."""
    result = await tool.execute(instance_id, arguments, **kwargs)
    if not (isinstance(result, tuple) and len(result) == 3):
        raise ToolError(
            f"the tool returned {type(result).__name__}; execute must return (ToolResponse, reward, metrics)"
        )
    response, reward, _ = result
    text = getattr(response, "text", response)  # a ToolResponse (verl's own class too), or the bare text
    return str(text if text is not None else ""), _finite(reward, "the tool's step reward")


def _finite(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ToolError(f"{what} is {type(value).__name__}, not a number") from None
    if not math.isfinite(number):
        raise ToolError(f"{what} is {number}, not a finite number")
    return number
