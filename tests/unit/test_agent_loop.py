"""The agent loop: token-in / token-out trajectories, golden chat-template boundaries, tool handling.

The engine is scripted (each turn's text is given), so every expected token sequence is known exactly; the
worker tests at the end run the real engines.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from verl.agent_loop import AgentLoopContext
from verl.agent_loop.chat import ChatRenderer
from verl.agent_loop.tool_agent import ToolAgentLoop, truncate
from verl.agent_loop.tool_parser import parse_hermes
from verl.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolError, ToolResponse
from verl.workers.rollout.base import (
    ROW_BUDGET_KEY,
    SamplingParams,
    TokenRequest,
    TokenResponse,
    left_padded_batch,
)

# Qwen2.5's template, cut to what a tool conversation uses: tools listed in the system turn, tool results
# grouped into one user turn of <tool_response> blocks, every turn closed by <|im_end|> and a newline.
QWEN_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nYou may call tools:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + tool['function']['name'] }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama 3's layout: a begin token, a header per message, <|eot_id|> closing each with nothing after it; tool
# results are the ipython role.
LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{% set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = [
    "<|end_of_text|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CORPUS = [
    'What is 1234+5678? <tool_call>\n{"name": "calculator", "arguments": {"expression": "1234+5678"}}\n</tool_call>',
    "<tool_response>\n6912\n</tool_response> The answer is 6912. user assistant system tool ipython",
    "You may call tools:\n<tools>\ncalculator\n</tools> Error: there is no tool named",
]


def make_tokenizer(specials: list[str], template: str, eos: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = __import__("tokenizers").decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=specials[0], chat_template=template
    )


@pytest.fixture(scope="module")
def qwen() -> PreTrainedTokenizerFast:
    return make_tokenizer(QWEN_SPECIALS, QWEN_TEMPLATE, "<|im_end|>")


@pytest.fixture(scope="module")
def llama3() -> PreTrainedTokenizerFast:
    return make_tokenizer(LLAMA3_SPECIALS, LLAMA3_TEMPLATE, "<|eot_id|>")


class Calculator(BaseTool):
    """Adds two integers: enough to script conversations without the real calculator."""

    def __init__(self) -> None:
        super().__init__({}, OpenAIFunctionToolSchema("calculator"))
        self.released: list[str] = []

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        expression = parameters.get("expression", "")
        if "+" not in expression:
            raise ToolError(f"cannot read {expression!r}")
        a, b = expression.split("+")
        return ToolResponse(str(int(a) + int(b))), 0.5, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.25

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.released.append(instance_id)
        await super().release(instance_id)


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234+5678"}}\n</tool_call>'


def scripted(tokenizer: Any, stop: str, turns: list[str], seen: list[list[int]]):
    """An engine answering request k with ``turns[k]`` tokenized, then the stop token (log-prob -0.5 each)."""
    stop_id = tokenizer.convert_tokens_to_ids(stop)

    async def generate(ids: list[int], sampling: SamplingParams) -> TokenResponse:
        seen.append(list(ids))
        text = turns[len(seen) - 1]
        out = tokenizer.encode(text, add_special_tokens=False) + [stop_id]
        finish = "stop"
        if len(out) > sampling.max_new_tokens:
            out, finish = out[: sampling.max_new_tokens], "length"
        return TokenResponse("r", out, [-0.5] * len(out), finish)

    return generate


def multi_turn(**overrides: Any) -> SimpleNamespace:
    settings = dict(
        max_assistant_turns=None,
        max_user_turns=None,
        max_parallel_calls=1,
        max_tool_response_length=256,
        tool_response_truncate_side="middle",
        format="hermes",
    )
    return SimpleNamespace(**{**settings, **overrides})


def run_loop(tokenizer, stop, turns, messages, max_response_length=256, tools=None, row=None, **cfg):
    seen: list[list[int]] = []
    tools = {"calculator": Calculator()} if tools is None else tools
    context = AgentLoopContext(
        generate=scripted(tokenizer, stop, turns, seen),
        tokenizer=tokenizer,
        stop_token_ids=[tokenizer.convert_tokens_to_ids(stop)],
        max_response_length=max_response_length,
        multi_turn=multi_turn(**cfg),
        tools=tools,
    )
    schemas = [tool.get_openai_tool_schema().to_dict() for tool in tools.values()] or None
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=schemas, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    output = asyncio.run(
        ToolAgentLoop(context).run(SamplingParams(max_new_tokens=999), prompt, **(row or {}))
    )
    return output, seen, prompt


@pytest.mark.parametrize(
    ("name", "stop", "insertion"),
    [
        (
            "qwen",
            "<|im_end|>",
            "\n<|im_start|>user\n<tool_response>\n6912\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "llama3",
            "<|eot_id|>",
            "<|start_header_id|>ipython<|end_header_id|>\n\n6912<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
    ],
)
def test_trajectory_is_the_template_rendering_token_for_token(request, name, stop, insertion) -> None:
    """prompt + response decode to the chat template's rendering of the whole conversation, character for
    character; the ids are the prompt's, then the sampled ones exactly, then the tool turn's (with ChatML's
    newline after the sampled <|im_end|>), masked 0, then the sampled answer. (Tokenizing the whole rendering at
    once may merge across a turn boundary differently: that is why history is never re-tokenized.)"""
    tokenizer = request.getfixturevalue(name)
    question = [{"role": "user", "content": "What is 1234+5678?"}]
    output, seen, prompt = run_loop(tokenizer, stop, [CALL, "The answer is 6912."], question)

    conversation = question + [
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "6912"},
        {"role": "assistant", "content": "The answer is 6912."},
    ]
    schemas = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=schemas, tokenize=False)
    # the last turn ends at its stop token: what the template writes after it was never generated
    rendered = rendered[: rendered.rindex(stop) + len(stop)]
    assert tokenizer.decode(prompt + output.response_ids) == rendered

    first = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(stop)]
    second = tokenizer.encode("The answer is 6912.", add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids(stop)
    ]
    inserted = output.response_ids[len(first) : len(output.response_ids) - len(second)]
    assert tokenizer.decode(inserted) == insertion
    assert output.response_mask == [1] * len(first) + [0] * len(inserted) + [1] * len(second)
    assert output.response_logprobs == [-0.5] * len(first) + [0.0] * len(inserted) + [-0.5] * len(second)
    # the second request continued the exact ids: prompt, sampled turn, insertion (nothing re-tokenized)
    assert seen[1] == prompt + first + inserted
    assert output.num_turns == 4
    assert output.metrics == {
        "tool_calls": 1.0,
        "tool_errors": 0.0,
        "tool_latency_s": pytest.approx(output.metrics["tool_latency_s"]),
        "tool_timeouts": 0.0,
    }
    assert output.extra_fields["tool_rewards"] == pytest.approx(0.75)  # step reward 0.5 + final 0.25


def test_separator_and_end_of_turn_read_from_the_template(qwen, llama3) -> None:
    chatml = ChatRenderer(qwen, [qwen.convert_tokens_to_ids("<|im_end|>")])
    assert (chatml.end_of_turn, chatml.separator) == ("<|im_end|>", "\n")
    llama = ChatRenderer(llama3, [llama3.convert_tokens_to_ids("<|eot_id|>")])
    assert (llama.end_of_turn, llama.separator) == ("<|eot_id|>", "")
    with pytest.raises(ValueError, match="stop token"):
        ChatRenderer(qwen, [qwen.convert_tokens_to_ids("<|endoftext|>")])


def test_two_tool_results_render_as_one_turn(qwen) -> None:
    renderer = ChatRenderer(qwen, [qwen.convert_tokens_to_ids("<|im_end|>")])
    text = renderer.insertion_text([{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    assert text == (
        "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_no_tool_call_ends_after_one_turn(qwen) -> None:
    output, seen, _ = run_loop(qwen, "<|im_end|>", ["6912"], [{"role": "user", "content": "hi"}])
    assert len(seen) == 1 and set(output.response_mask) == {1} and output.num_turns == 2


def test_parse_errors_and_unknown_tools_are_told_to_the_model(qwen) -> None:
    bad = '<tool_call>\n{"name": "calculator", "arguments": {oops}\n</tool_call>'
    unknown = '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>'
    failing = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12"}}\n</tool_call>'
    output, seen, prompt = run_loop(
        qwen,
        "<|im_end|>",
        [bad, unknown, failing, "done"],
        [{"role": "user", "content": "q"}],
        max_response_length=2048,
    )
    assert len(seen) == 4
    text = qwen.decode(output.response_ids)
    assert "Error: the tool call is not valid JSON" in text
    assert "Error: there is no tool named 'search' (tools: calculator)" in text
    assert "Error: cannot read '12'" in text
    assert output.metrics["tool_errors"] == 3 and output.metrics["tool_calls"] == 2


def test_turn_limits_and_budget(qwen) -> None:
    question = [{"role": "user", "content": "q"}]
    output, seen, _ = run_loop(qwen, "<|im_end|>", [CALL] * 5, question, max_assistant_turns=2)
    assert len(seen) == 2 and output.metrics["tool_calls"] == 1  # the second turn's call is not run
    output, seen, _ = run_loop(qwen, "<|im_end|>", [CALL] * 5, question, max_user_turns=1)
    assert len(seen) == 2 and output.metrics["tool_calls"] == 1
    # a budget that the insertion would overflow: the trajectory stops after the first turn, and fits
    call_len = len(qwen.encode(CALL, add_special_tokens=False)) + 1
    output, seen, _ = run_loop(qwen, "<|im_end|>", [CALL] * 5, question, max_response_length=call_len + 5)
    assert len(seen) == 1 and len(output.response_ids) == call_len
    # a turn cut by the budget ends the trajectory
    output, seen, _ = run_loop(qwen, "<|im_end|>", [CALL] * 5, question, max_response_length=10)
    assert len(seen) == 1 and len(output.response_ids) == 10


def test_parallel_calls_beyond_the_limit_get_an_error(qwen) -> None:
    output, _, _ = run_loop(qwen, "<|im_end|>", [CALL + CALL, "done"], [{"role": "user", "content": "q"}])
    text = qwen.decode(output.response_ids)
    assert text.count("6912") == 1 and "at most 1 tool call(s) per turn" in text
    output, _, _ = run_loop(
        qwen, "<|im_end|>", [CALL + CALL, "done"], [{"role": "user", "content": "q"}], max_parallel_calls=2
    )
    assert qwen.decode(output.response_ids).count("<tool_response>\n6912") == 2


def test_tool_instances_are_released_and_kwargs_passed(qwen) -> None:
    seen_kwargs = {}

    class Recording(Calculator):
        async def create(self, instance_id=None, **kwargs):
            seen_kwargs.update(kwargs)
            return await super().create(instance_id, **kwargs)

    tool = Recording()
    row = {"extra_info": {"tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": "6912"}}}}}
    run_loop(
        qwen,
        "<|im_end|>",
        [CALL, CALL, "done"],
        [{"role": "user", "content": "q"}],
        tools={"calculator": tool},
        row=row,
    )
    assert seen_kwargs == {"ground_truth": "6912"}
    assert len(tool.released) == 1 and tool.instances == {}  # one instance per trajectory, released


def test_hermes_parser() -> None:
    parsed = parse_hermes(
        'x <tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call> <tool_call>[1]</tool_call> <tool_call>'
    )
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", {"a": 1})]
    assert len(parsed.errors) == 2 and "never closed" in parsed.errors[1]
    assert not parse_hermes("no calls here").has_calls


def test_truncate() -> None:
    assert truncate("abcdefghij", 4, "left") == "abcd...(truncated)"
    assert truncate("abcdefghij", 4, "right") == "(truncated)...ghij"
    assert truncate("abcdefghij", 4, "middle") == "ab\n...(truncated)...\nij"
    assert truncate("abc", 4, "middle") == "abc"


def test_runner_lays_out_the_batch_and_scorers_see_the_rollout(tmp_path) -> None:
    """Through AgentLoopRunner with the real calculator: the batch has the trainer's layout with holes in
    response_mask, the reward manager scores the final answer of the whole trajectory and passes num_turns
    and tool_rewards in extra_info."""
    import numpy as np
    import torch

    from verl.agent_loop import AgentLoopRunner
    from verl.config import load_config
    from verl.models.tiny import IM_END, build_tiny_tokenizer, tool_call_corpus
    from verl.protocol import DataProto
    from verl.workers.reward.manager import NaiveRewardManager
    from verl.workers.reward.scorers import default_compute_score
    from verl.workers.rollout.base import left_padded_batch

    tok = build_tiny_tokenizer(corpus=tool_call_corpus())
    stop = tok.convert_tokens_to_ids(IM_END)
    config = load_config(
        "grpo",
        [
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator",
            "data.max_response_length=64",
        ],
    )

    async def submit(request: TokenRequest) -> TokenResponse:
        text = tok.decode(request.prompt_ids)
        question = text.split("user\n")[1].split("=")[0]
        if "<|im_start|>tool" in text:  # answer with the tool's result
            reply = text.split("<|im_start|>tool\n")[-1].split(IM_END)[0]
        else:
            reply = CALL.replace("1234+5678", question)
        ids = tok.encode(reply, add_special_tokens=False) + [stop]
        return TokenResponse(request.request_id, ids, [-1.0] * len(ids), "stop")

    runner = AgentLoopRunner(config, tok, submit, [stop], tok.pad_token_id)
    questions = [("1234+5678=", "6912"), ("4021+3377=", "7398")]
    prompt_ids = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            )
        )
        for q, _ in questions
    ]
    prompts = left_padded_batch(prompt_ids, tok.pad_token_id)
    prompts.non_tensor_batch.update(
        {
            "data_source": np.array(["tool_arithmetic"] * 2, dtype=object),
            "reward_model": np.array([{"ground_truth": a} for _, a in questions], dtype=object),
            "extra_info": np.array([{"index": 0}, {"index": 1}], dtype=object),
        }
    )
    out = runner.generate_sequences(prompts, SamplingParams(max_new_tokens=64))
    mask, attention = out.batch["response_mask"], out.batch["attention_mask"][:, -64:]
    assert out.batch["responses"].shape == (2, 64)
    assert bool((mask <= attention).all()) and bool(((attention - mask).sum(-1) > 0).all())  # holes
    assert torch.equal(out.batch["rollout_log_probs"], -mask.float())
    assert list(out.non_tensor_batch["__num_turns__"]) == [4, 4]
    assert list(out.non_tensor_batch["__tool_calls__"]) == [1.0, 1.0]
    assert list(out.non_tensor_batch["tool_rewards"]) == [0.0, 0.0]

    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((solution_str, extra_info))
        return default_compute_score(data_source, solution_str, ground_truth, extra_info)

    batch = out.union(DataProto(non_tensor_batch=prompts.non_tensor_batch))
    reward = NaiveRewardManager(tok, compute_score=score)(batch, return_dict=True)
    assert reward["reward_tensor"].sum(-1).tolist() == [1.0, 1.0]
    last_sampled = [int(torch.nonzero(row).max()) for row in mask]
    assert [int(torch.nonzero(row).max()) for row in reward["reward_tensor"]] == last_sampled
    assert "<tool_call>" in seen[0][0] and seen[0][0].rstrip().endswith("6912")
    assert seen[0][1] == {"index": 0, "num_turns": 4, "tool_rewards": 0.0}


def python_call(code: str) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


def test_malicious_python_calls_become_tool_errors_and_the_trajectory_goes_on(qwen, tmp_path) -> None:
    """An infinite loop, a 10 GB allocation, a bounded fork loop, a write outside the sandbox and a socket:
    each call ends with an error message inside its limits, and the model is sampled again after it. Every
    case is bounded by construction (the loop by the wall limit, the rest by their own ranges)."""
    from verl.tools.python_sandbox import PythonTool

    outside = tmp_path / "escaped.txt"
    attacks = [
        "while True:\n    pass",
        "x = bytearray(10 * 2**30)",
        "import os\nfor _ in range(50):\n    os.fork()",
        f"open({str(outside)!r}, 'w').write('x')",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
    ]
    tool = PythonTool({"cpu_time_s": 1, "wall_time_s": 3, "memory_mb": 256})
    turns = [python_call(code) for code in attacks] + ["print('ok')", "done"]
    turns[-2] = python_call("print(6 * 7)")
    output, seen, _ = run_loop(
        qwen,
        "<|im_end|>",
        turns,
        [{"role": "user", "content": "q"}],
        max_response_length=8192,
        tools={"python": tool},
        max_tool_response_length=200,
    )
    assert len(seen) == len(turns)  # every turn was sampled: no attack ended the trajectory
    text = qwen.decode(output.response_ids)
    results = re.findall(r"<tool_response>\n(.*?)</tool_response>", text, re.DOTALL)
    assert len(results) == len(attacks) + 1
    assert all(result.startswith("Error:") for result in results[:-1])
    assert results[-1].strip() == "42"  # the sandbox still works after them
    assert output.metrics["tool_errors"] == len(attacks) and output.metrics["tool_calls"] == len(attacks) + 1
    assert not outside.exists()


# Qwen3 renders an empty think block only in the last assistant message: the earlier turns of a conversation
# change once more messages follow, so the probe alone is not a prefix of the longer rendering.
QWEN3_TEMPLATE = QWEN_TEMPLATE.replace(
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}",
    "{% elif message.role == 'assistant' and loop.last %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}",
)


def test_a_template_that_rewrites_earlier_turns_still_renders_insertions() -> None:
    assert QWEN3_TEMPLATE != QWEN_TEMPLATE
    tok = make_tokenizer(QWEN_SPECIALS, QWEN3_TEMPLATE, "<|im_end|>")
    renderer = ChatRenderer(tok, [tok.convert_tokens_to_ids("<|im_end|>")])
    assert renderer.insertion_text([{"role": "tool", "content": "6912"}]) == (
        "\n<|im_start|>user\n<tool_response>\n6912\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_turn_ended_by_another_stop_token_is_not_continued(qwen) -> None:
    """<|endoftext|> also stops generation (a model's generation_config), but the template ends an assistant turn
    with <|im_end|>: a tool call ended that way is not continued off-template."""
    seen: list[list[int]] = []
    end, other = qwen.convert_tokens_to_ids("<|im_end|>"), qwen.convert_tokens_to_ids("<|endoftext|>")

    async def generate(ids, sampling):
        seen.append(ids)
        out = qwen.encode(CALL, add_special_tokens=False) + [other]
        return TokenResponse("r", out, None, "stop")

    context = AgentLoopContext(generate, qwen, [end, other], 256, multi_turn(), {"calculator": Calculator()})
    output = asyncio.run(ToolAgentLoop(context).run(SamplingParams(), [1, 2]))
    assert len(seen) == 1 and output.metrics["tool_calls"] == 0 and output.response_logprobs is None


def test_tool_kwargs_with_nulls_and_failing_final_calls(qwen) -> None:
    """parquet fills absent per-tool keys with None; a tool whose calc_reward raises is counted as an error and
    every instance is still released."""

    class Failing(Calculator):
        async def calc_reward(self, instance_id, **kwargs):
            raise RuntimeError("no reward today")

    failing, fine = Failing(), Calculator()
    fine.tool_schema = OpenAIFunctionToolSchema("adder")
    adder_call = CALL.replace('"calculator"', '"adder"')
    row = {"tools_kwargs": {"calculator": {"create_kwargs": None, "execute_kwargs": None}, "other": None}}
    output, _, _ = run_loop(
        qwen,
        "<|im_end|>",
        [CALL, adder_call, "done"],
        [{"role": "user", "content": "q"}],
        tools={"calculator": failing, "adder": fine},
        row=row,
        max_response_length=1024,
    )
    assert output.metrics["tool_calls"] == 2 and output.metrics["tool_errors"] == 1
    assert len(failing.released) == len(fine.released) == 1
    assert output.extra_fields["tool_rewards"] == pytest.approx(0.5 + 0.5 + 0.25)


def test_turns_sent_together_form_one_engine_call_and_rows_stop_at_their_budget(tiny_model_dir) -> None:
    """64 loops reach their first request one after another: the server still makes one engine call of them.
    In one call of the fast engine each row stops at its own budget."""
    from verl.models import load_hf_model
    from verl.workers.rollout.fast import FastRollout
    from verl.workers.rollout.server import RolloutServer

    model = load_hf_model(tiny_model_dir)
    engine = FastRollout(model, [2], 0)
    sizes = []
    generate_tokens = engine.generate_tokens

    def counting(requests):
        sizes.append(len(requests))
        return generate_tokens(requests)

    engine.generate_tokens = counting
    server = RolloutServer(engine)
    greedy = SamplingParams(do_sample=False, ignore_eos=True)
    try:

        async def one(row: int):
            budget = 1 + row % 7
            request = TokenRequest(f"r{row}", [5, 6, 7 + row % 3], replace(greedy, max_new_tokens=budget))
            return budget, await server.generate(request)

        async def all_rows():
            return await asyncio.gather(*(one(row) for row in range(64)))

        answers = asyncio.run(all_rows())
    finally:
        server.close()
    assert sizes == [64]
    for budget, answer in answers:
        assert len(answer.response_ids) == budget and answer.finish_reason == "length"
    # greedy: a row cut at its budget is the prefix of the same prompt's longer answers
    by_prompt = {}
    for row, (_, answer) in enumerate(answers):
        by_prompt.setdefault(row % 3, []).append(answer.response_ids)
    for runs in by_prompt.values():
        full = max(runs, key=len)
        assert all(run == full[: len(run)] for run in runs)

    # the engine itself stops each row at its budget (no decoding past it)
    batch = left_padded_batch([[5, 6, 7]] * 3, 0)
    batch.batch[ROW_BUDGET_KEY] = torch.tensor([1, 4, 2])
    out = engine.generate_sequences(batch, replace(greedy, max_new_tokens=4))
    assert out.batch["response_mask"].sum(-1).tolist() == [1, 4, 2]
