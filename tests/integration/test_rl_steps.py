"""Real RL steps on a tiny model: the weights move, the metrics are there, a seed reproduces a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _weights import assert_same_adam_update

from tests._fp32 import FP32
from verl.algorithms import ADV_ESTIMATOR_REGISTRY
from verl.config import list_recipes, load_config
from verl.data import iterate_batches
from verl.models import load_hf_model
from verl.protocol import DataProto
from verl.trainer.checkpointing import export_hf
from verl.trainer.metrics import WALL_CLOCK_PREFIXES
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

REQUIRED_METRICS = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
    "timing_per_token_ms/gen",
    "timing_per_token_ms/update_actor",
    "val-core/arithmetic/acc/mean@1",
]


def parity_reward(data: DataProto, return_dict: bool = False):
    """Reward = share of even token ids in the response, on its last token.

    Even a random model's samples differ in this, so every group has non-zero advantages.
    """
    mask = data.batch["response_mask"].float()
    even = (data.batch["responses"] % 2 == 0).float()
    lengths = mask.sum(-1)
    reward = torch.zeros_like(mask)
    reward[torch.arange(len(mask)), (lengths - 1).clamp_min(0).long()] = (even * mask).sum(
        -1
    ) / lengths.clamp_min(1)
    return {"reward_tensor": reward, "reward_extra_info": {}} if return_dict else reward


def small_config(model_dir, files, out_dir, *extra, recipe="grpo"):
    train, test = files
    return load_config(
        recipe,
        [
            f"data.train_files={train}",
            f"data.val_files={test}",
            "data.train_batch_size=4",
            "data.max_response_length=6",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
            "actor_rollout_ref.rollout.n=4",
            "trainer.total_training_steps=2",
            "trainer.test_freq=1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out_dir}",
            "prepare.enable=false",
            *FP32,  # the tests compare code paths (padding-free, the old log-prob pass) in exact arithmetic
            *extra,
        ],
    )


def actor_module(trainer):
    """The policy module of the (in-process) actor worker."""
    return trainer.controller.group("actor_rollout").workers[0].actor_model


def test_two_rl_steps_change_weights_and_log_metrics(tiny_model_dir, arithmetic_files, tmp_path):
    config = small_config(tiny_model_dir, arithmetic_files, tmp_path, "trainer.save_freq=1")
    trainer = RLTrainer(config, reward_fn=parity_reward)
    before = {k: v.clone() for k, v in actor_module(trainer).state_dict().items()}
    summary = trainer.fit()
    after = actor_module(trainer).state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2, f"only {len(changed)} of {len(before)} tensors changed"

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for key in REQUIRED_METRICS:
        assert key in records[-1], f"missing metric {key}"
    # 2 mini-batches of 2 prompts x 4 samples: two optimizer steps per RL step
    assert records[-1]["actor/grad_norm"] > 0
    assert summary["val_before"].keys() == summary["val_after"].keys()
    exported = export_hf(tmp_path / "global_step_2", tmp_path / "exported")
    saved = load_hf_model(exported).state_dict()
    assert all(torch.equal(saved[k], after[k]) for k in saved)
    assert (tmp_path / "global_step_1" / "actor" / "huggingface" / "tokenizer.json").exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


def _numbers(path):
    drop = WALL_CLOCK_PREFIXES
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(drop)}
        for line in path.read_text().splitlines()
    ]


def test_same_seed_same_metrics(tiny_model_dir, arithmetic_files, tmp_path):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        RLTrainer(small_config(tiny_model_dir, arithmetic_files, out), reward_fn=parity_reward).fit()
        runs.append(_numbers(out / "metrics.jsonl"))
    assert runs[0] == runs[1]
    other = tmp_path / "other-seed"
    RLTrainer(
        small_config(tiny_model_dir, arithmetic_files, other, "trainer.seed=7"), reward_fn=parity_reward
    ).fit()
    assert _numbers(other / "metrics.jsonl") != runs[0]


def test_kl_loss_and_kl_in_reward_run(tiny_model_dir, arithmetic_files, tmp_path):
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "actor_rollout_ref.actor.use_kl_loss=true",
        "algorithm.use_kl_in_reward=true",
        "trainer.total_training_steps=1",
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)
    trainer.fit()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert "actor/kl_loss" in record and "actor/reward_kl_penalty" in record and "timing_s/ref" in record


def measured_in_update(monkeypatch) -> list[bool]:
    """Records, per update, whether the actor measures actor/entropy in its own forward pass."""
    from verl.workers.actor import Actor

    calls, plan_update = [], Actor.plan_update

    def spy(self, *args, **kwargs):
        calls.append(kwargs["measure_entropy"])
        return plan_update(self, *args, **kwargs)

    monkeypatch.setattr(Actor, "plan_update", spy)
    return calls


def test_skipping_old_log_prob_gives_the_same_update(tiny_model_dir, arithmetic_files, tmp_path, monkeypatch):
    """On-policy (one optimizer step per RL step), the old_log_prob pass changes nothing but the time spent;
    without it actor/entropy is the fast engine's, not measured by the update again."""
    on_policy = ["actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=1"]
    measured = measured_in_update(monkeypatch)
    results = []
    for recompute in ("true", "null"):
        out = tmp_path / recompute
        config = small_config(
            tiny_model_dir,
            arithmetic_files,
            out,
            *on_policy,
            f"actor_rollout_ref.actor.recompute_old_log_prob={recompute}",
            "trainer.val_before_train=false",
        )
        trainer = RLTrainer(config, reward_fn=parity_reward)
        assert (trainer.plan.old_log_probs == "recompute") == (recompute == "true")
        trainer.fit()
        record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
        results.append((record, actor_module(trainer).state_dict()))
    (with_pass, weights_a), (without_pass, weights_b) = results
    assert with_pass["actor/pg_loss"] == pytest.approx(without_pass["actor/pg_loss"], abs=1e-6)
    assert with_pass["actor/entropy"] == pytest.approx(without_pass["actor/entropy"], rel=1e-4)
    assert without_pass["timing_s/old_log_prob"] == 0.0 < with_pass["timing_s/old_log_prob"]
    assert_same_adam_update(weights_a, weights_b, lr=1e-3, optimizer_steps=1, close=1e-6)
    assert measured == [False, False]


def test_the_update_measures_entropy_when_the_engine_returns_none(
    tiny_model_dir, arithmetic_files, tmp_path, monkeypatch
):
    measured = measured_in_update(monkeypatch)
    config = small_config(
        tiny_model_dir, arithmetic_files, tmp_path, "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "actor_rollout_ref.rollout.name=hf",
    )  # fmt: skip
    _, record, _ = one_step(config)
    assert measured == [True] and record["actor/entropy"] > 0


def test_ppo_with_critic_and_warmup(tiny_model_dir, arithmetic_files, tmp_path):
    """GAE needs a critic: it is built automatically, fitted every step, and the actor waits for the warm-up."""
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "algorithm.adv_estimator=gae",
        "algorithm.lam=0.95",
        "critic.optim.lr=1e-3",
        "trainer.critic_warmup=1",
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)
    assert "critic" in trainer.controller.groups
    actor_before = {k: v.clone() for k, v in actor_module(trainer).state_dict().items()}
    critic_before = {
        k: v.clone()
        for k, v in trainer.controller.group("critic").workers[0].value_model.state_dict().items()
    }

    batches = iterate_batches(trainer.train_dataset, trainer.sampler, trainer._collate, num_epochs=None)
    warmup = trainer.train_step(1, next(batches))
    assert "critic/vf_loss" in warmup and "actor/pg_loss" not in warmup  # step 1: critic only
    assert all(torch.equal(actor_before[k], v) for k, v in actor_module(trainer).state_dict().items())
    second = trainer.train_step(2, next(batches))
    for key in (
        "actor/pg_loss",
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/values/mean",
        "timing_s/values",
    ):
        assert key in second, key
    critic_after = trainer.controller.group("critic").workers[0].value_model.state_dict()
    assert any(not torch.equal(critic_before[k], critic_after[k]) for k in critic_before)
    assert any(not torch.equal(actor_before[k], v) for k, v in actor_module(trainer).state_dict().items())


# ppo_trainer holds verl's defaults at verl's sizes (512-token prompts and responses): verl's quick start runs
# it (tests/integration/test_verl_quickstart.py); grpo_verl is the same sizes made GRPO (its keys:
# tests/unit/test_recipes.py). The *sft* recipes are SFT configs.
RL_RECIPES = [
    name for name in list_recipes() if "sft" not in name and name not in ("ppo_trainer", "grpo_verl")
]


@pytest.mark.parametrize("recipe", RL_RECIPES)
def test_every_recipe_runs_two_steps(recipe, tiny_model_dir, arithmetic_files, tmp_path):
    # distill_arithmetic's teacher is the user's to give: here the student itself
    teacher = (
        [f"distillation.teacher_models.teacher_model.model_path={tiny_model_dir}"]
        if "distill" in recipe
        else []
    )
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "trainer.val_before_train=false",
        "trainer.critic_warmup=0",
        *teacher,
        recipe=recipe,
    )
    summary = RLTrainer(config, reward_fn=parity_reward).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    loss = "actor/distillation/loss" if "distill" in recipe else "actor/pg_loss"
    assert all(np.isfinite(r[loss]) for r in records)
    assert "val-core/arithmetic/acc/mean@1" in summary["val_after"]
    if recipe == "remax":
        assert "timing_s/gen_max" in records[-1]  # the greedy baseline rollout ran
    if recipe == "ppo":
        assert "critic/vf_loss" in records[-1]


def test_dynamic_sampling_fills_the_batch_with_varied_groups(tiny_model_dir, arithmetic_files, tmp_path):
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=20",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
    )

    def first_token_reward(data, return_dict=False):
        """1 when the first response token is even: about half the groups of 4 end up uniform and are dropped."""
        reward = torch.zeros(data.batch["responses"].shape)
        reward[:, 0] = (data.batch["responses"][:, 0] % 2 == 0).float()
        return {"reward_tensor": reward, "reward_extra_info": {}} if return_dict else reward

    trainer = RLTrainer(config, reward_fn=first_token_reward)
    trained = []
    worker = trainer.controller.group("actor_rollout").workers[0]
    update = worker.update_actor
    worker.update_actor = lambda data, request: trained.append(data) or update(data, request)
    batches = iterate_batches(trainer.train_dataset, trainer.sampler, trainer._collate, num_epochs=None)
    metrics = trainer.train_step(1, next(batches), batches)
    assert metrics["train/num_gen_batches"] >= 1
    (batch,) = trained
    assert len(batch) == 4 * 4  # data.train_batch_size groups of rollout.n
    scores = batch.batch["token_level_scores"].sum(-1).view(4, 4)
    assert all(len(set(group.tolist())) > 1 for group in scores)  # every group trained on has varied rewards


def test_clip_ratio_schedule_reaches_its_final_value(tiny_model_dir, arithmetic_files, tmp_path):
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "actor_rollout_ref.actor.clip_ratio_final=0.05",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "trainer.val_before_train=false",
    )
    RLTrainer(config, reward_fn=parity_reward).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # two steps: progress 0 then 1, linear from 0.2 to 0.05
    assert [r["actor/clip_ratio"] for r in records] == pytest.approx([0.2, 0.05])


def test_test_freq_minus_one_never_validates_during_training(tiny_model_dir, arithmetic_files, tmp_path):
    """Issue 41: test_freq=-1 is verl's "never", the last step included; val_before_train still validates."""
    from verl.cli_commands import _headline, _headline_line

    config = small_config(
        tiny_model_dir, arithmetic_files, tmp_path, "trainer.test_freq=-1", "data.val_max_samples=8"
    )
    summary = RLTrainer(config, reward_fn=parity_reward).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    validated = [r["step"] for r in records if any(k.startswith("val-core/") for k in r)]
    assert validated == [0]  # val_before_train only
    assert [r["step"] for r in records] == [0, 1, 2] and "timing_s/testing" not in records[-1]
    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == ["0.jsonl"]
    assert summary["val_before"] and summary["val_after"] == {}
    # the end-of-run lines (verl run's) show the number it has and claim no "after RL" one
    before, after = _headline(summary["val_before"]), _headline(summary["val_after"])
    lines = [_headline_line(key, before.get(key), after.get(key)) for key in sorted(set(before) | set(after))]
    assert lines and all("before RL" in line and "after RL" not in line for line in lines)


def test_dummy_rollout_engine_trains(tiny_model_dir, arithmetic_files, tmp_path):
    """rollout.name switches the engine and nothing else: the dummy engine feeds the same step."""
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "actor_rollout_ref.rollout.name=dummy",
        "trainer.total_training_steps=1",
    )
    summary = RLTrainer(config, reward_fn=parity_reward).fit()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["actor/grad_norm"] > 0 and "val-core/arithmetic/acc/mean@1" in summary["val_after"]


def one_step(config, reward_fn=parity_reward):
    """Run one RL step; its metrics record and the actor's weights."""
    trainer = RLTrainer(config, reward_fn=reward_fn)
    trainer.fit()
    metrics_file = Path(config.trainer.default_local_dir) / "metrics.jsonl"
    record = json.loads(metrics_file.read_text().splitlines()[-1])
    return trainer, record, actor_module(trainer).state_dict()


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_padding_free_training_gives_the_same_update(recipe, tiny_model_dir, arithmetic_files, tmp_path):
    """Packed sequences in token-budget micro-batches (several per mini-batch, rows reordered) update the
    policy (and critic) like padded fixed-size micro-batches: same losses, same weights."""
    common = [
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.recompute_old_log_prob=true",
    ]
    # 32 prompt + 6 response tokens at most: a 48-token budget holds 2-4 of these rows.
    packed = [
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=48",
    ]
    runs = []
    for name, extra in (("padded", []), ("packed", packed)):
        config = small_config(
            tiny_model_dir, arithmetic_files, tmp_path / name, *common, *extra, recipe=recipe
        )
        trainer, record, weights = one_step(config)
        actor = trainer.controller.group("actor_rollout").workers[0]
        assert actor.actor.scorer.remove_padding == (name == "packed")
        assert (actor.actor_model.config._attn_implementation == "verl_varlen") == (name == "packed")
        critic = (
            trainer.controller.group("critic").workers[0].value_model.state_dict()
            if trainer.plan.critic
            else {}
        )
        runs.append((record, weights, critic))
    (rec_a, weights_a, critic_a), (rec_b, weights_b, critic_b) = runs
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss"):
        if key in rec_a:
            assert rec_b[key] == pytest.approx(rec_a[key], rel=1e-4, abs=1e-6), key
    # Packing changes the order of float sums in the forward passes: rounding-level gradient changes.
    assert_same_adam_update(weights_a, weights_b, lr=1e-3, optimizer_steps=2, close=1e-4, rtol=1e-4)
    if critic_a:
        assert_same_adam_update(critic_a, critic_b, lr=1e-3, optimizer_steps=2, close=1e-4, rtol=1e-4)


def test_fast_rollout_log_probs_replace_the_old_log_prob_pass(tiny_model_dir, arithmetic_files, tmp_path):
    """Off-policy (two optimizer steps per RL step) the old log-probs are needed; the fast engine returns
    them with the samples, so the recompute pass is skipped and the update is the same."""
    common = [
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "actor_rollout_ref.rollout.name=fast",
    ]
    runs = []
    for recompute in ("true", "null"):
        config = small_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path / recompute,
            *common,
            f"actor_rollout_ref.actor.recompute_old_log_prob={recompute}",
        )
        trainer, record, weights = one_step(config)
        assert (trainer.plan.old_log_probs == "recompute") == (recompute == "true")
        assert (trainer.plan.old_log_probs == "from_rollout") == (recompute == "null")
        runs.append((record, weights))
    (with_pass, weights_a), (without_pass, weights_b) = runs
    # With both present the run reports how far the engine's probabilities are from the actor's.
    assert with_pass["training/rollout_probs_diff_max"] < 1e-5
    assert without_pass["timing_s/old_log_prob"] == 0.0 < with_pass["timing_s/old_log_prob"]
    assert without_pass["actor/pg_loss"] == pytest.approx(with_pass["actor/pg_loss"], abs=1e-5)
    assert without_pass["actor/ppo_kl"] == pytest.approx(with_pass["actor/ppo_kl"], abs=1e-5)
    # The engine's log-probs differ from the recomputed ones by rounding: so do the two updates' gradients.
    assert_same_adam_update(weights_a, weights_b, lr=1e-3, optimizer_steps=2, rtol=1e-4)


@pytest.mark.parametrize(
    ("keys", "old_log_probs"),
    [
        # decoupled: token TIS and geometric-mean rejection of π_old against π_rollout, once per batch
        (["rollout_is=token", "rollout_rs=seq_mean_k1", "rollout_rs_threshold=0.9_1.1"], "recompute"),
        # bypass, REINFORCE: π_old := π_rollout, weights of π_θ against it in every micro-batch
        (["rollout_is=sequence", "bypass_mode=true", "loss_type=reinforce"], "from_rollout"),
    ],
)
def test_rollout_correction_runs_in_the_trainer(
    keys, old_log_probs, tiny_model_dir, arithmetic_files, tmp_path
):
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        *(f"algorithm.rollout_correction.{key}" for key in keys),
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)
    assert trainer.plan.old_log_probs == old_log_probs
    assert "rollout correction" in trainer.plan.describe()
    trainer.fit()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    # The fast engine samples from the trained module in fp32: π_rollout is π_old to float rounding.
    if old_log_probs == "recompute":
        assert abs(record["rollout_corr/kl"]) < 1e-4
        assert record["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
        assert record["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    else:  # the second of two optimizer steps is off-policy: π_θ has moved away from π_rollout
        assert record["rollout_corr/rollout_is_mean"] > 0 and record["rollout_corr/chi2_token"] >= 0
        assert "rollout_corr/rollout_is_eff_sample_size" in record
    assert record["actor/grad_norm"] > 0


def test_hf_rollout_log_probs_are_compared_with_the_old_log_prob_pass(
    tiny_model_dir, arithmetic_files, tmp_path
):
    """``rollout.calculate_log_probs=true`` with the hf engine: generate's logits give the rollout's log-probs,
    the old_log_prob pass still computes π_old, and the run reports how far apart the two are."""
    config = small_config(
        tiny_model_dir, arithmetic_files, tmp_path,
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.calculate_log_probs=true",
    )  # fmt: skip
    trainer, record, _ = one_step(config)
    assert trainer.plan.old_log_probs == "recompute"
    assert record["training/rollout_probs_diff_max"] < 1e-5


@pytest.mark.parametrize("estimator", sorted(ADV_ESTIMATOR_REGISTRY))
def test_every_advantage_estimator_trains_a_step(estimator, tiny_model_dir, arithmetic_files, tmp_path):
    """Each registered estimator through the real trainer: the step runs with what it needs (a critic for
    gae, the greedy baseline for remax), its advantages are finite, not all zero, and the actor moves."""
    config = small_config(
        tiny_model_dir, arithmetic_files, tmp_path,
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
        f"algorithm.adv_estimator={estimator}",
    )  # fmt: skip
    before = load_hf_model(tiny_model_dir).state_dict()
    trainer, record, weights = one_step(config)
    assert trainer.plan.critic == (estimator == "gae")
    advantages = record["critic/advantages/max"], record["critic/advantages/min"]
    assert all(math.isfinite(a) for a in advantages) and advantages != (0.0, 0.0)
    assert any(not torch.equal(before[k], weights[k]) for k in weights)
