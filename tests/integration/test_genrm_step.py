"""GRPO steps through the real trainer with a generative reward model (verl's GenRM): reward_model.enable with a
causal LM, and an ``async def`` custom reward function that posts each sample to the served model and scores by
parsing its reply. The function records what it got; the step's scores are those, the server's metrics count
the function's requests, and they were batched. In-process, then on Ray with two reward worker processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_rl_steps import small_config
from tests.unit.test_genrm_server import make_judge
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

JUDGE = """
import json

import aiohttp


async def judge(data_source, solution_str, ground_truth, extra_info=None, *, reward_router_address,
                reward_model_tokenizer, record):
    body = {
        "messages": [{"role": "user", "content": f"Is {solution_str!r} the answer {ground_truth}? Say so."}],
        "temperature": 0,
        "max_tokens": 6,
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{reward_router_address}/v1/chat/completions", json=body) as reply:
            reply.raise_for_status()
            answer = (await reply.json())["choices"][0]["message"]["content"]
    score = sum(ch.isalnum() for ch in answer) / max(1, len(answer))  # the judgement, parsed
    tokens = len(reward_model_tokenizer(answer, add_special_tokens=False)["input_ids"])
    with open(record, "a") as out:
        out.write(json.dumps({"answer": answer, "score": score}) + "\\n")
    return {"score": score, "judge_tokens": tokens}
"""

SAMPLES = 16  # data.train_batch_size 4 x rollout.n 4


def run(
    tiny_model_dir, arithmetic_files, tmp_path: Path, *extra: str
) -> tuple[list[dict], list[dict], RLTrainer]:
    judge = make_judge(tmp_path / "judge")
    client, record = tmp_path / "judge_fn.py", tmp_path / "replies.jsonl"
    client.write_text(JUDGE)
    config = small_config(
        tiny_model_dir, arithmetic_files, tmp_path / "run",
        "reward_model.enable=true", f"reward_model.model.path={judge}",
        f"custom_reward_function.path={client}", "custom_reward_function.name=judge",
        f"+custom_reward_function.reward_kwargs.record={record}",
        "data.val_files=null", "trainer.val_before_train=false", *extra,
    )  # fmt: skip
    trainer = RLTrainer(config)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    replies = [json.loads(line) for line in record.read_text().splitlines()]
    return metrics, replies, trainer


def check(metrics: list[dict], replies: list[dict], steps: int) -> None:
    assert len(metrics) == steps and len(replies) == SAMPLES * steps
    for step, record in enumerate(metrics):
        scored = replies[step * SAMPLES : (step + 1) * SAMPLES]
        # every sample's score is the function's parse of the server's reply (GRPO: no KL in the reward)
        assert record["critic/score/mean"] == pytest.approx(
            sum(r["score"] for r in scored) / SAMPLES, abs=1e-6
        )
        assert record["reward/genrm_requests"] == SAMPLES
        assert 1 <= record["reward/genrm_engine_calls"] < SAMPLES  # awaited together: batched
        assert record["reward/genrm_generated_tokens"] > 0 and record["timing_s/genrm"] > 0
        assert record["reward_extra/judge_tokens/mean"] > 0
    assert len({r["answer"] for r in replies}) > 1  # the judge's replies depend on what it judged


def test_grpo_steps_scored_by_a_served_generative_reward_model(
    tiny_model_dir, arithmetic_files, tmp_path, one_torch_thread
):
    metrics, replies, trainer = run(tiny_model_dir, arithmetic_files, tmp_path)
    check(metrics, replies, steps=2)
    assert trainer.genrm is not None and trainer.genrm.closed  # shut down with the run


def test_genrm_steps_on_ray(tiny_model_dir, arithmetic_files, tmp_path):
    ray = pytest.importorskip("ray")
    from verl.single_controller.ray import ensure_ray

    ensure_ray()
    try:
        metrics, replies, _ = run(
            tiny_model_dir, arithmetic_files, tmp_path, "trainer.backend=ray", "reward_model.num_workers=2",
            "trainer.torch_threads=1", "trainer.total_training_steps=1",
        )  # fmt: skip
        check(metrics, replies, steps=1)
    finally:
        ray.shutdown()
