"""The generative reward model served by each engine kind (reward_model.rollout.name): hf (transformers'
generate over the module) and vllm (its own copy of the weights) answer a greedy chat over HTTP with what
transformers' greedy decoding of the same chat gives; the fast engine's case is tests/unit/test_genrm_server.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests._genrm import chat_ids, genrm_config, make_judge, post
from verl.workers.reward.genrm import GenRMService

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

QUESTIONS = ["What is 1+2?", "Score this: 42", "hello"]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    # 32-wide attention heads: vLLM's CPU attention needs head_dim >= 32
    return make_judge(tmp_path_factory.mktemp("judge"), num_attention_heads=2, num_key_value_heads=1)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_each_engine_serves_the_greedy_reply_transformers_gives(engine, judge_dir, tmp_path) -> None:
    if engine == "vllm":
        from tests.integration.test_vllm_rollout import _skip_or_fail
        from verl.workers.rollout.vllm import import_vllm

        try:
            import_vllm()
        except ImportError as error:
            _skip_or_fail(str(error))  # skips (or, where vLLM must run, fails) as the vLLM tests do
    config = genrm_config(
        judge_dir,
        tmp_path,
        f"reward_model.rollout.name={engine}",
        "reward_model.rollout.dtype=float32",
        "reward_model.rollout.response_length=8",
    )
    tokenizer = AutoTokenizer.from_pretrained(judge_dir)
    reference = AutoModelForCausalLM.from_pretrained(judge_dir, dtype=torch.float32).eval()
    service = GenRMService.from_config(config)
    try:
        assert service.built.description.lower().startswith(engine), service.built.description
        replies = []
        for question in QUESTIONS:
            body = {"messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": 8}
            status, reply = post(service.address, "/v1/chat/completions", body)
            assert status == 200, reply
            ids = chat_ids(tokenizer, question)
            expected = reference.generate(
                torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=service.built.stop_ids
            )[0, len(ids) :].tolist()
            if expected[-1:] and expected[-1] in service.built.stop_ids:
                expected = expected[:-1]
            assert reply["choices"][0]["message"]["content"] == tokenizer.decode(
                expected, skip_special_tokens=True
            ), question
            replies.append(reply["choices"][0]["message"]["content"])
        assert len(set(replies)) == len(QUESTIONS)  # a constant reply would not pass
    finally:
        service.close()
