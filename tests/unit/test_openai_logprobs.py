"""``logprobs`` on the OpenAI-compatible server (the generative reward model's, over the fast engine): each
returned token with the log-prob the engine sampled it with, in OpenAI's chat and completion layouts."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests._genrm import chat_ids, post
from tests.unit.test_genrm_server import judge_dir, service  # noqa: F401  (the module's fixtures)
from verl.workers.rollout.token_text import token_pieces

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MESSAGES = [{"role": "user", "content": "What is 1+2?"}]


def joined(entries: list[dict]) -> str:
    """The text the entries' bytes make (a random judge emits bytes that are no UTF-8: they decode as U+FFFD)."""
    return b"".join(bytes(entry["bytes"]) for entry in entries).decode("utf-8", errors="replace")


def test_chat_logprobs_are_the_replys_tokens(service, judge_dir) -> None:  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(judge_dir)
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 8, "logprobs": True}
    status, reply = post(service.address, "/v1/chat/completions", body)
    assert status == 200, reply
    choice = reply["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) >= 1 and all(
        entry["bytes"] is not None and entry["top_logprobs"] == [] for entry in content
    )
    assert joined(content) == choice["message"]["content"]
    texts = [entry for entry in content if not entry["token"].startswith("bytes:")]
    assert all(bytes(entry["bytes"]).decode() == entry["token"] for entry in texts)
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
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(offsets) == len(content)
    assert logprobs["top_logprobs"] is None


def test_a_stop_string_cuts_the_logprobs_with_the_text(service) -> None:  # noqa: F811
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 8, "logprobs": True}
    full = post(service.address, "/v1/chat/completions", body)[1]["choices"][0]
    texts = [entry["token"] for entry in full["logprobs"]["content"]]
    stop = next((t for t in texts[2:] if t.strip() and not t.startswith("bytes:")), None)
    if stop is None:
        pytest.skip("the tiny judge's reply has no later text token to stop at")
    cut = post(service.address, "/v1/chat/completions", {**body, "stop": [stop]})[1]["choices"][0]
    assert joined(cut["logprobs"]["content"]) == cut["message"]["content"]
    assert len(cut["logprobs"]["content"]) < len(texts)


def test_a_character_split_over_tokens_shows_each_tokens_own_bytes(judge_dir) -> None:  # noqa: F811
    tokenizer = AutoTokenizer.from_pretrained(judge_dir)
    text = "a 日本 b"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = token_pieces(tokenizer, ids, skip_special=True)
    assert b"".join(bytes(raw) for _, raw in pieces).decode() == text
    assert any(
        piece.startswith("bytes:") for piece, _ in pieces
    )  # this tiny vocabulary splits both characters
    for piece, raw in pieces:
        if piece.startswith(
            "bytes:"
        ):  # a token holding part of a character: its own bytes, shown as vLLM does
            assert piece == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


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
