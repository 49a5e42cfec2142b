"""The overrides every small integration run starts from: the tiny model, the arithmetic files, 4 prompts a
step, 8 validation prompts and 6-token responses; a user agent loop of two turns for runs with inserted turns."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def small_run(model_dir: Any, files: tuple[Any, Any]) -> list[str]:
    train, test = files
    return [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=4",
        "data.val_max_samples=8",
        "data.max_response_length=6",
        f"actor_rollout_ref.model.path={model_dir}",
    ]


TWO_TURNS = '''
from verl.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.agent_loop.chat import ChatRenderer


class TwoTurns(AgentLoopBase):
    """Reply, then a user turn saying "again", then a second reply (a stand-in for a simulated user)."""

    async def run(self, sampling, prompt_ids, **row):
        renderer = ChatRenderer(self.tokenizer, self.context.stop_token_ids)
        out = AgentLoopOutput(prompt_ids=list(prompt_ids), num_turns=1)
        budget = self.context.max_response_length
        # a first turn of 2 to 4 tokens, by the prompt: groups end their turns at different times, so a
        # streaming pool hands some over while others are part-way through their trajectories
        out.append_sampled(await self.generate(prompt_ids, sampling, 2 + sum(prompt_ids) % 3))
        out.num_turns += 1
        inserted = renderer.insertion_ids([{"role": "user", "content": "again"}])
        if len(out.response_ids) + len(inserted) < budget:  # (after a stopped turn or not: a test stand-in)
            out.append_inserted(inserted)
            out.num_turns += 1
            left = budget - len(out.response_ids)
            out.append_sampled(await self.generate(list(prompt_ids) + out.response_ids, sampling, left))
            out.num_turns += 1
        return out
'''


def two_turns_overrides(directory: Path) -> list[str]:
    """The overrides that make every sample a :data:`TWO_TURNS` trajectory (the loop's file in ``directory``)."""
    (directory / "two_turns.py").write_text(TWO_TURNS)
    config = directory / "loops.yaml"
    config.write_text(f"- name: two_turns\n  _target_: {directory / 'two_turns.py'}:TwoTurns\n")
    return [
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=two_turns",
        "data.max_response_length=24",
    ]
