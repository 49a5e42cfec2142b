"""On-policy distillation end to end: real RL steps on the tiny model with a teacher scoring every training batch
(never the validation batches), in the synchronous trainer, the asynchronous modes and FSDP2, with the estimator and the
top-k losses, as a loss and as a reward."""

from __future__ import annotations

import json

import pytest
import torch
from test_rl_steps import actor_module, parity_reward, small_config

from verl.models import make_tiny_model
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

DISTILL = "distillation.enabled=true"
TOPK = ("distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4")


@pytest.fixture(scope="module")
def other_teacher(tmp_path_factory):
    """A teacher with the student's tokenizer and other weights."""
    return make_tiny_model(
        tmp_path_factory.mktemp("teacher"), seed=7, hidden_size=64, num_hidden_layers=2, intermediate_size=128
    )


def records(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def run(model_dir, files, out_dir, teacher, *extra):
    """Two steps with ``teacher``, validating before and after each; the rows each teacher call scored."""
    config = small_config(
        model_dir,
        files,
        out_dir,
        DISTILL,
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        *extra,
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)
    worker = trainer.controller.group("actor_rollout").workers[0]
    scored, score = [], worker.compute_teacher_log_prob
    worker.compute_teacher_log_prob = lambda data: scored.append(len(data)) or score(data)
    before = {k: v.clone() for k, v in actor_module(trainer).state_dict().items()}
    trainer.fit()
    moved = any(not torch.equal(before[k], v) for k, v in actor_module(trainer).state_dict().items())
    return [r for r in records(out_dir) if r["step"] > 0], scored, moved


def test_a_teacher_equal_to_the_student_gives_zero_loss_and_only_training_batches_are_scored(
    tiny_model_dir, arithmetic_files, tmp_path
):
    """verl's debugging advice: the teacher is the student. Without task rewards (and weight decay) nothing moves
    the student away from it, so every step's loss is exactly 0, and so is k3's gradient."""
    rows, scored, moved = run(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        tiny_model_dir,
        "distillation.distillation_loss.use_task_rewards=false",
        "actor_rollout_ref.actor.optim.weight_decay=0",
    )
    assert scored == [16, 16]  # 4 prompts x 4 responses per step; the 3 validations are not scored
    assert not moved
    for row in rows:
        assert row["actor/distillation/loss"] == 0.0 and row["actor/grad_norm"] == 0.0
        assert row["actor/distillation/loss_max"] == 0.0 and row["actor/distillation/loss_min"] == 0.0
        assert row["timing_s/teacher"] > 0 and "val-core/arithmetic/acc/mean@1" in row


def test_distillation_alone_one_response_per_prompt(
    tiny_model_dir, arithmetic_files, tmp_path, other_teacher
):
    """verl's OPD shape: k3 without task rewards and rollout.n=1; the student moves toward another model."""
    rows, scored, moved = run(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        other_teacher,
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "distillation.distillation_loss.use_task_rewards=false",
    )
    assert scored == [4, 4] and moved
    assert all(r["actor/distillation/loss"] > 0 and "actor/pg_loss" not in r for r in rows)
    assert all(r["actor/distillation/loss_min"] <= r["actor/distillation/loss_max"] for r in rows)
    assert "critic/score/mean" in rows[-1]  # rewards are still scored and logged


@pytest.mark.parametrize("policy_gradient", [False, True], ids=["loss", "reward"])
def test_forward_kl_over_the_teachers_topk(
    tiny_model_dir, arithmetic_files, tmp_path, other_teacher, policy_gradient
):
    pg = f"distillation.distillation_loss.use_policy_gradient={str(policy_gradient).lower()}"
    rows, _, moved = run(tiny_model_dir, arithmetic_files, tmp_path, other_teacher, *TOPK, pg)
    assert moved
    for row in rows:
        assert row["actor/distillation/loss"] > 0
        assert (
            0 < row["actor/distillation/student_mass"] <= 1
            and 0 < row["actor/distillation/teacher_mass"] <= 1
        )
        assert 0 <= row["actor/distillation/overlap_ratio"] <= 1
        assert row["actor/distillation/teacher_mass_min"] <= row["actor/distillation/teacher_mass_max"]
        assert ("actor/distillation/pg_clipfrac" in row) == policy_gradient


ASYNC_MODES = {
    "colocate_async": (
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=1",
    ),
    # a rollout role of its own generating a batch ahead, and its streaming pool (fully async)
    "separate_async": (
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=1",
    ),
    "streaming": ("trainer.v1.trainer_mode=separate_async", "async_training.staleness_threshold=0.5"),
}


@pytest.mark.parametrize("mode", list(ASYNC_MODES))
def test_the_async_modes_distil_two_steps(tiny_model_dir, arithmetic_files, tmp_path, other_teacher, mode):
    """The teacher scores each training batch where the actor trains it, whichever process generated it."""
    rows, scored, moved = run(tiny_model_dir, arithmetic_files, tmp_path, other_teacher, *ASYNC_MODES[mode])
    assert [r["step"] for r in rows] == [1, 2] and scored == [16, 16] and moved
    assert all(r["actor/distillation/loss"] > 0 for r in rows)


def test_fsdp2_distils_as_dp_does(tiny_model_dir, arithmetic_files, tmp_path, other_teacher):
    """The teacher sharded and offloaded like the reference (one rank: a one-process group): the same metrics as
    with dp (fp32 both), the top-k loss included."""
    metrics = {}
    for strategy in ("dp", "fsdp2"):
        out = tmp_path / strategy
        rows, _, _ = run(
            tiny_model_dir,
            arithmetic_files,
            out,
            other_teacher,
            *TOPK,
            f"actor_rollout_ref.actor.strategy={strategy}",
        )
        metrics[strategy] = rows
    for dp, fsdp in zip(metrics["dp"], metrics["fsdp2"], strict=True):
        for key in (k for k in dp if k.startswith("actor/distillation/")):
            assert fsdp[key] == pytest.approx(dp[key], rel=1e-4, abs=1e-6), key


def test_a_lora_student_distils(tiny_model_dir, arithmetic_files, tmp_path, other_teacher):
    """A LoRA student (its adapters trained) distils toward a full teacher."""
    rows, scored, moved = run(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        other_teacher,
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear",
        "distillation.distillation_loss.use_task_rewards=false",
    )
    assert scored == [16, 16] and moved
    assert all(r["actor/distillation/loss"] > 0 for r in rows)
