"""``logprobs`` on the OpenAI-compatible server (the generative reward model's, over the fast engine): each
returned token with the log-prob the engine sampled it with, in OpenAI's chat and completion layouts."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests._genrm import chat_ids, post
from tests.unit.test_genrm_server import judge_dir, service  # noqa: F401  (the module's fixtures)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MESSAGES = [{"role": "user", "content": "What is 1+2?"}]


def test_chat_logprobs_are_the_replys_tokens(service, judge_dir) -> None:  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(judge_dir)
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 8, "logprobs": True}
    status, reply = post(service.address, "/v1/chat/completions", body)
    assert status == 200, reply
    choice = reply["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) >= 1 and "".join(entry["token"] for entry in content) == choice["message"]["content"]
    assert all(
        bytes(entry["bytes"]).decode() == entry["token"] and entry["top_logprobs"] == [] for entry in content
    )
    # the model's own log-probs of its greedy tokens (transformers' generate, the same weights)
    ids = chat_ids(tokenizer, MESSAGES[0]["content"])
    model = AutoModelForCausalLM.from_pretrained(judge_dir).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=len(content), do_sample=False, output_logits=True,
            return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id or 0,
        )  # fmt: skip
    tokens = out.sequences[0, len(ids) :]
    expected = [
        torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens, strict=True)
    ]
    assert [entry["logprob"] for entry in content] == pytest.approx(expected[: len(content)], abs=1e-4)
    # the completions layout: tokens, their log-probs and offsets into the text, for the same prompt
    status, text = post(
        service.address, "/v1/completions", {"prompt": ids, "temperature": 0, "max_tokens": 8, "logprobs": 0}
    )
    logprobs = text["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [entry["token"] for entry in content]
    assert logprobs["token_logprobs"] == pytest.approx([entry["logprob"] for entry in content], abs=1e-5)
    assert logprobs["text_offset"][0] == 0 and logprobs["top_logprobs"] is None


def test_a_stop_string_cuts_the_logprobs_with_the_text(service) -> None:  # noqa: F811
    full = post(
        service.address,
        "/v1/chat/completions",
        {"messages": MESSAGES, "temperature": 0, "max_tokens": 8, "logprobs": True},
    )[1]["choices"][0]
    tokens = [entry["token"] for entry in full["logprobs"]["content"]]
    if len(tokens) < 3 or not tokens[2].strip():
        pytest.skip("the tiny judge's reply has no third token to stop at")
    cut = post(
        service.address,
        "/v1/chat/completions",
        {"messages": MESSAGES, "temperature": 0, "max_tokens": 8, "logprobs": True, "stop": [tokens[2]]},
    )[1]["choices"][0]
    kept = [entry["token"] for entry in cut["logprobs"]["content"]]
    assert "".join(kept) == cut["message"]["content"] and len(kept) < len(tokens)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 3}, "top_logprobs=3 is not supported"),
        ({"messages": MESSAGES, "logprobs": 5}, "logprobs=5 is not supported"),
    ],
)
def test_top_alternatives_are_refused(service, body, message) -> None:  # noqa: F811
    status, reply = post(service.address, "/v1/chat/completions", body)
    assert status == 400 and message in reply["error"]["message"], reply
