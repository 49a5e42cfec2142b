"""Tools and model output that must not stop a rollout: the parser never raises on model output, a tool that
hangs is cut at ``multi_turn.tool_call_timeout_s``, a tool's ``sys.exit()`` / ``KeyboardInterrupt`` is a tool
error, and cancelling a rollout (a Ctrl-C) cancels its tool calls, killing a subprocess tool's process."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from test_agent_loop import QWEN_SPECIALS, QWEN_TEMPLATE, make_tokenizer, multi_turn, scripted

from verl.agent_loop import AgentLoopContext
from verl.agent_loop import tool_calls as tool_calls_module
from verl.agent_loop.tool_agent import ToolAgentLoop
from verl.agent_loop.tool_calls import (
    RunStopping,
    ToolBlocked,
    ToolThread,
    ToolTimeout,
    cancel_all,
    check_timeout,
)
from verl.agent_loop.tool_parser import MAX_CALLS_PER_TURN, parse_hermes
from verl.config.errors import ConfigError
from verl.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse
from verl.workers.rollout.base import SamplingParams

STOP = "<|im_end|>"


def wrap(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


# ------------------------------------------------------------------------------------------------ the parser

HOSTILE_CALLS = {
    "deep-json": wrap('{"name": "calculator", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "deep-json-just-past-the-recursion-limit": wrap("[" * 3000 + "]" * 3000),
    "deep-arguments-string": wrap('{"name": "calculator", "arguments": "' + "[" * 50_000 + '"}'),
    "int-of-5000-digits": wrap('{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}"),
    "nan": wrap('{"name": "calculator", "arguments": {"expression": NaN}}'),
    "infinity": wrap('{"name": "calculator", "arguments": {"x": -Infinity}}'),
    "float-overflow": wrap('{"name": "calculator", "arguments": {"x": 1e999}}'),
    "escaped-lone-surrogate": wrap('{"name": "calculator", "arguments": {"expression": "\\ud800"}}'),
    "raw-lone-surrogate": wrap('{"name": "calculator", "arguments": {"expression": "\ud800"}}'),
    "surrogate-in-name": wrap('{"name": "calc\\udfff", "arguments": {}}'),
    "10-mb-body": wrap('{"name": "calculator", "arguments": {"expression": "' + "1+" * 5_000_000 + '1"}}'),
    "arguments-a-list": wrap('{"name": "calculator", "arguments": [1, 2]}'),
    "arguments-a-number": wrap('{"name": "calculator", "arguments": 7}'),
    "arguments-null": wrap('{"name": "calculator", "arguments": null}'),
    "arguments-json-of-json": wrap(
        '{"name": "calculator", "arguments": "\\"{\\\\\\"expression\\\\\\": \\\\\\"1+1\\\\\\"}\\""}'
    ),
    "arguments-bad-json-string": wrap('{"name": "calculator", "arguments": "{oops"}'),
    "name-a-number": wrap('{"name": 5, "arguments": {}}'),
    "name-empty": wrap('{"name": "  ", "arguments": {}}'),
    "name-huge": wrap('{"name": "' + "n" * 10_000 + '", "arguments": {}}'),
    "a-list": wrap("[1, 2, 3]"),
    "empty-body": wrap(""),
    "nul-bytes": wrap('{"name": "calculator\x00", "arguments": {"expression": "1\x00"}}'),
    "unclosed": "<tool_call>" + '{"name": "calculator"',
    "100k-unclosed-tags": "<tool_call>" * 100_000,
}


@pytest.mark.parametrize("text", list(HOSTILE_CALLS.values()), ids=list(HOSTILE_CALLS))
def test_the_parser_never_raises_and_reports_a_bad_call(text: str) -> None:
    start = time.perf_counter()
    parsed = parse_hermes(text)
    assert time.perf_counter() - start < 5
    assert parsed.has_calls and not parsed.calls
    assert parsed.errors
    for error in parsed.errors:  # the model is told, in a message that can be tokenized and logged
        error.encode("utf-8")
        assert len(error) < 1000


def test_the_parser_reads_good_calls_next_to_bad_ones() -> None:
    text = (
        wrap('{"name": "calculator", "arguments": "{\\"expression\\": \\"1+2\\"}"}')
        + HOSTILE_CALLS["nan"]
        + wrap('{"name": "calculator", "arguments": {"expression": "[[[[ in a string"}}')
    )
    parsed = parse_hermes(text)
    assert [call.arguments for call in parsed.calls] == [
        {"expression": "1+2"},
        {"expression": "[[[[ in a string"},
    ]
    assert len(parsed.errors) == 1 and "NaN" in parsed.errors[0]


def test_the_parser_reads_a_bounded_number_of_calls() -> None:
    parsed = parse_hermes(wrap('{"name": "calculator", "arguments": {}}') * 10_000)
    assert len(parsed.calls) == MAX_CALLS_PER_TURN
    assert parsed.errors == [
        f"at most {MAX_CALLS_PER_TURN} tool calls are read per turn; the others were ignored"
    ]


def test_a_parser_that_raises_is_one_error_for_the_model(qwen) -> None:
    def broken(text: str):
        raise RecursionError("a user's parser")

    turns = ['<tool_call>{"name": "calculator"}</tool_call>', "done"]
    loop = ToolAgentLoop(_context(qwen, turns, {}, max_assistant_turns=2))
    loop.parse = broken
    output = asyncio.run(loop.run(SamplingParams(max_new_tokens=999), _prompt(qwen)))
    assert "Error: the tool calls could not be read (RecursionError)" in qwen.decode(output.response_ids)
    assert output.metrics["tool_errors"] == 1 and output.num_turns == 4  # the model was sampled again


# ------------------------------------------------------------------------------------------------ tools


@pytest.fixture(scope="module")
def qwen():
    return make_tokenizer(QWEN_SPECIALS, QWEN_TEMPLATE, STOP)


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'


class Scripted(BaseTool):
    """A calculator-named tool whose ``execute`` is the given coroutine function."""

    def __init__(self, execute: Any, release: Any = None) -> None:
        super().__init__({}, OpenAIFunctionToolSchema("calculator"))
        self._execute, self._release = execute, release
        self.cancelled = 0

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        try:
            return await self._execute(self)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        if self._release is not None:
            await self._release(self)
        await super().release(instance_id)


def _context(tokenizer, turns: list[str], tools: dict[str, BaseTool], **settings: Any) -> AgentLoopContext:
    return AgentLoopContext(
        generate=scripted(tokenizer, STOP, turns, []),
        tokenizer=tokenizer,
        stop_token_ids=[tokenizer.convert_tokens_to_ids(STOP)],
        max_response_length=1024,
        multi_turn=multi_turn(**settings),
        tools=tools,
    )


def _prompt(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def run_tool(tokenizer, tool: BaseTool, turns: list[str] | None = None, **settings: Any):
    """One trajectory: the model calls the tool, then answers "done"."""
    loop = ToolAgentLoop(_context(tokenizer, turns or [CALL, "done"], {"calculator": tool}, **settings))
    output = asyncio.run(loop.run(SamplingParams(max_new_tokens=999), _prompt(tokenizer)))
    return output, tokenizer.decode(output.response_ids)


async def sleep_forever(tool: BaseTool):
    await asyncio.sleep(3600)


def test_a_tool_that_never_returns_is_cut_at_the_timeout_and_cancelled(qwen) -> None:
    tool = Scripted(sleep_forever)
    start = time.perf_counter()
    output, text = run_tool(qwen, tool, tool_call_timeout_s=0.3)
    assert time.perf_counter() - start < 5
    assert "Error: the tool call timed out after 0.3 s" in text
    assert text.rstrip().endswith("done" + STOP)  # the model was sampled again after the error
    assert tool.cancelled == 1  # the call got CancelledError
    assert output.metrics["tool_timeouts"] == 1 and output.metrics["tool_errors"] == 1
    assert tool.instances == {}  # and its instance was released


def test_a_tool_that_blocks_its_thread_is_cut_and_its_thread_replaced(qwen, monkeypatch) -> None:
    """time.sleep inside async code: no asyncio loop can interrupt it, but it blocks only the tool thread."""
    monkeypatch.setattr(tool_calls_module, "CANCEL_GRACE_S", 0.3)

    async def block(tool: BaseTool):
        time.sleep(2)
        return ToolResponse("late"), 0.0, {}

    tool = Scripted(block)
    loop = ToolAgentLoop(_context(qwen, [CALL, "done"], {"calculator": tool}, tool_call_timeout_s=0.2))
    start = time.perf_counter()
    output = asyncio.run(loop.run(SamplingParams(max_new_tokens=999), _prompt(qwen)))
    assert time.perf_counter() - start < 1.8
    assert "timed out after 0.2 s" in qwen.decode(output.response_ids)
    assert loop.tool_threads["calculator"].abandoned == 1  # the blocked thread was left behind
    assert output.metrics["tool_errors"] == 3  # the call timed out; calc_reward and release were refused


def test_a_blocked_tool_is_refused_until_its_thread_is_free(monkeypatch) -> None:
    monkeypatch.setattr(tool_calls_module, "CANCEL_GRACE_S", 0.2)
    thread = ToolThread()

    async def block() -> int:
        time.sleep(1.0)
        return 1

    async def main() -> None:
        with pytest.raises(ToolTimeout):
            await thread.call(block, 0.1, "tool 'x'")
        with pytest.raises(ToolBlocked, match="tool 'x' is unavailable: an earlier call still blocks it"):
            await thread.call(lambda: asyncio.sleep(0, result=2), 1.0, "tool 'x'")
        await asyncio.sleep(1.0)  # the blocking call returns: the tool is free again, on a fresh thread
        assert await thread.call(lambda: asyncio.sleep(0, result=2), 1.0, "tool 'x'") == 2

    asyncio.run(main())


@pytest.mark.parametrize(
    ("raise_it", "message"),
    [
        (lambda: sys.exit(3), "Error: the tool called sys.exit(3)"),
        (lambda: sys.exit("bye"), "Error: the tool called sys.exit('bye')"),
        (lambda: (_ for _ in ()).throw(KeyboardInterrupt), "Error: the tool raised KeyboardInterrupt"),
        (lambda: (_ for _ in ()).throw(GeneratorExit("odd")), "Error: the tool raised GeneratorExit: odd"),
        (lambda: (_ for _ in ()).throw(RecursionError("deep")), "Error: RecursionError: deep"),
        (lambda: (_ for _ in ()).throw(asyncio.CancelledError), "Error: the tool raised CancelledError"),
    ],
    ids=[
        "sys.exit(3)",
        "sys.exit(str)",
        "KeyboardInterrupt",
        "GeneratorExit",
        "RecursionError",
        "CancelledError",
    ],
)
def test_a_tool_that_exits_or_raises_is_a_tool_error_and_the_loop_goes_on(qwen, raise_it, message) -> None:
    async def execute(tool: BaseTool):
        raise_it()

    output, text = run_tool(qwen, Scripted(execute))
    assert message in text
    assert text.rstrip().endswith("done" + STOP)
    assert output.metrics["tool_errors"] == 1 and output.metrics["tool_timeouts"] == 0


def test_a_tool_answer_of_the_wrong_shape_or_a_nan_reward_is_a_tool_error(qwen) -> None:
    async def nothing(tool: BaseTool):
        return None

    async def nan(tool: BaseTool):
        return ToolResponse("1"), float("nan"), {}

    assert "execute must return (ToolResponse, reward, metrics)" in run_tool(qwen, Scripted(nothing))[1]
    assert "the tool's step reward is nan, not a finite number" in run_tool(qwen, Scripted(nan))[1]


def test_a_release_that_hangs_is_bounded_and_counted(qwen) -> None:
    async def answer(tool: BaseTool):
        return ToolResponse("3"), 0.0, {}

    start = time.perf_counter()
    output, text = run_tool(qwen, Scripted(answer, release=sleep_forever), tool_call_timeout_s=0.3)
    assert time.perf_counter() - start < 5
    assert "3" in text and output.metrics["tool_errors"] == 1


def test_the_timeout_setting_is_checked() -> None:
    assert check_timeout(None) is None and check_timeout(2) == 2.0
    for bad in (0, -1, "60", True, float("nan")):
        with pytest.raises(ValueError, match="tool_call_timeout_s must be a number of seconds > 0"):
            check_timeout(bad)


def test_a_bad_timeout_setting_is_a_config_error(qwen) -> None:
    with pytest.raises(ConfigError, match="tool_call_timeout_s"):
        ToolAgentLoop(_context(qwen, [], {}, tool_call_timeout_s=0))


# ------------------------------------------------------------------------------------------------ cancellation


class SubprocessTool(BaseTool):
    """Runs a child that sleeps; kills it when cancelled (as the python tool does)."""

    def __init__(self) -> None:
        super().__init__({}, OpenAIFunctionToolSchema("calculator"))
        self.pids: list[int] = []

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(600)")
        self.pids.append(proc.pid)
        try:
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return ToolResponse("finished"), 0.0, {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_timed_out_subprocess_tool_has_its_process_killed(qwen) -> None:
    tool = SubprocessTool()
    _, text = run_tool(qwen, tool, tool_call_timeout_s=1.0)
    assert "timed out after 1 s" in text
    assert len(tool.pids) == 1 and not _alive(tool.pids[0])


def test_cancelling_the_rollout_cancels_the_tool_call_and_kills_its_process(qwen) -> None:
    tool = SubprocessTool()
    loop = ToolAgentLoop(_context(qwen, [CALL, "done"], {"calculator": tool}))

    async def main() -> None:
        task = asyncio.ensure_future(loop.run(SamplingParams(max_new_tokens=999), _prompt(qwen)))
        while not tool.pids:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    start = time.perf_counter()
    asyncio.run(main())
    assert time.perf_counter() - start < 10
    assert not _alive(tool.pids[0])
    assert tool.instances == {}  # released on the way out


def test_a_real_interrupt_in_the_rollout_thread_ends_the_run_and_kills_the_tool_process(qwen) -> None:
    """A Ctrl-C raises KeyboardInterrupt in the main thread, where the rollout's loop runs (never a tool): it
    propagates, and asyncio.run's cleanup cancels the tool call, whose process is killed."""
    tool = SubprocessTool()
    loop = ToolAgentLoop(_context(qwen, [CALL, "done"], {"calculator": tool}))

    def interrupt() -> None:
        raise KeyboardInterrupt

    async def main() -> None:
        task = asyncio.ensure_future(loop.run(SamplingParams(max_new_tokens=999), _prompt(qwen)))
        while not tool.pids:
            await asyncio.sleep(0.01)
        asyncio.get_running_loop().call_soon(interrupt)
        await task

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert not _alive(tool.pids[0])


def _rollout_in_a_worker_thread(qwen) -> tuple[SubprocessTool, threading.Thread, list[BaseException]]:
    """A rollout whose one tool call runs a subprocess, in a daemon thread as the trainer runs it; returns once
    the tool's process has started, with the list the rollout's exception will land in."""
    tool = SubprocessTool()
    loop = ToolAgentLoop(_context(qwen, [CALL, "done"], {"calculator": tool}))
    raised: list[BaseException] = []

    def rollout() -> None:
        try:
            asyncio.run(loop.run(SamplingParams(max_new_tokens=999), _prompt(qwen)))
        except BaseException as error:
            raised.append(error)

    worker = threading.Thread(target=rollout, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not tool.pids and time.monotonic() < deadline:
        time.sleep(0.01)
    return tool, worker, raised


def test_at_exit_the_calls_of_a_rollout_in_a_worker_thread_are_cancelled(qwen) -> None:
    """An interrupted run leaves without waiting for the worker thread its rollout runs in; the exit handler
    cancel_all still cancels the tool calls in flight there (their processes die), and the rollout ends."""
    tool, worker, raised = _rollout_in_a_worker_thread(qwen)
    assert cancel_all() == 1
    assert not _alive(tool.pids[0])
    worker.join(10)
    assert [type(error) for error in raised] == [RunStopping]


def test_a_stop_signal_ends_a_rollout_in_a_worker_thread_and_kills_the_tool_process(
    qwen, monkeypatch
) -> None:
    """Ctrl-C / SIGTERM land in the main thread; the rollout, in a worker thread, sees the run stopping
    (verl.utils.stopping armed) within a fraction of a second: its tool call is cancelled, RunStopping ends it."""
    stopping = [False]
    monkeypatch.setitem(sys.modules, "verl.utils.stopping", SimpleNamespace(armed=lambda: stopping[0]))
    tool, worker, raised = _rollout_in_a_worker_thread(qwen)
    stopping[0] = True
    start = time.perf_counter()
    worker.join(10)
    assert time.perf_counter() - start < 3
    assert [type(error) for error in raised] == [RunStopping]
    assert not _alive(tool.pids[0])


def test_the_tool_thread_reports_a_timeout_without_a_tool() -> None:
    thread = ToolThread()

    async def main() -> None:
        with pytest.raises(ToolTimeout, match="timed out after 0.1 s"):
            await thread.call(lambda: asyncio.sleep(10), 0.1, "test")
        assert await thread.call(lambda: asyncio.sleep(0, result=5), 1.0, "test") == 5

    asyncio.run(main())
