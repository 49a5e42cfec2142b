"""Token-in / token-out requests and the server mode (rollout.mode=async), on the fast engine: no vLLM needed."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.workers.rollout.base import (
    RolloutEngine,
    SamplingParams,
    TokenRequest,
    TokenResponse,
    batch_from_responses,
    left_padded_batch,
    requests_from_batch,
)
from verl.workers.rollout.fast import FastRollout
from verl.workers.rollout.server import RolloutServer, generate_batch

PAD, EOS = 0, 7


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_requests_drop_the_padding_and_responses_come_back_in_the_batch_layout() -> None:
    prompts = left_padded_batch([[5, 6, 9], [4]], PAD)
    assert prompts.batch["input_ids"].tolist() == [[5, 6, 9], [PAD, PAD, 4]]
    assert prompts.batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    sampling = SamplingParams(max_new_tokens=4)
    requests = requests_from_batch(prompts, sampling, weights_version=3)
    assert [(r.prompt_ids, r.weights_version) for r in requests] == [([5, 6, 9], 3), ([4], 3)]
    call = requests[0].request_id.rpartition("-")[0]
    assert [r.request_id for r in requests] == [f"{call}-0", f"{call}-1"]
    assert requests_from_batch(prompts, sampling)[0].request_id != requests[0].request_id  # unique per call

    responses = [
        TokenResponse("0", [11, EOS], [-0.5, -0.25], "stop"),
        TokenResponse("1", [12, 13, 14, 15], [-1.0, -2.0, -3.0, -4.0], "length"),
    ]
    out = batch_from_responses(prompts, responses, [EOS], PAD, sampling)
    assert out.batch["responses"].tolist() == [[11, EOS, PAD, PAD], [12, 13, 14, 15]]
    assert out.batch["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert out.batch["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, -4.0]]
    assert out.batch["input_ids"].tolist() == [[5, 6, 9, 11, EOS, PAD, PAD], [PAD, PAD, 4, 12, 13, 14, 15]]
    assert out.batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 4]]
    # ignore_eos: an EOS inside the response does not end it
    full = batch_from_responses(
        prompts, responses, [EOS], PAD, SamplingParams(max_new_tokens=4, ignore_eos=True)
    )
    assert full.batch["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]  # row 0 is 2 tokens long
    assert (
        "rollout_log_probs"
        not in batch_from_responses(
            prompts, [TokenResponse("0", [EOS], None, "stop"), responses[1]], [EOS], PAD, sampling
        ).batch
    )


def test_server_answers_equal_the_batch_call_token_for_token(model) -> None:
    """All rows sent at once form one engine call: the same batch, the same random draws."""
    eos = [model.config.eos_token_id]
    engine = FastRollout(model, eos, PAD)
    gen = torch.Generator().manual_seed(0)
    prompts = left_padded_batch(
        [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (3, 8, 5, 12, 6, 9)], PAD
    ).repeat(4, interleave=True)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10)
    torch.manual_seed(1)
    direct = engine.generate_sequences(prompts, sampling)
    server = RolloutServer(engine, max_num_seqs=256)
    try:
        torch.manual_seed(1)
        served = generate_batch(server, prompts, sampling)
    finally:
        server.close()
    assert server.engine_calls == 1
    for key in (
        "responses",
        "response_mask",
        "input_ids",
        "attention_mask",
        "position_ids",
        "rollout_log_probs",
    ):
        assert torch.equal(served.batch[key], direct.batch[key]), key


def test_many_requests_from_coroutines_are_each_answered_once(model) -> None:
    engine = FastRollout(model, [model.config.eos_token_id], PAD)
    server = RolloutServer(engine, max_num_seqs=16)
    greedy = SamplingParams(do_sample=False, max_new_tokens=6)
    prompts = {f"q{i}": [3 + i % 50, 4 + i % 7, 5] for i in range(100)}

    async def ask_all() -> list[TokenResponse]:
        return await asyncio.gather(
            *(server.generate(TokenRequest(k, v, greedy)) for k, v in prompts.items())
        )

    try:
        answers = asyncio.run(ask_all())
    finally:
        server.close()
    assert [a.request_id for a in answers] == list(prompts)
    assert server.engine_calls >= 100 // 16
    (alone,) = engine.generate_tokens([TokenRequest("q7", prompts["q7"], greedy)])
    assert answers[7].response_ids == alone.response_ids and answers[7].finish_reason == alone.finish_reason


class _Failing(RolloutEngine):
    pad_token_id, eos_token_ids = PAD, [EOS]

    def __init__(self) -> None:
        self.release = threading.Event()

    def generate_tokens(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        self.release.wait(5)
        raise ValueError(f"engine broke on {len(requests)} requests")


def test_repeated_ids_are_refused_and_engine_errors_reach_every_request() -> None:
    engine = _Failing()
    server = RolloutServer(engine)
    sampling = SamplingParams(max_new_tokens=2)
    first = server.submit(TokenRequest("a", [5], sampling))
    with pytest.raises(ValueError, match=r"already in flight or repeated: \['a'\]"):
        server.submit(TokenRequest("a", [6], sampling))
    with pytest.raises(ValueError, match=r"repeated: \['b'\]"):
        server.submit_all([TokenRequest("b", [5], sampling), TokenRequest("b", [6], sampling)])
    engine.release.set()
    with pytest.raises(ValueError, match="engine broke on 1 requests"):
        first.result(timeout=10)
    # the id is free again once answered
    again = server.submit(TokenRequest("a", [6], sampling))
    with pytest.raises(ValueError, match="engine broke"):
        again.result(timeout=10)
    server.close()
    with pytest.raises(RuntimeError, match="closed"):
        server.submit(TokenRequest("c", [5], sampling))


def test_ignore_eos_generates_every_token(model) -> None:
    eos = list(range(model.config.vocab_size))  # every token is an EOS: without ignore_eos, one token each
    engine = FastRollout(model, eos, PAD)
    prompts = left_padded_batch([[5, 6], [7, 8, 9]], PAD)
    stopped = engine.generate_sequences(prompts, SamplingParams(max_new_tokens=5))
    assert stopped.batch["response_mask"].sum(dim=1).tolist() == [1, 1]
    full = engine.generate_sequences(prompts, SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert full.batch["response_mask"].sum(dim=1).tolist() == [5, 5]
    (response,) = engine.generate_tokens(
        [TokenRequest("x", [5, 6], SamplingParams(max_new_tokens=5, ignore_eos=True))]
    )
    assert len(response.response_ids) == 5 and response.finish_reason == "length"


def test_tokens_carry_their_stop_reason(model) -> None:
    engine = FastRollout(model, list(range(model.config.vocab_size)), PAD)
    (response,) = engine.generate_tokens([TokenRequest("x", [5, 6], SamplingParams(max_new_tokens=5))])
    assert len(response.response_ids) == 1 and response.finish_reason == "stop"


class _Slow(RolloutEngine):
    """Answers each request with its prompt, after ``delay`` seconds per call."""

    pad_token_id, eos_token_ids = PAD, [EOS]

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.seen: list[list[str]] = []
        self.started = threading.Event()

    def generate_tokens(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        import time

        self.seen.append([r.request_id for r in requests])
        self.started.set()
        time.sleep(self.delay)
        return [TokenResponse(r.request_id, list(r.prompt_ids), None, "length") for r in requests]


def test_a_cancelled_request_is_dropped_and_the_server_keeps_serving() -> None:
    engine = _Slow(0.3)
    server = RolloutServer(engine, max_num_seqs=4)
    sampling = SamplingParams(max_new_tokens=2)
    first = server.submit(TokenRequest("first", [1], sampling))  # keeps the engine busy for 0.3 s
    assert engine.started.wait(5)

    async def impatient() -> None:  # waits behind it, and gives up
        await asyncio.wait_for(server.generate(TokenRequest("waiting", [2], sampling)), timeout=0.05)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(impatient())
    answers = server.generate_many([TokenRequest("next", [3, 4], sampling)])
    assert first.result(timeout=5).response_ids == [1] and [a.response_ids for a in answers] == [[3, 4]]
    assert engine.seen == [["first"], ["next"]]  # the cancelled request never reached the engine
    server.close()


def test_an_engine_answering_the_wrong_number_fails_its_batch_not_the_server() -> None:
    class Short(_Slow):
        def generate_tokens(self, requests):
            return (
                super().generate_tokens(requests)[:-1]
                if len(requests) > 1
                else super().generate_tokens(requests)
            )

    server = RolloutServer(Short(0.0))
    sampling = SamplingParams(max_new_tokens=2)
    with pytest.raises(RuntimeError, match="answered 1 of 2 requests"):
        server.generate_many([TokenRequest("a", [1], sampling), TokenRequest("b", [2], sampling)])
    assert server.generate_many([TokenRequest("c", [5], sampling)])[0].response_ids == [5]
    server.close()


def test_a_dropped_server_releases_its_engine_and_thread() -> None:
    import gc
    import weakref

    engine = _Slow(0.0)
    server = RolloutServer(engine)
    server.generate_many([TokenRequest("a", [1], SamplingParams(max_new_tokens=1))])
    engine_ref, thread = weakref.ref(engine), server._thread
    del server, engine
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive() and engine_ref() is None


def test_rollout_tensors_follow_the_prompts_device() -> None:
    """Responses are assembled where the prompts are (a GPU worker's device); `meta` stands in for it."""
    prompts = left_padded_batch([[5, 6], [7]], PAD, device="meta")
    assert prompts.batch["input_ids"].device.type == "meta"
    with pytest.raises(NotImplementedError):  # meta tensors have no values to read back: this is the
        requests_from_batch(prompts, SamplingParams(max_new_tokens=2))  # only step that needs them
    cpu = left_padded_batch([[5, 6], [7]], PAD)
    responses = [
        TokenResponse("0", [11, EOS], [-0.5, -0.25], "stop"),
        TokenResponse("1", [12], [-1.0], "length"),
    ]
    out = batch_from_responses(cpu.to("meta"), responses, [EOS], PAD, SamplingParams(max_new_tokens=3))
    assert {t.device.type for t in out.batch.values()} == {"meta"}
