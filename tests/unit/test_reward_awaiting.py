"""``async def`` reward functions: a batch's calls are awaited together (so a reward-model server sees them at
once), each under ``reward_model.timeout_s``, with the error policy of any other reward function; and the
keyword arguments of a generative reward model reach a function only when its signature takes them."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest

from verl.config.reward_fns import parse_reward_fns
from verl.workers.reward import awaiting
from verl.workers.reward.awaiting import await_all, coroutine_function, run_to_completion
from verl.workers.reward.combine import sample_scorer
from verl.workers.reward.loading import accepted_kwargs, load_custom_reward_function
from verl.workers.reward.manager import RewardFunctionError, RewardSample, score_samples
from verl.workers.reward.timeout import CallTimeout, TimeLimit

SAMPLES = [RewardSample(index=i, data_source="d", response_str=str(i), ground_truth="2") for i in range(6)]


class Overlap:
    """An async scorer that counts how many of its calls run at the same time."""

    def __init__(self, pause: float = 0.05) -> None:
        self.running = self.most = 0
        self.pause = pause

    async def __call__(self, data_source, solution_str, ground_truth, extra_info=None):
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(self.pause)
        self.running -= 1
        return float(solution_str == ground_truth)


def test_an_async_function_is_awaited_for_the_whole_batch_at_once() -> None:
    scorer = Overlap()
    fn = run_to_completion(scorer)
    assert coroutine_function(fn) is scorer
    results = score_samples(fn, SAMPLES, time_limit=TimeLimit(5.0))
    assert [r.score for r in results] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert scorer.most == len(SAMPLES)  # all in flight together, not one after another
    # a plain call still works (one sample, an event loop of its own)
    assert fn("d", "2", "2") == 1.0


def test_bound_arguments_survive_and_plain_functions_are_not_awaited() -> None:
    async def judge(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return bonus

    bound = partial(run_to_completion(judge), bonus=3.0)
    coroutine = coroutine_function(bound)
    assert coroutine is not None and asyncio.run(coroutine("d", "x", "y")) == 3.0
    assert [r.score for r in score_samples(bound, SAMPLES[:2])] == [3.0, 3.0]
    assert coroutine_function(lambda **kw: 0.0) is None


def test_a_slow_call_times_out_alone_and_the_policy_decides() -> None:
    async def slow_on_one(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(30 if solution_str == "3" else 0)
        return 1.0

    fn = run_to_completion(slow_on_one)
    start = time.perf_counter()
    results = score_samples(fn, SAMPLES, error_policy="zero", time_limit=TimeLimit(0.3))
    assert time.perf_counter() - start < 5  # cancelled at its deadline, the others not held up
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert "reward_model.timeout_s=0.3" in results[3].error and "sample 3" in results[3].error
    with pytest.raises(RewardFunctionError, match="sample 3.*timeout_s"):
        score_samples(fn, SAMPLES, error_policy="fail", time_limit=TimeLimit(0.3))


def test_exceptions_name_the_sample_and_a_timeout_error_of_its_own_is_not_the_deadline() -> None:
    async def fails(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "1":
            raise TimeoutError("the judge did not answer")  # the function's own, not reward_model.timeout_s
        if solution_str == "4":
            raise ValueError("unparsable reply")
        return 1.0

    results = score_samples(run_to_completion(fails), SAMPLES, error_policy="zero", time_limit=None)
    assert [r.score for r in results] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert "raised TimeoutError: the judge did not answer" in results[1].error
    assert "raised ValueError: unparsable reply" in results[4].error


def test_a_coroutine_that_blocks_the_loop_is_given_up_on(monkeypatch) -> None:
    monkeypatch.setattr(awaiting, "GRACE_S", 0.2)

    async def blocks(**kwargs):
        time.sleep(1.5)  # a synchronous call inside async def: no deadline on the loop can interrupt it
        return 1.0

    start = time.perf_counter()
    outcomes = await_all([blocks, blocks], timeout_s=0.1)
    assert time.perf_counter() - start < 1.4
    assert all(not ok and isinstance(value, CallTimeout) for ok, value in outcomes)


def test_weighted_terms_with_an_async_correctness_term_stay_async() -> None:
    scorer = Overlap(pause=0.02)
    fn = sample_scorer(
        parse_reward_fns(["correctness", {"name": "format", "weight": 0.5}]), run_to_completion(scorer)
    )
    assert coroutine_function(fn) is not None
    results = score_samples(
        fn, [RewardSample(i, "arithmetic", s, "12") for i, s in enumerate(["12", "x"] * 3)]
    )
    assert [r.score for r in results] == [1.5, 0.0] * 3
    assert scorer.most == 6


def test_client_arguments_go_only_where_the_signature_takes_them(tmp_path) -> None:
    offered = {"reward_router_address": "127.0.0.1:1", "reward_model_tokenizer": object()}

    def both(
        data_source, solution_str, ground_truth, extra_info, reward_router_address, reward_model_tokenizer
    ):
        return 0

    def address_only(data_source, solution_str, ground_truth, extra_info=None, *, reward_router_address=None):
        return 0

    def anything(data_source, solution_str, ground_truth, **kwargs):
        return 0

    def neither(data_source, solution_str, ground_truth, extra_info=None):
        return 0

    assert accepted_kwargs(both, offered) == offered
    assert accepted_kwargs(address_only, offered) == {"reward_router_address": "127.0.0.1:1"}
    assert accepted_kwargs(anything, offered) == offered
    assert accepted_kwargs(neither, offered) == {}
    # an async function loaded from a file: its own signature (through the plain-callable wrapper)
    path = tmp_path / "judge.py"
    path.write_text(
        "async def judge(data_source, solution_str, ground_truth, extra_info, reward_router_address):\n"
    )
    path.write_text(path.read_text() + "    return 1.0\n")
    fn = load_custom_reward_function(path, "judge")
    assert accepted_kwargs(fn, offered) == {"reward_router_address": "127.0.0.1:1"}


def test_at_most_max_in_flight_calls_wait_at_once(monkeypatch) -> None:
    monkeypatch.setattr(awaiting, "MAX_IN_FLIGHT", 2)
    scorer = Overlap(pause=0.02)
    results = score_samples(run_to_completion(scorer), SAMPLES, time_limit=TimeLimit(1.0))
    assert scorer.most == 2 and len(results) == len(SAMPLES)
