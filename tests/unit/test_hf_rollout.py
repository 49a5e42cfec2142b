"""The hf rollout engine (transformers' ``generate``) with ``calculate_log_probs`` and ``ignore_eos``."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.unit.test_fast_rollout import PAD, make_prompts
from verl.workers.actor import response_logprobs
from verl.workers.rollout import SamplingParams
from verl.workers.rollout.hf import HFRollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_log_probs_are_the_actors_under_the_tempered_untruncated_distribution(model, temperature) -> None:
    prompts = make_prompts(model, [6, 3, 8, 8], seed=2)
    eos = [3, 4, 5]  # ids a random model emits now and then: some rows stop early
    engine = HFRollout(model, eos, PAD)
    engine.calculate_log_probs = True
    torch.manual_seed(1)
    out = engine.generate_sequences(
        prompts, SamplingParams(temperature=temperature, top_k=20, top_p=0.9, max_new_tokens=12)
    )
    mask = out.batch["response_mask"]
    assert out.batch["rollout_log_probs"].shape == (4, 12)
    assert (out.batch["rollout_log_probs"][mask == 0] == 0).all()
    model.eval()
    with torch.no_grad():
        actor, _ = response_logprobs(model, out, temperature, with_entropy=False)
    valid = mask.bool()
    torch.testing.assert_close(out.batch["rollout_log_probs"][valid], actor[valid], atol=1e-5, rtol=0)


def test_without_calculate_log_probs_there_are_none(model) -> None:
    out = HFRollout(model, [3], PAD).generate_sequences(
        make_prompts(model, [4, 2]), SamplingParams(max_new_tokens=4)
    )
    assert "rollout_log_probs" not in out.batch


def test_ignore_eos_generates_every_token(model) -> None:
    every = list(range(model.config.vocab_size))  # every token is an EOS: without ignore_eos, one token each
    engine = HFRollout(model, every, PAD)
    prompts = make_prompts(model, [4, 2])
    stopped = engine.generate_sequences(prompts, SamplingParams(max_new_tokens=5))
    assert stopped.batch["response_mask"].sum(dim=1).tolist() == [1, 1]
    full = engine.generate_sequences(prompts, SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert full.batch["response_mask"].sum(dim=1).tolist() == [5, 5]
