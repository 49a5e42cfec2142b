"""The SGLang engine against a stand-in with the documented shape of SGLang's offline Engine API (SGLang itself
needs a GPU): what it is started with, weights in buckets, versions, sampling settings, the batch layout."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from verl.config import load_config
from verl.config.errors import ConfigError
from verl.config.schema_workers import RolloutConfig
from verl.workers.rollout import sglang as sglang_engine
from verl.workers.rollout.base import SamplingParams, StaleWeightsError, TokenRequest, left_padded_batch
from verl.workers.rollout.weight_sync import SyncSettings

PAD, EOS = 0, 9


class FakeEngine:
    """Answers each prompt with ids (sum(prompt) + i) % 40 + 3 for i = 0, 1, ..., stopping after a stop id,
    log-prob -0.1 * (i + 1); remembers what it was given."""

    started: list[dict] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.weights: dict[str, torch.Tensor] = {}
        self.update_calls = 0
        self.sampling: list[dict] = []
        self.released = self.resumed = 0
        FakeEngine.started.append(kwargs)

    def update_weights_from_tensor(self, named_tensors, flush_cache=True) -> None:
        self.update_calls += 1
        self.weights.update(dict(named_tensors))

    def generate(self, input_ids, sampling_params, return_logprob=False):
        assert return_logprob
        outputs = []
        for prompt, params in zip(input_ids, sampling_params, strict=True):
            self.sampling.append(params)
            ids, reason = [], "length"
            for i in range(params["max_new_tokens"]):
                ids.append((sum(prompt) + i) % 40 + 3)
                if ids[-1] in params["stop_token_ids"]:
                    reason = "stop"
                    break
            logprobs = [(-0.1 * (i + 1), token, None) for i, token in enumerate(ids)]
            outputs.append(
                {
                    "output_ids": ids,
                    "meta_info": {"output_token_logprobs": logprobs, "finish_reason": {"type": reason}},
                }
            )
        return outputs

    def release_memory_occupation(self) -> None:
        self.released += 1

    def resume_memory_occupation(self) -> None:
        self.resumed += 1


@pytest.fixture
def fake_sglang(monkeypatch):
    module = types.ModuleType("sglang")
    module.Engine = FakeEngine
    monkeypatch.setitem(sys.modules, "sglang", module)
    return module


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def build(model, **overrides):
    config = OmegaConf.merge(OmegaConf.structured(RolloutConfig), overrides)
    return sglang_engine.SGLangRollout(model, [EOS], PAD, config=config, max_model_len=48, seed=3)


def test_started_from_the_actors_config_with_dummy_weights(fake_sglang, model) -> None:
    engine = build(model, engine_kwargs={"sglang": {"chunked_prefill_size": 64}})
    kwargs = engine.engine.kwargs
    assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"] is True
    assert kwargs["context_length"] == 48 and kwargs["dtype"] == "float32" and kwargs["random_seed"] == 3
    assert kwargs["max_running_requests"] == 256 and kwargs["tp_size"] == 1
    assert kwargs["enable_memory_saver"] is False  # on a CPU there is nothing to sleep
    assert kwargs["chunked_prefill_size"] == 64  # engine_kwargs.sglang pass through
    assert (engine.dir / "config.json").is_file() and kwargs["model_path"] == str(engine.dir)


def test_weights_go_in_buckets_and_versions_are_checked(fake_sglang, model, monkeypatch) -> None:
    engine = build(model)
    engine.sync = SyncSettings(bucket_bytes=64 * 1024)  # (the config's least is 1 MiB)
    prompts = left_padded_batch([[5, 6], [7, 8, 9]], PAD)
    greedy = SamplingParams(do_sample=False, max_new_tokens=6)
    with pytest.raises(StaleWeightsError, match="version 0.*holds its random initial weights"):
        engine.generate_sequences(prompts, greedy, weights_version=0)
    engine.sync_weights(model, 0)
    state = model.state_dict()
    assert engine.engine.update_calls > 1 and set(engine.engine.weights) == set(state)
    assert all(torch.equal(engine.engine.weights[name], state[name]) for name in state)

    out = engine.generate_sequences(prompts, greedy, weights_version=0)
    # row 0: sum 11 -> ids 14, 15, ... (no stop); row 1: sum 24 -> 27, 28, ... (no stop)
    assert out.batch["responses"].tolist() == [list(range(14, 20)), list(range(27, 33))]
    assert out.batch["rollout_log_probs"][0].tolist() == pytest.approx([-0.1 * (i + 1) for i in range(6)])
    assert engine.engine.sampling[0] == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 6,
        "stop_token_ids": [EOS],
        "ignore_eos": False,
    }
    with pytest.raises(StaleWeightsError, match="version 1.*holds version 0"):
        engine.generate_tokens([TokenRequest("x", [5], greedy, weights_version=1)])


def test_stop_tokens_end_a_response_and_ignore_eos_keeps_going(fake_sglang, model) -> None:
    engine = build(model)
    engine.sync_weights(model, 0)
    # prompt sum 1: ids 4, 5, ..., 9 (the EOS) at i = 5
    sampling = SamplingParams(temperature=0.7, top_k=5, max_new_tokens=8)
    (stopped,) = engine.generate_tokens([TokenRequest("a", [1], sampling, 0)])
    assert stopped.response_ids == [4, 5, 6, 7, 8, 9] and stopped.finish_reason == "stop"
    assert engine.engine.sampling[-1]["temperature"] == 0.7 and engine.engine.sampling[-1]["top_k"] == 5
    full = SamplingParams(temperature=0.7, max_new_tokens=8, ignore_eos=True)
    (kept,) = engine.generate_tokens([TokenRequest("b", [1], full, 0)])
    assert len(kept.response_ids) == 8 and kept.finish_reason == "length"
    assert engine.engine.sampling[-1]["stop_token_ids"] == [] and engine.engine.sampling[-1]["ignore_eos"]


def test_lora_is_refused_for_sglang(monkeypatch) -> None:
    from verl.config import verl_compat

    monkeypatch.setattr(verl_compat, "engine_installed", lambda engine: True)
    with pytest.raises(ConfigError, match="LoRA is not built for the SGLang engine"):
        load_config(
            overrides=["actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.model.lora_rank=8"]
        )


def test_buckets_hold_at_most_the_limit() -> None:
    tensors = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 5])]
    groups = [[name for name, _ in bucket] for bucket in sglang_engine.buckets(tensors, limit=80)]
    assert groups == [["w0", "w1"], ["w2"], ["w3", "w4"]]  # 40+40; 120 alone; 20+20


def test_a_missing_sglang_says_how_to_install_it(monkeypatch, model) -> None:
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(ImportError, match=r"rollout.name=sglang needs SGLang"):
        build(model)
