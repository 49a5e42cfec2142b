"""verl 0.9.1's asynchronous-trainer settings in tiny real runs: a fractional
``trainer.v1.separate_async.num_warmup_batches`` (floor(W x train_batch_size) prompts in flight beyond the step's
own, each batch still a fixed set of prompts of the data order) and ``trainer.v1.sampler.max_off_policy_strategy
=wait`` (a generation that reached the staleness bound is finished and trained, never started again)."""

from __future__ import annotations

import json

import pytest
from test_rl_steps import parity_reward, small_config

from verl.trainer.metrics import WALL_CLOCK_PREFIXES
from verl.trainer.rl_trainer import RLTrainer
from verl.trainer.sources import AheadSource

pytestmark = pytest.mark.slow

OFF_POLICY = "training/off_policy"
SEPARATE = "trainer.v1.trainer_mode=separate_async"


def run(model_dir, files, out_dir, *extra, steps, dump=True):
    """A tiny run of ``steps`` steps, without validation; ``dump``: each step's samples to out_dir/rollouts."""
    dumps = [f"trainer.rollout_data_dir={out_dir / 'rollouts'}"] if dump else []
    config = small_config(
        model_dir, files, out_dir, f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
        "trainer.val_before_train=false", *dumps, *extra,
    )  # fmt: skip
    trainer = RLTrainer(config, reward_fn=parity_reward)
    trainer.fit()
    return trainer


def steps_logged(out_dir):
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 0]


def prompts_by_step(out_dir):
    """The prompts each step trained (one entry per response), sorted: from trainer.rollout_data_dir."""
    return {
        path.stem: sorted(json.loads(line)["input"] for line in path.read_text().splitlines())
        for path in (out_dir / "rollouts").glob("*.jsonl")
    }


def numbers(out_dir):
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_PREFIXES)} for r in
            steps_logged(out_dir)}  # fmt: skip


# ---------------------------------------------------------------------------------------------- fractional windows

WINDOW = (SEPARATE, "trainer.v1.separate_async.num_warmup_batches=1.5")


def test_a_fractional_window_keeps_its_prompts_in_flight_and_trains_the_data_order(
    tiny_model_dir, arithmetic_files, tmp_path, monkeypatch
):
    """1.5 batches of 4: the rollout holds floor(1.5 x 4) = 6 prompts beyond the step's own, so each step hands
    it the last 2 prompts of one batch and the first 2 of the next. Every batch is still the data order's (the
    synchronous run trains the same prompts at the same step); half of it is one version old, half two."""
    calls: list[tuple[int, int, int, int]] = []
    original = AheadSource._generate

    def record(self, flow, plan, step, batch_step, offset, prompts):
        calls.append((step, batch_step, offset, len(prompts)))
        original(self, flow, plan, step, batch_step, offset, prompts)

    monkeypatch.setattr(AheadSource, "_generate", record)
    run(tiny_model_dir, arithmetic_files, tmp_path / "sync", steps=4)
    trainer = run(tiny_model_dir, arithmetic_files, tmp_path / "window", *WINDOW, steps=4)
    source = trainer.plan.source
    assert (source.ahead, source.extra) == (1, 2)
    # (declared at step, for the batch of step, from its prompt, prompts): 4 + 6 at step 1, then 4 a step,
    # nothing past the 16 prompts of the 4 steps
    assert calls == [(1, 1, 0, 4), (1, 2, 0, 4), (1, 3, 0, 2), (2, 3, 2, 2), (2, 4, 0, 2), (3, 4, 2, 2)]
    assert prompts_by_step(tmp_path / "window") == prompts_by_step(tmp_path / "sync")
    rows = steps_logged(tmp_path / "window")
    staleness = f"{OFF_POLICY}/trajectory_staleness"
    # batches 1 and 2: the initial policy's; from batch 3 on its first 2 prompts two versions old, the rest one
    assert [r[f"{staleness}/max"] for r in rows] == [0.0, 1.0, 2.0, 2.0]
    assert [r[f"{staleness}/min"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r[f"{staleness}/mean"] for r in rows] == [0.0, 1.0, 1.5, 1.5]


def test_a_fractional_window_resumes_exactly(tiny_model_dir, arithmetic_files, tmp_path):
    """A checkpoint after step 2 holds the batch of step 3 as far as it is generated (its first 2 prompts) and
    the prompts received for later ones; the run resumed from it trains what the uninterrupted one did."""
    whole = tmp_path / "whole"
    run(tiny_model_dir, arithmetic_files, whole, *WINDOW, "trainer.save_freq=2", steps=4, dump=False)
    resumed = tmp_path / "resumed"
    run(
        tiny_model_dir, arithmetic_files, resumed, *WINDOW, f"trainer.resume_mode={whole / 'global_step_2'}",
        steps=4, dump=False,
    )  # fmt: skip
    expected = numbers(whole)
    assert numbers(resumed) == {step: expected[step] for step in (3, 4)}
    assert expected[3][f"{OFF_POLICY}/trajectory_staleness/max"] == 2.0  # the part generated before the save


# ---------------------------------------------------------------------------------------------- wait

# two responses per prompt from a model whose responses end at any step: generations run on across updates
RAGGED = ("data.max_response_length=16", "actor_rollout_ref.rollout.n=2")
WAIT = "trainer.v1.sampler.max_off_policy_strategy=wait"
POOLS = {
    # the actor's pool, one batch more in flight: a generation carried over one update reaches a span of 2
    "colocate": (
        ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1"),
        2,
        "actor_rollout",
    ),
    # the rollout role's streaming pool, one batch ahead: new generations start one version old
    "streaming": ((SEPARATE, "async_training.staleness_threshold=0.5"), 3, "rollout"),
}


@pytest.fixture(scope="module")
def ragged_model_dir(tiny_model_dir, tmp_path_factory):
    from tests._ragged import save_ragged_model

    return save_ragged_model(tiny_model_dir, tmp_path_factory.mktemp("ragged") / "model")


@pytest.fixture(scope="module")
def ragged_sync(ragged_model_dir, arithmetic_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("ragged_sync")
    run(ragged_model_dir, arithmetic_files, out, *RAGGED, steps=6)
    return prompts_by_step(out)


@pytest.mark.parametrize("pool", list(POOLS))
def test_wait_finishes_a_stale_generation_and_trains_it(
    ragged_model_dir, arithmetic_files, ragged_sync, tmp_path, pool
):
    """max_off_policy_strategy=wait: a generation whose span has reached the bound is finished (under the
    weights the rollout holds) before the batch is taken, and trained in it: drawn across two versions, its
    first token ``bound - 1`` versions old (verl counts a span inclusively). Nothing is started again, and every prompt is trained once."""
    mode, bound, role = POOLS[pool]
    out = tmp_path / "wait"
    trainer = run(
        ragged_model_dir, arithmetic_files, out, *RAGGED, *mode, WAIT,
        f"trainer.v1.sampler.max_off_policy_threshold={bound}", steps=6,
    )  # fmt: skip
    rows = steps_logged(out)
    waited = [r for r in rows if r["fully_async/count/waited_groups"] > 0]
    assert waited, [r["fully_async/count/waited_groups"] for r in rows]
    for r in waited:  # the finished generations are in that step's batch
        assert r[f"{OFF_POLICY}/trajectory_spans/max"] == 2.0
        assert r[f"{OFF_POLICY}/trajectory_staleness_worst/max"] >= bound - 1
    # and the bound holds: no first token more than bound - 1 versions older than the policy it trained
    worst = [r.get(f"{OFF_POLICY}/trajectory_staleness_worst/max", 0) for r in rows]
    assert max(worst) <= bound - 1, worst
    assert all(r["fully_async/count/restarted_groups"] == 0 for r in rows)
    assert trainer.controller.group(role).workers[0].host.pool.restarted == 0
    assert sorted(p for ps in prompts_by_step(out).values() for p in ps) == sorted(
        p for ps in ragged_sync.values() for p in ps
    )


def test_drop_evicts_a_finished_group_past_the_bound(ragged_model_dir, arithmetic_files, tmp_path, caplog):
    """max_off_policy_strategy=drop in the streaming pool: a group that finished ahead of its batch and waited
    in the pool past the bound is started again (verl evicts the whole group), not trained. With a threshold
    of 2 every generation carried over a batch of this pool (one version behind) would train with a span of
    3: each starts again, with a warning at start-up, and the bound holds on every step."""
    out = tmp_path / "drop"
    with caplog.at_level("WARNING", logger="verl.trainer.pool_source"):
        run(
            ragged_model_dir, arithmetic_files, out, *RAGGED, SEPARATE, "async_training.staleness_threshold=1.0",
            "trainer.v1.sampler.max_off_policy_threshold=2", steps=6,
        )  # fmt: skip
    assert "every generation the pool carries over a batch" in caplog.text
    rows = steps_logged(out)
    assert all(r.get(f"{OFF_POLICY}/trajectory_staleness_worst/max", 0) <= 1 for r in rows)
    assert sum(r["fully_async/count/restarted_groups"] for r in rows) > 0
    trained = [p for ps in prompts_by_step(out).values() for p in ps]
    assert len(trained) == len(set(trained)) * 2  # each prompt's two responses, once
