"""The streaming pool of agent-loop trajectories: turns decoded by the pool's calls, tool results inserted
between them, a turn interrupted by a weight update continued with each token's version, a checkpoint resumed
by replaying the loops, stale groups restarted with their tools released.

The decoder is scripted: a row's turn is TOKEN repeated as many times as its prompt's length marker says
(10 + length), then STOP. The loop is scripted too: turn 1, a "tool" result (two INSERT tokens) when the turn
stopped, turn 2 with the rest of the budget.
"""

from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from tests.unit.test_streaming_pool import groups  # one group per inner list: prompt [1, 10 + length]
from verl.agent_loop.base import AgentLoopBase, AgentLoopOutput
from verl.agent_loop.runner import AgentLoopRunner
from verl.protocol import DataProto
from verl.workers.rollout.agent_pool import AgentPool
from verl.workers.rollout.base import ROW_BUDGET_KEY, SamplingParams

STOP, PAD, TOKEN, INSERT = 2, 0, 7, 5
WIDTH = 16


def scripted_decode(calls: list[int]):
    """Each row of a call emits TOKEN until its turn (the tokens after the length marker or the last INSERT)
    holds (marker - 10) of them, then STOP. Log-probs are -(decode step + 1). ``calls`` gets each call's rows."""

    def decode(batch: DataProto, enough, generator):
        ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
        budgets = batch.batch[ROW_BUDGET_KEY]
        rows = len(ids)
        calls.append(rows)
        prefixes = [ids[r][mask[r]].tolist() for r in range(rows)]
        marker = [next(t for t in p if t >= 10) for p in prefixes]
        starts = [
            max(i for i, t in enumerate(p) if t == m or t == INSERT)
            for p, m in zip(prefixes, marker, strict=True)
        ]
        have = [len(p) - s - 1 for p, s in zip(prefixes, starts, strict=True)]
        width = int(budgets.max())
        responses, log_probs = torch.full((rows, width), PAD), torch.zeros(rows, width)
        done = torch.zeros(rows, dtype=torch.bool)
        for t in range(width):
            for r in range(rows):
                if done[r]:
                    continue
                responses[r, t] = STOP if have[r] + t + 1 > marker[r] - 10 else TOKEN
                log_probs[r, t] = -(t + 1)
                done[r] = bool(responses[r, t] == STOP) or t + 1 >= budgets[r]
            if bool(done.all()) or enough(done):
                return responses, log_probs, t + 1
        return responses, log_probs, width

    return decode


class ToolTurns(AgentLoopBase):
    """Turn 1; if it stopped, the tool's result (two INSERT tokens, counted in ``tool_runs``) and turn 2."""

    tool_runs = 0
    released = 0

    async def run(self, sampling, prompt_ids, **row):
        out = AgentLoopOutput(prompt_ids=list(prompt_ids), num_turns=1)
        try:
            first = await self.generate(prompt_ids, sampling, 6)
            out.append_sampled(first)
            out.num_turns += 1
            if first.finish_reason == "stop":
                ToolTurns.tool_runs += 1
                out.append_inserted([INSERT, INSERT])
                left = WIDTH - len(out.response_ids)
                out.append_sampled(await self.generate(list(prompt_ids) + out.response_ids, sampling, left))
                out.num_turns += 2
        finally:
            ToolTurns.released += 1
        return out


def runner_factory(loop_class: type = ToolTurns):
    config = OmegaConf.create(
        {
            "data": {"max_response_length": WIDTH},
            "actor_rollout_ref": {
                "rollout": {
                    "agent": {"default_agent_loop": "single_turn_agent", "agent_loop_config_path": None},
                    "multi_turn": {"enable": False, "tool_config_path": None},
                }
            },
        }
    )

    def make(submit):
        runner = AgentLoopRunner(config, None, submit, [STOP], PAD)
        runner.loop_classes["scripted"] = loop_class
        runner.default_loop = "scripted"
        return runner

    return make


def agent_pool(loop_class: type = ToolTurns) -> AgentPool:
    ToolTurns.tool_runs = ToolTurns.released = 0
    return AgentPool(runner_factory(loop_class), SamplingParams(max_new_tokens=WIDTH), [STOP], PAD, seed=1)


def response(batch: DataProto, row: int) -> list[int]:
    return batch.batch["responses"][row][batch.batch["attention_mask"][row, -WIDTH:].bool()].tolist()


def test_a_trajectory_is_its_turns_with_the_tool_result_inserted_and_masked():
    p, calls = agent_pool(), []
    p.submit(groups([[2, 1]]))
    batch = p.collect(1, scripted_decode(calls), version=3)
    # turn 1: 2 TOKENs + STOP; the tool's 2 INSERTs; turn 2: 2 TOKENs + STOP (the marker's length again)
    assert response(batch, 0) == [TOKEN, TOKEN, STOP, INSERT, INSERT, TOKEN, TOKEN, STOP]
    assert response(batch, 1) == [TOKEN, STOP, INSERT, INSERT, TOKEN, STOP]
    assert batch.batch["response_mask"][0, :8].tolist() == [1, 1, 1, 0, 0, 1, 1, 1]
    assert batch.batch["rollout_log_probs"][0, :8].tolist() == [-1, -2, -3, 0, 0, -1, -2, -3]
    assert batch.batch["token_versions"][0, :9].tolist() == [3, 3, 3, -1, -1, 3, 3, 3, -1]
    assert list(batch.non_tensor_batch["__num_turns__"]) == [4, 4]
    assert calls == [2, 2]  # one decode call per turn, both rows together
    assert ToolTurns.tool_runs == 2 and ToolTurns.released == 2 and len(p) == 0


def test_a_turn_cut_by_a_collect_continues_under_the_new_weights_with_each_tokens_version():
    p, calls = agent_pool(), []
    p.submit(groups([[1], [5]]))  # g0's two turns end long before g1's first
    first = p.collect(1, scripted_decode(calls), version=0)
    assert list(first.non_tensor_batch["uid"]) == ["g0"]
    second = p.collect(1, scripted_decode(calls), version=1)
    assert response(second, 0) == [TOKEN] * 5 + [STOP, INSERT, INSERT] + [TOKEN] * 5 + [STOP]
    # two decode calls at version 0 (each until g0's turn ended) drew 4 of g1's first turn's tokens
    assert second.batch["token_versions"][0, :14].tolist() == [0] * 4 + [1] * 2 + [-1, -1] + [1] * 6
    assert list(second.non_tensor_batch["min_global_steps"]) == [0]
    assert list(second.non_tensor_batch["max_global_steps"]) == [1]


def test_a_checkpoint_resumes_by_replaying_the_loops_to_the_same_batch():
    uninterrupted = agent_pool()
    uninterrupted.submit(groups([[1, 2], [4, 4]]))
    uninterrupted.collect(1, scripted_decode([]), version=0)
    state = uninterrupted.state_dict()
    assert ToolTurns.tool_runs == 4  # g1's rows had finished their first turn and called the tool
    calls: list[int] = []
    expected = uninterrupted.collect(1, scripted_decode(calls), version=1)

    resumed = agent_pool()
    resumed.load_state_dict(state)
    resumed_calls: list[int] = []
    got = resumed.collect(1, scripted_decode(resumed_calls), version=1)
    for key in ("responses", "response_mask", "rollout_log_probs", "token_versions", "attention_mask"):
        assert torch.equal(got.batch[key], expected.batch[key]), key
    assert ToolTurns.tool_runs == 2  # the replay ran g1's tool calls again...
    assert resumed_calls == calls  # ...and answered their first turns from the record, not by decoding


def test_a_replayed_request_that_differs_from_the_checkpoint_is_generated_again(caplog):
    uninterrupted = agent_pool()
    uninterrupted.submit(groups([[1], [2]]))
    uninterrupted.collect(1, scripted_decode([]), version=0)
    state = uninterrupted.state_dict()
    uninterrupted.collect(1, scripted_decode([]), version=1)

    class OtherTool(ToolTurns):  # the tool's result changed after the resume: INSERT once, not twice
        async def run(self, sampling, prompt_ids, **row):
            out = AgentLoopOutput(prompt_ids=list(prompt_ids))
            first = await self.generate(prompt_ids, sampling, 6)
            out.append_sampled(first)
            out.append_inserted([INSERT])
            out.append_sampled(await self.generate(list(prompt_ids) + out.response_ids, sampling, 8))
            return out

    resumed = agent_pool(OtherTool)
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING):
        batch = resumed.collect(1, scripted_decode([]), version=1)
    assert "differs from the checkpoint's" in caplog.text
    assert response(batch, 0) == [TOKEN, TOKEN, STOP, INSERT, TOKEN, TOKEN, STOP]


def test_restart_stale_cancels_the_loops_and_releases_their_tools():
    p = agent_pool()
    p.submit(groups([[1], [6, 6]]))
    p.collect(1, scripted_decode([]), version=0)  # g1's turns are cut part-way, drawn at version 0
    assert ToolTurns.released == 1
    assert p.restart_stale(oldest_allowed=1) == 1
    assert ToolTurns.released == 3  # g1's two loops ended (their finally ran)
    batch = p.collect(1, scripted_decode([]), version=2)
    assert set(batch.batch["token_versions"][0].tolist()) == {
        2,
        -1,
    }  # everything drawn again, under version 2


def test_restart_stale_evicts_a_finished_group_past_the_bound():
    p = agent_pool()
    p.submit(groups([[1], [1], [6]]))
    p.collect(1, scripted_decode([]), version=0)  # g0 handed over; g1 finished in the same call; g2 cut
    p.finish_started(scripted_decode([]), version=0)  # g2 finished too
    assert p.stale(1, finished=True) == ["g1", "g2"] and p.stale(1) == []
    assert p.restart_stale(oldest_allowed=1) == 2  # their loops have returned: nothing to cancel
    assert p.complete() == [] and not p.rows["g1"][0].started and not p.rows["g2"][0].started


def test_finish_started_completes_every_started_trajectory_and_leaves_the_unstarted():
    p = agent_pool()
    p.submit(groups([[1], [6]]))
    p.collect(1, scripted_decode([]), version=0)
    p.submit(groups([[3]], first_uid=2))
    p.finish_started(scripted_decode([]), version=0)
    assert p.complete() == ["g1"]
    assert not p.rows["g2"][0].started  # submitted after the collect: its first turn not decoded


def test_a_loop_that_samples_otherwise_or_raises_is_named():
    class Hotter(ToolTurns):
        async def run(self, sampling, prompt_ids, **row):
            import dataclasses

            await self.generate(prompt_ids, dataclasses.replace(sampling, temperature=2.0), 4)

    p = agent_pool(Hotter)
    p.submit(groups([[1]]))
    with pytest.raises(
        RuntimeError, match="group 'g0' row 0 raised ValueError.*only max_new_tokens may be lower"
    ):
        p.collect(1, scripted_decode([]), version=0)
