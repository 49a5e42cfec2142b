"""The generative reward model's server: OpenAI's chat API over the rollout's engine and server, on a tiny causal
LM made here. A greedy reply over HTTP is the engine's (and transformers') greedy generation of the same chat;
requests sent together are batched into fewer engine calls; several servers share the load; closing frees the
port and the threads."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests._genrm import chat_ids, genrm_config, make_judge, post
from verl.workers.reward.genrm import GenRMService
from verl.workers.rollout.base import SamplingParams, TokenRequest
from verl.workers.rollout.dummy import DummyRollout
from verl.workers.rollout.http_front import OpenAIFront
from verl.workers.rollout.openai_api import SamplingDefaults
from verl.workers.rollout.server import RolloutServer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUESTIONS = ["What is 1+2?", "Score this: 42", "hello", "b c d"]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> Path:
    return make_judge(tmp_path_factory.mktemp("genrm"))


@pytest.fixture(scope="module")
def service(judge_dir, tmp_path_factory):
    torch.set_num_threads(1)
    cfg = genrm_config(judge_dir, tmp_path_factory.mktemp("client"), "reward_model.rollout.response_length=6")
    service = GenRMService.from_config(cfg)
    yield service
    service.close()


def test_a_greedy_reply_is_the_engines_greedy_generation_of_the_chat(service, judge_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(judge_dir)
    reference = AutoModelForCausalLM.from_pretrained(judge_dir).eval()
    engine, eos = service.built.engine, service.built.stop_ids
    contents = []
    for question in QUESTIONS:
        body = {
            "model": "judge",
            "messages": [{"role": "user", "content": question}],
            "temperature": 0,
            "max_tokens": 8,
        }
        status, reply = post(service.address, "/v1/chat/completions", body)
        assert status == 200, reply
        ids = chat_ids(tokenizer, question)
        [direct] = engine.generate_tokens(
            [TokenRequest("t", ids, SamplingParams(do_sample=False, max_new_tokens=8))]
        )
        # transformers' own greedy decoding agrees: the chat template and the greedy mapping are right
        generated = reference.generate(
            torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=eos
        )
        assert generated[0, len(ids) :].tolist() == direct.response_ids
        kept = (
            direct.response_ids[:-1]
            if direct.response_ids[-1:] and direct.response_ids[-1] in eos
            else direct.response_ids
        )
        choice = reply["choices"][0]
        assert choice["message"] == {
            "role": "assistant",
            "content": tokenizer.decode(kept, skip_special_tokens=True),
        }
        assert choice["finish_reason"] == direct.finish_reason
        assert reply["usage"] == {
            "prompt_tokens": len(ids),
            "completion_tokens": len(direct.response_ids),
            "total_tokens": len(ids) + len(direct.response_ids),
        }
        contents.append(choice["message"]["content"])
    assert len(set(contents)) == len(QUESTIONS)  # the replies differ: no constant answer passes this test
    openai = pytest.importorskip("openai")
    openai.types.chat.ChatCompletion.model_validate(
        reply
    )  # the shape OpenAI's client (and verl's test) parses


def test_defaults_samples_stops_and_completions(service, judge_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(judge_dir)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    # no max_tokens: reward_model.rollout.response_length (6 here); n samples, each its own choice
    status, reply = post(service.address, "/v1/chat/completions", {"messages": messages, "n": 3, "seed": 1})
    assert status == 200 and len(reply["choices"]) == 3
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert reply["usage"]["completion_tokens"] <= 3 * 6
    # a stop string cuts the text before it
    greedy = post(
        service.address, "/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 8}
    )[1]
    text = greedy["choices"][0]["message"]["content"]
    cut = text[2:4]
    body = {"messages": messages, "temperature": 0, "max_tokens": 8, "stop": [cut]}
    stopped = post(service.address, "/v1/chat/completions", body)[1]["choices"][0]
    assert stopped["message"]["content"] == text[: text.find(cut)] and stopped["finish_reason"] == "stop"
    # /v1/completions: a text prompt (tokenized with the special tokens) or token ids
    ids = chat_ids(tokenizer, QUESTIONS[0])
    as_ids = post(service.address, "/v1/completions", {"prompt": ids, "temperature": 0, "max_tokens": 8})[1]
    assert as_ids["object"] == "text_completion" and as_ids["choices"][0]["text"] == text
    with urllib.request.urlopen(f"http://{service.address}/v1/models", timeout=30) as answer:
        assert json.loads(answer.read())["data"][0]["id"] == service.model_name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream=True is not supported"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "temperature": -1},
            "temperature must be a number >= 0",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}, "maximum context length"),
        ({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5}, "presence_penalty=0.5"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"prompt": "x"}, "messages must be a non-empty list"),
        (b"not json", "not JSON"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(service, body, message) -> None:
    status, reply = post(service.address, "/v1/chat/completions", body)
    assert status == 400 and message in reply["error"]["message"], reply


def test_requests_sent_together_are_batched_into_fewer_engine_calls(service) -> None:
    import aiohttp

    async def send_all(bodies: list[dict]) -> list[dict]:
        async with aiohttp.ClientSession() as session:

            async def one(body: dict) -> dict:
                async with session.post(f"http://{service.address}/v1/chat/completions", json=body) as reply:
                    assert reply.status == 200
                    return await reply.json()

            return await asyncio.gather(*(one(body) for body in bodies))

    bodies = [
        {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 8}
        for q in QUESTIONS * 2
    ]
    sizes: list[int] = []
    engine = service.server.engine
    generate = engine.generate_tokens

    def counting(requests):
        sizes.append(len(requests))
        return generate(requests)

    engine.generate_tokens = counting
    try:
        before = service.stats()
        replies = asyncio.run(send_all(bodies))
        after = service.stats()
    finally:
        del engine.generate_tokens
    metrics = after.metrics_since(before)
    assert metrics["reward/genrm_requests"] == len(bodies)
    assert metrics["reward/genrm_engine_calls"] == len(sizes) < len(bodies) and max(sizes) > 1
    assert metrics["reward/genrm_generated_tokens"] == sum(r["usage"]["completion_tokens"] for r in replies)
    assert metrics["timing_s/genrm"] > 0
    # the same chat, greedy, gets the same reply whichever batch it was in
    texts = [r["choices"][0]["message"]["content"] for r in replies]
    assert texts[: len(QUESTIONS)] == texts[len(QUESTIONS) :]


def test_several_servers_share_the_requests_and_closing_frees_everything(tiny_model_dir) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    servers = [
        RolloutServer(DummyRollout(model, [tokenizer.eos_token_id], tokenizer.pad_token_id)) for _ in range(2)
    ]
    defaults = SamplingDefaults(max_tokens=4, max_model_len=64)
    front = OpenAIFront(servers, tokenizer, defaults, [tokenizer.eos_token_id], "dummy")
    try:
        import aiohttp

        async def send(count: int) -> None:
            async with aiohttp.ClientSession() as session:

                async def one(i: int) -> None:
                    body = {"prompt": f"question {i}", "max_tokens": 4}
                    async with session.post(f"http://{front.address}/v1/completions", json=body) as reply:
                        assert reply.status == 200, await reply.text()

                await asyncio.gather(*(one(i) for i in range(count)))

        asyncio.run(send(8))
        answered = [server.requests_answered for server in servers]
        assert sum(answered) == 8 and min(answered) >= 1  # routed to the server with fewer in flight
    finally:
        front.close()
        for server in servers:
            server.close()
    assert_closed(front.address, [front._thread, *(server._thread for server in servers)])


def assert_closed(address: str, threads: list[threading.Thread]) -> None:
    host, port = address.rsplit(":", 1)
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()
    assert not [thread for thread in threads if thread.is_alive()]


def test_the_service_closes_once_and_for_all(judge_dir, tmp_path) -> None:
    service = GenRMService.from_config(genrm_config(judge_dir, tmp_path))
    assert post(service.address, "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
    service.close()
    service.close()  # a second close is a no-op
    assert service.closed
    assert_closed(service.address, [service.front._thread, service.server._thread])
