"""Agent loops inside real RL steps on the tiny model: trajectories with inserted turns train with the step
unchanged, for a group estimator and for GAE with a critic; the single-turn loop reproduces the batch path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _small_run import two_turns_overrides
from test_rl_steps import actor_module, parity_reward, small_config

from verl.protocol import DataProto
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow


@pytest.fixture
def two_turns(tmp_path):
    return two_turns_overrides(tmp_path)


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_inserted_turns_train_with_the_step_unchanged(
    recipe, tiny_model_dir, arithmetic_files, tmp_path, two_turns, one_torch_thread
):
    out = tmp_path / "run"
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        out,
        *two_turns,
        "trainer.total_training_steps=1",
        "trainer.critic_warmup=0",
        recipe=recipe,
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)
    before = {k: v.clone() for k, v in actor_module(trainer).state_dict().items()}
    trainer.fit()
    after = actor_module(trainer).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    record = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["num_turns/min"] == record["num_turns/max"] == 4
    assert 0 < record["agent/masked_token_ratio"] < 1
    assert record["tool_call_counts/max"] == 0
    assert record["actor/grad_norm"] > 0


def test_single_turn_loop_is_the_batch_path(tiny_model_dir, arithmetic_files, tmp_path, one_torch_thread):
    """Greedy decoding through the single-turn agent loop (the server, one request per row) gives the batch
    call's responses, masks and log-probs."""
    from verl.workers.roles import ActorRolloutRefWorker
    from verl.workers.rollout.base import left_padded_batch

    config = small_config(tiny_model_dir, arithmetic_files, tmp_path)
    worker = ActorRolloutRefWorker(config, need_ref=False)
    tok = worker.tokenizer
    texts = [f"{a}+{b}=" for a, b in ((1, 2), (3, 4), (12, 7), (5, 5), (0, 9), (8, 1))]
    prompt_ids = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for t in texts
    ]
    prompts = left_padded_batch(prompt_ids, tok.pad_token_id)
    direct = worker.generate_sequences(prompts, validate=True)
    named = prompts.select()
    named.non_tensor_batch["agent_name"] = np.array(["single_turn_agent"] * len(named), dtype=object)
    looped = worker.generate_sequences(named, validate=True)
    assert worker.host.agent is not None
    for key in ("responses", "response_mask", "attention_mask", "position_ids", "input_ids"):
        assert torch.equal(direct.batch[key], looped.batch[key]), key
    torch.testing.assert_close(
        direct.batch["rollout_log_probs"], looped.batch["rollout_log_probs"], atol=1e-5, rtol=0
    )
    assert set(looped.non_tensor_batch["__num_turns__"]) == {2}
    assert isinstance(looped, DataProto)


def test_prompts_show_the_model_its_tools(tiny_model_dir, arithmetic_files, tmp_path):
    """With a tool config, the dataset renders prompts with the tools' schemas (``tools=``), as the chat template
    lays them out."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    template = (
        "{% if tools %}{{ '<|im_start|>system\\nTools: ' }}{% for t in tools %}{{ t['function']['name'] + ' ' }}"
        "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% for m in messages %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    (model / "chat_template.jinja").write_text(template)
    tools = [
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
    ]
    trainer = RLTrainer(
        small_config(model, arithmetic_files, tmp_path / "run", *tools), reward_fn=parity_reward
    )
    prompt = trainer.tokenizer.decode(trainer.train_dataset.prompt_ids[0])
    assert prompt.startswith("<|im_start|>system\nTools: calculator <|im_end|>\n<|im_start|>user\n")
