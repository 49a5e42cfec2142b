"""verl 0.9.1's ``max_off_policy_strategy=wait`` in the streaming pools (a stale unfinished generation is finished
with the weights held now, not started again) and its fractional ``num_warmup_batches`` for separate_async
(whole batches plus floor(fraction x train_batch_size) prompts), at the level of the pools, the config checks
and the batch source chosen. Tiny real runs: ``tests/integration/test_async_windows.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.unit.test_agent_pool import ToolTurns, agent_pool
from tests.unit.test_agent_pool import scripted_decode as agent_decode
from tests.unit.test_streaming_pool import groups, pool, scripted_decode
from verl.config import ConfigError, load_config
from verl.trainer.pool_source import PoolSource, source_for, warmup_window
from verl.trainer.sources import AheadSource

SEPARATE = ("trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=null")
BATCH_OF_4 = ("data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4")


def test_finish_stale_completes_the_stale_generation_under_the_current_weights():
    p, calls = pool(), []
    p.submit(groups([[6], [1], [1]]))
    p.collect(1, scripted_decode(calls), version=3)  # g1 handed over; g2 finished, g0 ran 2 tokens
    p.submit(groups([[2]], first_uid=3))  # not started: nothing of it is stale
    assert p.stale(oldest_allowed=4) == ["g0"]
    assert p.finish_stale(4, scripted_decode(calls), version=4) == 1
    assert calls[-1] == 1  # g0's row alone
    assert p.rows["g0"][0].done and p.rows["g0"][0].versions == [3, 3, 4, 4, 4, 4, 4]
    assert p.rows["g3"][0].tokens == [] and p.restarted == 0
    batch = p.collect(2, scripted_decode(calls), version=4)  # the oldest complete first: no decoding
    assert list(batch.non_tensor_batch["uid"]) == ["g0", "g2"] and len(calls) == 2
    assert batch.non_tensor_batch["min_global_steps"].tolist() == [3, 3]
    assert batch.non_tensor_batch["max_global_steps"].tolist() == [4, 3]


def test_finish_stale_leaves_generations_younger_than_the_bound_running():
    p, calls = pool(), []
    p.submit(groups([[6], [1]]))
    p.collect(1, scripted_decode(calls), version=3)
    assert p.finish_stale(3, scripted_decode(calls), version=4) == 0  # drawn by version 3: not older
    assert not p.rows["g0"][0].done and len(calls) == 1


def test_finish_stale_runs_an_agent_loop_to_its_end():
    p = agent_pool()
    p.submit(groups([[1], [6, 6]]))
    p.collect(1, agent_decode([]), version=0)  # g1's turns cut part-way, drawn at version 0
    assert p.finish_stale(1, agent_decode([]), version=2) == 1
    assert p.complete() == ["g1"] and ToolTurns.released == 3  # both of g1's loops returned
    batch = p.collect(1, agent_decode([]), version=2)
    versions = set(batch.batch["token_versions"][0].tolist())
    assert versions == {0, 2, -1}  # its first tokens kept, the rest drawn with the weights held now


@pytest.mark.parametrize(
    ("batches", "size", "window"), [(1.5, 4, (1, 2)), (1.1, 4, (1, 0)), (0.5, 64, (0, 32)), (2, 4, (2, 0))]
)
def test_the_window_is_floor_of_its_batches_in_prompts(batches, size, window):
    assert warmup_window(batches, size) == window


def test_separate_async_builds_a_fractional_window_and_the_pools_take_the_strategy():
    plan = SimpleNamespace(train_batch_size=4)
    ahead = source_for(
        load_config("ppo_trainer", [*SEPARATE, "trainer.v1.separate_async.num_warmup_batches=1.5"]), plan
    )
    assert type(ahead) is AheadSource and (ahead.ahead, ahead.extra) == (1, 2)
    wait = "trainer.v1.sampler.max_off_policy_strategy=wait"
    stream = source_for(
        load_config("ppo_trainer", [*SEPARATE, "trainer.v1.separate_async.num_warmup_batches=1.5",
                                    "async_training.staleness_threshold=0.5", wait]),
        plan,
    )  # fmt: skip
    # the fraction's prompts join the pool's surplus: 2 + ceil(0.5 x 4)
    assert isinstance(stream, PoolSource) and (stream.ahead, stream.extra, stream.strategy) == (1, 4, "wait")
    colocated = source_for(load_config("ppo_trainer", ["trainer.v1.trainer_mode=colocate_async", wait]), plan)
    assert colocated.colocated and colocated.strategy == "wait"


def test_a_fractional_window_is_checked_against_the_bound_by_its_oldest_samples():
    key = "trainer.v1.separate_async.num_warmup_batches"
    bound = "trainer.v1.sampler.max_off_policy_threshold"
    # 1.5 batches of 4: half of each batch is two versions old
    with pytest.raises(ConfigError, match=rf"{key}=1.5: samples would be 2 policy versions old"):
        load_config("ppo_trainer", [*SEPARATE, f"{key}=1.5", f"{bound}=2", *BATCH_OF_4])
    load_config("ppo_trainer", [*SEPARATE, f"{key}=1.5", f"{bound}=3", *BATCH_OF_4])
    # 1.1 x 4 prompts add none to the whole batch: one version old
    load_config("ppo_trainer", [*SEPARATE, f"{key}=1.1", f"{bound}=2", *BATCH_OF_4])
    # streaming: the fraction's prompts join the pool, whose bound holds as it runs
    stream = "async_training.staleness_threshold=0.5"
    load_config("ppo_trainer", [*SEPARATE, stream, f"{key}=1.5", f"{bound}=2", *BATCH_OF_4])


def _prompts(rows: list[list[int]], pad: int = 0):
    """A left-padded prompt batch of these token rows (the collate's shape)."""
    from verl.workers.rollout.base import left_padded_batch

    return left_padded_batch(rows, pad)


def test_prompt_batches_of_different_widths_are_stacked_left_padded_to_the_widest():
    import torch

    from verl.workers.rollout.base import concat_prompts

    narrow, wide = _prompts([[5, 6], [7]], pad=2), _prompts([[1, 2, 3, 4]], pad=2)
    both = concat_prompts([narrow, wide])
    assert both.batch["input_ids"].tolist() == [[2, 2, 5, 6], [2, 2, 2, 7], [1, 2, 3, 4]]
    assert both.batch["attention_mask"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]]
    assert both.batch["position_ids"].tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 2, 3]]
    same = concat_prompts([narrow, narrow])  # equal widths: plain concatenation
    assert torch.equal(same.batch["input_ids"], torch.cat([narrow.batch["input_ids"]] * 2))


def test_a_window_crossing_two_batches_of_different_widths_takes_its_prompts():
    from collections import deque

    from verl.trainer.sources import take_prompts

    queued = deque([_prompts([[5, 6], [7, 8]]), _prompts([[1, 2, 3], [4, 5, 6]])])
    taken = take_prompts(queued, 3)  # the first batch whole and one row of the next, 1 token wider
    assert taken.batch["input_ids"].tolist() == [[0, 5, 6], [0, 7, 8], [1, 2, 3]]
    assert len(queued) == 1 and queued[0].batch["input_ids"].tolist() == [[4, 5, 6]]


def test_wait_is_refused_below_the_span_a_carried_generation_trains_with():
    """A generation carried over a batch trains with a span (versions, inclusive) of at least the pool's lag + 2:
    colocated 2, streaming one batch ahead 3. wait cannot hold a smaller threshold; drop can. And a group that
    finishes ahead of its batch waits in the pool: W batches ahead, W versions old when trained."""
    bound, wait = (
        "trainer.v1.sampler.max_off_policy_threshold",
        "trainer.v1.sampler.max_off_policy_strategy=wait",
    )
    ahead = "trainer.v1.colocate_async.num_warmup_batches"
    colocate = ("trainer.v1.trainer_mode=colocate_async",)
    with pytest.raises(ConfigError, match="span of at least 2 versions"):
        load_config("ppo_trainer", [*colocate, f"{ahead}=0", wait, f"{bound}=1"])
    load_config("ppo_trainer", [*colocate, f"{ahead}=0", f"{bound}=1"])  # drop
    load_config("ppo_trainer", [*colocate, f"{ahead}=1", wait, f"{bound}=2"])
    with pytest.raises(
        ConfigError, match="groups finished ahead of their batch would be 2 policy versions old"
    ):
        load_config("ppo_trainer", [*colocate, f"{ahead}=2", f"{bound}=2"])
    load_config("ppo_trainer", [*colocate, f"{ahead}=2", f"{bound}=3"])
    stream = (
        *SEPARATE,
        "async_training.staleness_threshold=0.5",
        "trainer.v1.separate_async.num_warmup_batches=1",
    )
    with pytest.raises(ConfigError, match="span of at least 3 versions"):
        load_config("ppo_trainer", [*stream, wait, f"{bound}=2"])
    load_config("ppo_trainer", [*stream, wait, f"{bound}=3"])
    load_config("ppo_trainer", [*stream, f"{bound}=2"])  # drop
