"""trainer.v1.trainer_mode=separate_async: a rollout role of its own generates ahead of the trainer."""

from __future__ import annotations

import json

import pytest
import torch
from test_rl_steps import actor_module, parity_reward, small_config

from verl.trainer.metrics import WALL_CLOCK_PREFIXES
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

ASYNC = "trainer.v1.trainer_mode=separate_async"
STALENESS = "training/off_policy/trajectory_staleness"


def records(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def numbers(
    out_dir,
    drop=(*WALL_CLOCK_PREFIXES, "training/off_policy/", "worker/restarts/rollout"),
):
    """Every metric but the wall-clock ones and those only the asynchronous trainer logs."""
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in records(out_dir)]


def run(model_dir, files, out_dir, *extra, steps=3):
    config = small_config(model_dir, files, out_dir, f"trainer.total_training_steps={steps}", *extra)
    trainer = RLTrainer(config, reward_fn=parity_reward)
    trainer.fit()
    return trainer


def test_no_batch_ahead_is_the_synchronous_trainer(tiny_model_dir, arithmetic_files, tmp_path):
    """num_warmup_batches=0: the rollout role samples with the weights of the step before, as the actor's own
    engine does in the synchronous trainer; every metric of every step is the same."""
    run(tiny_model_dir, arithmetic_files, tmp_path / "sync")
    trainer = run(
        tiny_model_dir,
        arithmetic_files,
        tmp_path / "async",
        ASYNC,
        "trainer.v1.separate_async.num_warmup_batches=0",
    )
    assert trainer.plan.rollout_ahead == 0
    assert "rollout" in trainer.controller.groups
    assert numbers(tmp_path / "async") == numbers(tmp_path / "sync")
    last = records(tmp_path / "async")[-1]
    assert last[f"{STALENESS}/max"] == 0.0


def test_one_step_off_trains_on_samples_one_version_old(tiny_model_dir, arithmetic_files, tmp_path):
    trainer = run(tiny_model_dir, arithmetic_files, tmp_path / "a", ASYNC, steps=4)
    rows = [r for r in records(tmp_path / "a") if r["step"] > 0]
    # step 1 trains the first batch (drawn by the initial policy, as is the second); from step 2 on, one behind
    assert [r[f"{STALENESS}/max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r[f"{STALENESS}/min"] == r[f"{STALENESS}/max"] for r in rows)
    assert all("timing_s/generate_async" in r and "timing_s/gen" in r for r in rows)
    # The rollout role holds the weights of the last step trained.
    rollout = trainer.controller.group("rollout").workers[0]
    assert rollout.host.version == 4
    # the actor generated nothing (validation ran on the rollout role too): it never built an engine
    assert trainer.controller.group("actor_rollout").workers[0].host._engine is None
    policy = actor_module(trainer).state_dict()
    assert all(torch.equal(rollout.model.state_dict()[k], v) for k, v in policy.items())
    # The overlap does not make the run depend on thread timing: the same seed logs the same numbers.
    run(tiny_model_dir, arithmetic_files, tmp_path / "b", ASYNC, steps=4)
    assert numbers(tmp_path / "a") == numbers(tmp_path / "b")


def test_stale_samples_differ_from_the_synchronous_run(tiny_model_dir, arithmetic_files, tmp_path):
    run(tiny_model_dir, arithmetic_files, tmp_path / "sync")
    run(tiny_model_dir, arithmetic_files, tmp_path / "async", ASYNC)
    sync, stale = numbers(tmp_path / "sync"), numbers(tmp_path / "async")
    # Step 1: both train on the initial policy's samples. (The asynchronous trainer recomputes π_old rather
    # than taking the rollout's log-probs, so the losses agree to float rounding only.)
    for key in ("critic/score/mean", "response_length/mean"):
        assert sync[1][key] == stale[1][key], key
    assert sync[1]["actor/pg_loss"] == pytest.approx(stale[1]["actor/pg_loss"], rel=1e-4)
    # Step 2: the synchronous trainer samples with the updated policy, the asynchronous one did not.
    assert sync[2]["actor/pg_loss"] != pytest.approx(stale[2]["actor/pg_loss"], rel=1e-3)


def test_rollout_correction_measures_the_staleness(tiny_model_dir, arithmetic_files, tmp_path):
    """Decoupled correction: π_old is the trainer's policy, π_rollout the one a step older."""
    run(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        ASYNC,
        "algorithm.rollout_correction.rollout_is=token",
    )
    rows = [r for r in records(tmp_path) if r["step"] > 0]
    assert abs(rows[0]["rollout_corr/kl"]) < 1e-4  # step 1: the same policy
    assert abs(rows[-1]["rollout_corr/kl"]) > 1e-4 and rows[-1]["rollout_corr/chi2_token"] > 0


# ---------------------------------------------------------------------------------------------- streaming

# two responses per prompt: a group is complete once both stop, so collects often stop before the slowest
RAGGED = ("data.max_response_length=16", "actor_rollout_ref.rollout.n=2")
STREAM = (ASYNC, "async_training.staleness_threshold=0.5", *RAGGED)
COLOCATE = (
    "trainer.v1.trainer_mode=colocate_async",
    "trainer.v1.colocate_async.num_warmup_batches=2",
    *RAGGED,
)


@pytest.fixture(scope="module")
def ragged_model_dir(tiny_model_dir, tmp_path_factory):
    from tests._ragged import save_ragged_model

    return save_ragged_model(tiny_model_dir, tmp_path_factory.mktemp("ragged") / "model")


def trained_prompts(out_dir):
    """Every prompt trained in the run (one entry per response), sorted: from trainer.rollout_data_dir."""
    dumps = sorted((out_dir / "rollouts").glob("*.jsonl"))
    return sorted(json.loads(line)["input"] for path in dumps for line in path.read_text().splitlines())


@pytest.mark.parametrize("mode", [STREAM, COLOCATE], ids=["separate", "colocate"])
def test_streaming_trains_every_prompt_once_with_partial_rollouts(
    ragged_model_dir, arithmetic_files, tmp_path, mode
):
    """staleness_threshold > 0 (the rollout role's pool) and colocate_async (the actor's): batches are the first
    groups to finish, the rest go on under newer weights; nothing is lost or trained twice, and the run does
    not depend on thread timing."""
    dump = lambda out: f"trainer.rollout_data_dir={out / 'rollouts'}"  # noqa: E731
    sync, a, b = tmp_path / "sync", tmp_path / "a", tmp_path / "b"
    run(ragged_model_dir, arithmetic_files, sync, *RAGGED, dump(sync), steps=6)
    trainer = run(ragged_model_dir, arithmetic_files, a, *mode, dump(a), steps=6)
    assert ("rollout" in trainer.controller.groups) == (mode is STREAM)
    assert trained_prompts(a) == trained_prompts(sync)
    rows = [r for r in records(a) if r["step"] > 0]
    assert (
        max(r["fully_async/partial/max_partial_span"] for r in rows) >= 1
    )  # some generations spanned versions
    assert sum(r["fully_async/partial/total_partial_num"] for r in rows) > 0
    # max_off_policy_threshold 8: a span of at most 8, so no first token more than 7 versions old
    assert all(r[f"{STALENESS}_worst/max"] <= 7 for r in rows)
    assert rows[-1]["fully_async/pool/groups"] == 0  # every submitted prompt was trained
    run(ragged_model_dir, arithmetic_files, b, *mode, dump(b), steps=6)
    assert numbers(a, drop=WALL_CLOCK_PREFIXES) == numbers(b, drop=WALL_CLOCK_PREFIXES)


def test_streaming_without_partial_rollouts_finishes_generations_under_their_weights(
    ragged_model_dir, arithmetic_files, tmp_path
):
    out = tmp_path / "run"
    run(ragged_model_dir, arithmetic_files, out, *STREAM, "async_training.partial_rollout=false", steps=6)
    rows = [r for r in records(out) if r["step"] > 0]
    assert all(r["fully_async/partial/max_partial_span"] == 0 for r in rows)
    assert rows[-1]["fully_async/pool/groups"] == 0


CUSTOM_STEPS = """
from verl.trainer.step import batch_source, generate_groups, train_on


def from_source(flow, plan, step, prompts, more):
    batch, metrics = batch_source(plan).batch(flow, plan, step, prompts, more)
    metrics.append({"custom/step": float(step)})
    return train_on(flow, plan, step, batch, more, metrics)


def generates_itself(flow, plan, step, prompts, more):
    return train_on(flow, plan, step, generate_groups(flow, plan, prompts, tag=f"{step}-0"), more)
"""


def test_a_custom_step_takes_its_batch_from_the_modes_source(tiny_model_dir, arithmetic_files, tmp_path):
    """The one step in every mode: a trainer.step that asks the plan's batch source trains in separate_async
    exactly as rl_step does; one that generates on the actor itself is refused after its first step."""
    steps = tmp_path / "steps.py"
    steps.write_text(CUSTOM_STEPS)
    run(tiny_model_dir, arithmetic_files, tmp_path / "builtin", ASYNC)
    run(tiny_model_dir, arithmetic_files, tmp_path / "custom", ASYNC, f"trainer.step={steps}:from_source")
    custom = numbers(tmp_path / "custom")
    assert [r.get("custom/step") for r in custom] == [None, 1.0, 2.0, 3.0]
    assert [{k: v for k, v in r.items() if k != "custom/step"} for r in custom] == numbers(
        tmp_path / "builtin"
    )
    with pytest.raises(Exception, match="did not take its batch from the mode's source"):
        run(
            tiny_model_dir,
            arithmetic_files,
            tmp_path / "own",
            ASYNC,
            f"trainer.step={steps}:generates_itself",
        )


def test_with_lora_the_rollout_gets_the_base_once_then_the_adapters(
    tiny_model_dir, arithmetic_files, tmp_path
):
    """separate_async + LoRA: the first copy is whole, the later ones the adapters alone; after the run the
    rollout's model (adapters and base) equals the actor's, tensor for tensor."""
    trainer = run(
        tiny_model_dir, arithmetic_files, tmp_path / "lora", ASYNC, "actor_rollout_ref.model.lora_rank=8"
    )
    actor = trainer.controller.group("actor_rollout").workers[0]
    rollout = trainer.controller.group("rollout").workers[0]
    assert rollout.host.version == 3
    policy = actor.actor_model.state_dict()
    held = rollout.model.state_dict()
    assert policy.keys() == held.keys() and any("lora_A" in k for k in policy)
    assert all(torch.equal(held[k], v) for k, v in policy.items())
    adapters = actor.get_weights(trained_only=True)
    assert adapters["complete"] is False and adapters["names"]
    assert all(".lora_A." in name or ".lora_B." in name for name in adapters["names"])
    whole = actor.get_weights()
    assert whole["complete"] is True and len(whole["names"]) > len(adapters["names"])
