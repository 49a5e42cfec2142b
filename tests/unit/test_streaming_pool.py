"""The streaming rollout's pool (fully-async training): which groups a collect hands over, what is carried
into the next one, and the per-token versions of a generation interrupted by a weight update.

The decoder here is scripted: the last prompt token of a row says how many tokens its response has (then
the stop token), so every length is known by hand. `test_partial_rollout_log_probs` runs the real engine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests._ragged import ragged_model
from verl.protocol import DataProto
from verl.workers.rollout.base import ROW_BUDGET_KEY
from verl.workers.rollout.streaming import StreamingPool

STOP, PAD, TOKEN = 2, 0, 7


def scripted_decode(calls: list[int]):
    """A decoder whose row emits TOKEN until it has (last prompt token) tokens in all, then STOP. It
    records the rows of each call in ``calls``; log-probs are -(decode step + 1)."""

    def decode(batch: DataProto, enough, generator):
        ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
        budgets = batch.batch[ROW_BUDGET_KEY]
        rows = len(ids)
        calls.append(rows)
        # tokens already generated: everything after the prompt's length marker (the first TOKEN-free part)
        prefix = [ids[r][mask[r]].tolist() for r in range(rows)]
        marker = [next(t for t in p if t >= 10) for p in prefix]  # the length marker: 10 + length
        have = [len(p) - p.index(m) - 1 for p, m in zip(prefix, marker, strict=True)]
        width = int(budgets.max())
        responses = torch.full((rows, width), PAD)
        log_probs = torch.zeros(rows, width)
        done = torch.zeros(rows, dtype=torch.bool)
        for t in range(width):
            for r in range(rows):
                if done[r]:
                    continue
                total = marker[r] - 10
                responses[r, t] = STOP if have[r] + t + 1 > total else TOKEN
                log_probs[r, t] = -(t + 1)
                if responses[r, t] == STOP or t + 1 >= budgets[r]:
                    done[r] = True
            if bool(done.all()) or enough(done):
                return responses, log_probs, t + 1
        return responses, log_probs, width

    return decode


def groups(lengths: list[list[int]], first_uid: int = 0) -> DataProto:
    """One group per inner list, one row per length: prompt [1, 10 + length], left-padded."""
    ids, uids = [], []
    for g, group in enumerate(lengths):
        for length in group:
            ids.append([1, 10 + length])
            uids.append(f"g{first_uid + g}")
    input_ids = torch.tensor(ids)
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def pool(max_new: int = 8) -> StreamingPool:
    return StreamingPool(max_new, [STOP], PAD, seed=1)


def lengths_of(batch: DataProto) -> list[int]:
    return batch.batch["response_mask"].sum(-1).tolist()


def test_collect_hands_over_the_first_groups_to_finish_and_keeps_the_rest_running():
    p, calls = pool(), []
    p.submit(groups([[6, 1], [2, 2], [1, 3], [5, 5]]))  # complete after 7, 3, 4, 6 tokens (length + STOP)
    batch = p.collect(2, scripted_decode(calls), version=0)
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["g1", "g2"]
    assert lengths_of(batch) == [3, 3, 2, 4]  # each response ends with its stop token
    assert calls == [8]  # one decode call over all 8 rows, stopped once two groups were complete
    # g0 and g3 were interrupted after 4 tokens (g2's last row needed 4); their rows that finished stay finished
    assert [len(r.tokens) for r in p.rows["g0"]] == [4, 2]
    assert [r.done for r in p.rows["g0"]] == [False, True]
    assert [len(r.tokens) for r in p.rows["g3"]] == [4, 4]


def test_interrupted_generations_continue_under_the_new_version_with_each_tokens_version():
    p, calls = pool(), []
    p.submit(groups([[6, 1], [2, 2], [1, 3], [5, 5]]))
    p.collect(2, scripted_decode(calls), version=0)
    batch = p.collect(2, scripted_decode(calls), version=1)
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["g0", "g3"]
    assert calls == [8, 3]  # the second call decodes only the three unfinished rows
    versions, mask = batch.batch["token_versions"], batch.batch["response_mask"].bool()
    # g0's first row: 4 tokens of version 0, then 3 (two more and the stop token) of version 1
    assert versions[0][mask[0]].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert versions[1][mask[1]].tolist() == [0, 0]  # finished in the first call
    assert batch.non_tensor_batch["min_global_steps"].tolist() == [0, 0, 0, 0]
    assert batch.non_tensor_batch["max_global_steps"].tolist() == [1, 0, 1, 1]
    # each token keeps the log-prob its own call gave it (the scripted -(step + 1))
    assert batch.batch["rollout_log_probs"][0][mask[0]].tolist() == [-1, -2, -3, -4, -1, -2, -3]
    assert len(p) == 0


def test_the_oldest_complete_groups_go_first():
    p, calls = pool(), []
    p.submit(groups([[3], [1]]))
    p.submit(groups([[1], [1]], first_uid=2))
    first = p.collect(1, scripted_decode(calls), version=0)  # g1 finishes first (2 tokens)
    assert first.non_tensor_batch["uid"].tolist() == ["g1"]
    assert p.complete() == ["g2", "g3"]  # finished in the same call, while g0 runs on
    second = p.collect(2, scripted_decode(calls), version=1)  # enough are complete: no decoding
    assert second.non_tensor_batch["uid"].tolist() == ["g2", "g3"] and len(calls) == 1
    p.submit(groups([[1]], first_uid=4))
    third = p.collect(2, scripted_decode(calls), version=1)  # g0 and g4 finish; g0 is the older
    assert list(dict.fromkeys(third.non_tensor_batch["uid"])) == ["g0", "g4"]


def test_budget_ends_a_response_that_never_stops():
    p, calls = pool(max_new=5), []
    p.submit(groups([[9, 9]]))
    batch = p.collect(1, scripted_decode(calls), version=0)
    assert lengths_of(batch) == [5, 5]
    assert batch.batch["responses"][0].tolist() == [TOKEN] * 5


def test_finish_started_completes_started_generations_under_the_old_weights():
    p, calls = pool(), []
    p.submit(groups([[6], [1]]))
    p.collect(1, scripted_decode(calls), version=0)  # g0 interrupted after 2 tokens
    p.submit(groups([[2]], first_uid=2))  # not started yet
    p.finish_started(scripted_decode(calls), version=0)
    assert calls[-1] == 1  # only g0's row, not the new group
    assert p.rows["g0"][0].done and p.rows["g0"][0].versions == [0] * 7
    assert p.rows["g2"][0].tokens == []


def test_restart_stale_drops_what_an_old_policy_drew_finished_or_not():
    p, calls = pool(), []
    p.submit(groups([[6], [1], [1]]))
    p.collect(1, scripted_decode(calls), version=3)  # g1 handed over; g2 finished, g0 running
    assert p.stale(4) == ["g0"] and p.stale(4, finished=True) == ["g2"]
    assert p.restart_stale(oldest_allowed=3) == 0  # version 3 is allowed
    assert p.restart_stale(oldest_allowed=4) == 2  # verl's drop evicts the whole group, finished or not
    assert p.rows["g0"][0].tokens == [] and p.rows["g2"][0].tokens == [] and not p.rows["g2"][0].done
    assert p.restarted == 2


def test_a_finished_group_waiting_past_the_bound_is_evicted_and_the_rest_go_stalest_first():
    p, calls = pool(), []
    p.submit(groups([[1], [1], [1], [9]]))
    p.collect(1, scripted_decode(calls), version=0)  # g0 handed over; g1, g2 finished with it; g3 running
    p.submit(groups([[1]], first_uid=4))  # nothing drawn yet: never stale
    assert p.restart_stale(oldest_allowed=0) == 0  # version 0 is allowed
    batch = p.collect(1, scripted_decode(calls), version=1)  # g1, the stalest finished, goes first
    assert batch.non_tensor_batch["uid"].tolist() == ["g1"]
    assert p.restart_stale(oldest_allowed=1) == 2  # g2 waited past the bound, g3 is running from version 0
    assert p.complete() == [] and not p.rows["g2"][0].done


def test_the_stalest_finished_groups_go_first_whatever_their_submission_order():
    p, calls = pool(), []
    p.submit(groups([[1], [5]]))
    p.collect(1, scripted_decode(calls), version=0)  # g0 handed over; g1 drew 2 tokens under version 0
    p.restart_stale(oldest_allowed=1)  # g1 starts again: its first token will be version 2's
    p.submit(groups([[3]], first_uid=2))
    p.rows["g2"][0].versions = [1]  # as if g2 had drawn its first token under version 1
    p.rows["g2"][0].tokens, p.rows["g2"][0].done = [STOP], True
    p.rows["g1"][0].versions, p.rows["g1"][0].tokens, p.rows["g1"][0].done = [2], [STOP], True
    assert p.complete() == ["g2", "g1"]  # g2 drew with version 1, g1 with version 2


def test_state_round_trip_resumes_the_same_generations():
    calls: list[int] = []
    a = pool()
    a.submit(groups([[6, 1], [2, 2], [1, 3], [5, 5]]))
    a.collect(2, scripted_decode(calls), version=0)
    b = pool()
    b.load_state_dict(a.state_dict())
    one, two = a.collect(2, scripted_decode(calls), 1), b.collect(2, scripted_decode(calls), 1)
    for key in ("responses", "token_versions", "rollout_log_probs", "attention_mask"):
        assert torch.equal(one.batch[key], two.batch[key]), key
    assert b.decode_calls == a.decode_calls


def test_a_group_submitted_twice_is_refused():
    p = pool()
    p.submit(groups([[1]]))
    with pytest.raises(ValueError, match="already in the rollout's pool"):
        p.submit(groups([[1]]))


# ---------------------------------------------------------------------------------------------- the real engine


def real_decode(engine, max_new):
    from verl.workers.rollout import SamplingParams

    sampling = SamplingParams(max_new_tokens=max_new, temperature=1.0, do_sample=True)
    return lambda batch, enough, generator: engine.decode_until(batch, sampling, enough, generator)


def test_decode_until_never_stopped_is_the_engine_generation(tiny_model_dir):
    from verl.workers.rollout import SamplingParams
    from verl.workers.rollout.fast import FastRollout

    model = ragged_model(tiny_model_dir)
    engine = FastRollout(model, [model.config.eos_token_id], PAD)
    prompts = groups([[1, 1], [1, 1], [1, 1]])
    prompts.batch["input_ids"] = torch.randint(3, 300, prompts.batch["input_ids"].shape)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, do_sample=True)
    torch.manual_seed(5)
    whole = engine.generate_sequences(prompts, sampling)
    torch.manual_seed(5)
    responses, log_probs, steps = engine.decode_until(prompts, sampling, lambda done: False)
    mask = whole.batch["response_mask"].bool()
    assert torch.equal(responses[mask], whole.batch["responses"][mask])
    assert torch.equal(log_probs[mask], whole.batch["rollout_log_probs"][mask])
    assert steps == int(mask.sum(-1).max())
    torch.manual_seed(5)
    _, _, stopped = engine.decode_until(prompts, sampling, lambda done: True)
    assert stopped == 1


def test_partial_rollout_tokens_carry_the_log_probs_of_the_weights_that_drew_them(tiny_model_dir):
    """Interrupt generations, change the engine's weights, continue: every token's log-prob (and version) is
    that of the weights that drew it, as the actor's forward pass scores it."""
    from verl.workers.actor import response_logprobs
    from verl.workers.rollout.fast import FastRollout

    old = ragged_model(tiny_model_dir)
    new = ragged_model(tiny_model_dir)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    eos = [old.config.eos_token_id]
    engine = FastRollout(old, eos, PAD)
    pool = StreamingPool(12, eos, PAD, seed=3)
    prompts = groups([[1]] * 16)  # one response per prompt: the first to stop ends the first collect
    prompts.batch["input_ids"] = torch.randint(
        3, 300, prompts.batch["input_ids"].shape, generator=torch.Generator().manual_seed(1)
    )
    pool.submit(prompts)
    first = pool.collect(1, real_decode(engine, 12), version=0)
    assert len(pool.running()) > 8, "most generations are interrupted"
    engine.model = new  # the weight update
    rest = pool.collect(15, real_decode(engine, 12), version=1)
    spans = rest.non_tensor_batch["max_global_steps"] - rest.non_tensor_batch["min_global_steps"]
    assert spans.max() == 1, "some responses were drawn by both versions"
    for batch in (first, rest):
        mask = batch.batch["response_mask"].bool()
        versions = batch.batch["token_versions"]
        with torch.no_grad():
            by_old, _ = response_logprobs(old, batch, 1.0, with_entropy=False)
            by_new, _ = response_logprobs(new, batch, 1.0, with_entropy=False)
        expected = torch.where(versions == 0, by_old, by_new)
        got = batch.batch["rollout_log_probs"]
        torch.testing.assert_close(got[mask], expected[mask], atol=2e-4, rtol=0)
        assert bool(((versions >= 0) == mask).all())


class ScriptedServedEngine:
    """A stand-in for an engine that cannot stop a decode part-way (vLLM's token-in / token-out API): each
    request answers TOKEN until the row has (length marker) tokens, then STOP, at most max_new_tokens of them.
    It records each request's prompt length, seed and version."""

    eos_token_ids = [STOP]
    pad_token_id = PAD

    def __init__(self) -> None:
        self.requests: list[tuple[int, int | None, int | None]] = []

    def generate_tokens(self, requests):
        from verl.workers.rollout.base import TokenResponse

        answers = []
        for request in requests:
            prompt = request.prompt_ids
            self.requests.append((len(prompt), request.seed, request.weights_version))
            total, have = prompt[1] - 10, len(prompt) - 2
            ids = []
            for t in range(request.sampling.max_new_tokens):
                ids.append(STOP if have + t + 1 > total else TOKEN)
                if ids[-1] == STOP:
                    break
            reason = "stop" if ids[-1] == STOP else "length"
            answers.append(
                TokenResponse(request.request_id, ids, [-(t + 1.0) for t in range(len(ids))], reason)
            )
        return answers


def test_an_engine_that_cannot_stop_part_way_is_interrupted_and_resumed_chunk_by_chunk():
    """decode_in_chunks gives any engine the fast engine's decode_until: with chunks of 2 tokens (a quarter of
    8), the pool stops after the chunk that completes two groups, exactly where the fast engine stopped in
    test_collect_hands_over_..., and the interrupted rows continue later, each prefilled again with its prompt
    and its tokens so far, under the new version."""
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.chunked import decode_in_chunks

    engine, sampling = ScriptedServedEngine(), SamplingParams(max_new_tokens=8)
    versions = iter([0, 1])  # one decode call per collect

    def decode(batch, enough, generator):
        return decode_in_chunks(engine, batch, sampling, enough, generator, weights_version=next(versions))

    p = pool()
    p.submit(groups([[6, 1], [2, 2], [1, 3], [5, 5]]))
    batch = p.collect(2, decode, version=0)
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["g1", "g2"]
    assert lengths_of(batch) == [3, 3, 2, 4]
    assert [len(r.tokens) for r in p.rows["g0"]] == [4, 2] and [len(r.tokens) for r in p.rows["g3"]] == [4, 4]
    # two chunks: 8 rows from the bare prompts, then the 6 still running, prompt + their 2 tokens
    assert [n for n, _, _ in engine.requests] == [2] * 8 + [4] * 6
    engine.requests.clear()
    batch = p.collect(2, decode, version=1)
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == ["g0", "g3"]
    assert {n for n, _, _ in engine.requests} >= {6}  # resumed: the 3 interrupted rows, prompt + 4 tokens
    assert {v for _, _, v in engine.requests} == {1}
    mask = batch.batch["response_mask"].bool()
    assert batch.batch["token_versions"][0][mask[0]].tolist() == [0, 0, 0, 0, 1, 1, 1]
    # each request of a chunk has its own seed, drawn from the pool's seeded generator
    seeds = [s for _, s, _ in engine.requests]
    assert len(set(seeds)) == len(seeds) and None not in seeds
