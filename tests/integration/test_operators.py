"""Operators (``rollout >> reward >> advantage >> training``): the flow trains, engines swap, mistakes are named."""

from __future__ import annotations

import json

import pytest
import torch

from verl.config import to_container
from verl.trainer.operators import (
    Flow,
    GRPOAdvantageOperator,
    RewardOperator,
    RolloutOperator,
    TrainingOperator,
)
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

SCORED: list[str] = []


def letter_share(data_source, solution_str, ground_truth, extra_info=None):
    """A user's reward: the share of ASCII letters in the response (varies even for a random model)."""
    SCORED.append(solution_str)
    letters = sum(c.isascii() and c.isalpha() for c in solution_str)
    return {"score": letters / max(1, len(solution_str)), "acc": 0.0}


def tiny_overrides(files, out_dir, *extra):
    """A tiny, fast run (like small_config in test_rl_steps.py), minus the keys the operators set."""
    train, test = files
    return [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=4",
        "data.max_response_length=6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "trainer.total_training_steps=2",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out_dir}",
        "prepare.enable=false",
        *extra,
    ]


def grpo_flow(model, engine="hf", reward_fn="arithmetic", components=("policy_loss",)) -> Flow:
    return (
        RolloutOperator(model=model, engine=engine, n_samples_per_prompt=4)
        >> RewardOperator(reward_fn=reward_fn)
        >> GRPOAdvantageOperator(baseline="group_mean")
        >> TrainingOperator(engine="dp", loss_components=list(components))
    )


def policy_weights(trainer: RLTrainer) -> dict[str, torch.Tensor]:
    module = trainer.controller.group("actor_rollout").workers[0].actor_model
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_flow_with_python_reward_trains_two_steps(tiny_model_dir, arithmetic_files, tmp_path):
    flow = grpo_flow(tiny_model_dir, reward_fn=letter_share, components=("policy_loss", "kl_loss", "entropy"))
    SCORED.clear()
    controller = flow.build("grpo", overrides=tiny_overrides(arithmetic_files, tmp_path))
    try:
        actor_cfg = controller.config.actor_rollout_ref.actor
        assert actor_cfg.use_kl_loss and actor_cfg.entropy_coeff > 0
        assert controller.config.actor_rollout_ref.rollout.n == 4
        before = policy_weights(controller)
        controller.fit()
        after = policy_weights(controller)
    finally:
        controller.shutdown()
    assert SCORED, "the python reward function was never called"
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2, f"only {len(changed)} of {len(before)} tensors changed"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "timing_s/gen"):
        assert key in records[-1], key
    assert records[-1]["critic/score/max"] > 0  # letter_share scored the responses


def test_swapping_the_rollout_engine_changes_only_its_name(tiny_model_dir, arithmetic_files, tmp_path):
    configs = {}
    for engine in ("hf", "dummy"):
        flow = grpo_flow(tiny_model_dir, engine=engine)
        overrides = tiny_overrides(
            arithmetic_files,
            tmp_path,
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.on_existing_run=move_aside",  # the second run into the same directory
        )
        configs[engine] = flow.config(overrides=overrides)
        summary = flow.run("grpo", overrides=overrides)
        assert summary["last_metrics"]["training/global_step"] == 1
        assert "actor/pg_loss" in summary["last_metrics"]
    hf, dummy = (_flat(to_container(configs[e])) for e in ("hf", "dummy"))
    assert {k for k in hf if hf[k] != dummy[k]} == {"actor_rollout_ref.rollout.name"}


def _flat(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_baselines_set_the_estimator(tiny_model_dir):
    expected = {
        "group_mean": ("grpo", True),
        "group_mean_no_std": ("grpo", False),
        "leave_one_out": ("rloo", True),
    }
    for baseline, (estimator, by_std) in expected.items():
        flow = (
            RolloutOperator(model=tiny_model_dir)
            >> RewardOperator()
            >> GRPOAdvantageOperator(baseline)
            >> TrainingOperator()
        )
        algorithm = flow.config(overrides=["prepare.enable=false"]).algorithm
        assert (algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo) == (estimator, by_std)
    with pytest.raises(ValueError, match="group_mean, group_mean_no_std, leave_one_out"):
        GRPOAdvantageOperator("critic")


def test_operators_out_of_order_are_refused():
    rollout, reward = RolloutOperator(), RewardOperator()
    adv, train = GRPOAdvantageOperator(), TrainingOperator()
    with pytest.raises(ValueError, match="RewardOperator needs a rollout operator before it"):
        reward >> rollout
    with pytest.raises(ValueError, match="GRPOAdvantageOperator needs a reward operator"):
        rollout >> adv
    with pytest.raises(ValueError, match="already has a reward operator"):
        rollout >> reward >> reward
    with pytest.raises(ValueError, match="cannot train: it has no advantage, training operator"):
        (rollout >> reward).build()
    flow = rollout >> reward >> adv >> train  # the parts above were not changed by the failed attempts
    assert str(flow) == "RolloutOperator >> RewardOperator >> GRPOAdvantageOperator >> TrainingOperator"


def test_bad_settings_name_the_valid_choices():
    with pytest.raises(ValueError, match="valid: policy_loss, kl_loss, entropy"):
        TrainingOperator(loss_components=["policy_loss", "kl"])
    with pytest.raises(ValueError, match="no 'policy_loss'"):
        TrainingOperator(loss_components=["kl_loss"])
    assert TrainingOperator(engine="fsdp").overrides()["actor_rollout_ref.actor.strategy"] == "fsdp2"
    with pytest.raises(ValueError, match="megatron is not built"):
        TrainingOperator(engine="megatron")
    assert TrainingOperator(engine="ddp").overrides()["actor_rollout_ref.actor.strategy"] == "dp"
    with pytest.raises(ValueError, match="registered engines: dummy, .*hf"):
        RolloutOperator(engine="no-such-engine")
    with pytest.raises(ValueError, match="not a built-in scorer .*arithmetic, gsm8k"):
        RewardOperator(reward_fn="gsm8k_correctness")


def test_builtin_scorer_name_scores_every_sample():
    score = RewardOperator("arithmetic").compute_score
    assert score(data_source="anything", solution_str="12 and more", ground_truth="12") == {
        "score": 1.0,
        "acc": 1.0,
    }
    assert score(data_source="anything", solution_str="13", ground_truth="12") == {"score": 0.0, "acc": 0.0}


def test_an_override_cannot_contradict_an_operator(tiny_model_dir):
    flow = grpo_flow(tiny_model_dir)
    with pytest.raises(ValueError, match="n_samples_per_prompt=4"):
        flow.config(overrides=["actor_rollout_ref.rollout.n=2"])
