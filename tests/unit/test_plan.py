"""The step plan: which passes an RL step has, decided once from the config."""

from __future__ import annotations

import pytest

from verl.config import derive_sizes, load_config
from verl.trainer.plan import StepPlan

BASE = ["prepare.enable=false", "actor_rollout_ref.model.path=unused"]


def plan_of(*overrides: str, recipe: str = "grpo") -> StepPlan:
    config = load_config(recipe, [*BASE, *overrides])
    return StepPlan.from_config(config, derive_sizes(config), total_steps=11)


def test_default_grpo_is_on_policy_without_reference_or_critic():
    plan = plan_of()
    assert (plan.old_log_probs, plan.ref, plan.critic) == ("not_needed", False, False)
    assert not (plan.remax_baseline or plan.refill_until_varied or plan.balance)
    assert plan.n == 8 and plan.kl_ctrl is None


def test_old_log_probs_come_from_the_engine_that_returns_them():
    # two optimizer steps per RL step need pi_old: the fast engine returns it, HF generate does not
    assert plan_of("actor_rollout_ref.actor.ppo_mini_batch_size=8").old_log_probs == "from_rollout"
    hf = plan_of("actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.name=hf")
    assert hf.old_log_probs == "recompute"
    assert plan_of("actor_rollout_ref.actor.recompute_old_log_prob=true").old_log_probs == "recompute"
    assert plan_of("algorithm.use_kl_in_reward=true").old_log_probs == "from_rollout"


def test_bypass_mode_takes_pi_old_from_hf_only_when_it_returns_log_probs():
    bypass = ("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.name=hf")
    with pytest.raises(
        ValueError, match="returns none: .*hf with actor_rollout_ref.rollout.calculate_log_probs=true"
    ):
        plan_of(*bypass)
    assert (
        plan_of(*bypass, "actor_rollout_ref.rollout.calculate_log_probs=true").old_log_probs == "from_rollout"
    )


def test_old_log_probs_are_recomputed_when_the_actor_computes_in_reduced_precision():
    """The engine's log-probs equal the actor's only in fp32; in bf16 they round differently."""
    two_steps = "actor_rollout_ref.actor.ppo_mini_batch_size=8"
    assert plan_of(two_steps, "actor_rollout_ref.model.torch_dtype=bf16").old_log_probs == "recompute"
    fsdp = (two_steps, "actor_rollout_ref.actor.strategy=fsdp2")
    assert plan_of(*fsdp).old_log_probs == "from_rollout"  # on the CPU FSDP2 computes in the weights' fp32
    bf16 = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"
    assert plan_of(*fsdp, bf16).old_log_probs == "recompute"
    # LoRA under the plain strategy's bf16 autocast: the engine's merged adapters are not the actor's arithmetic
    lora = (two_steps, "actor_rollout_ref.model.lora_rank=8")
    assert plan_of(*lora, bf16).old_log_probs == "recompute"
    fp32 = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"
    assert plan_of(*lora, fp32).old_log_probs == "from_rollout"


def test_kl_terms_need_the_reference():
    assert plan_of("actor_rollout_ref.actor.use_kl_loss=true").ref
    in_reward = plan_of("algorithm.use_kl_in_reward=true")
    assert in_reward.ref and in_reward.kl_ctrl is not None


@pytest.mark.parametrize(
    ("recipe", "field"),
    [("ppo", "critic"), ("remax", "remax_baseline"), ("dapo", "refill_until_varied")],
)
def test_recipes_turn_on_their_passes(recipe, field):
    assert getattr(plan_of(recipe=recipe), field)


def test_critic_warmup_and_progress():
    plan = plan_of("trainer.critic_warmup=2", recipe="ppo")
    assert [plan.update_actor(step) for step in (1, 2, 3)] == [False, False, True]
    assert [plan.progress(step) for step in (1, 6, 11)] == [0.0, 0.5, 1.0]
    assert "critic warm-up 2 steps" in plan.describe()


def test_the_plan_reads_what_an_estimator_declared_not_its_name():
    """A user's estimator registered with what it needs gets those passes; no estimator name is compared."""
    from verl.algorithms import ADV_ESTIMATOR_REGISTRY, register_adv_est
    from verl.algorithms.advantages import ADV_ESTIMATOR_NEEDS

    names = ("test_valued", "test_greedy", "test_grouped")
    try:
        register_adv_est("test_valued", critic=True)(lambda **kw: None)
        register_adv_est("test_greedy", greedy_baseline=True)(lambda **kw: None)
        register_adv_est("test_grouped", groups=True)(lambda **kw: None)
        valued = plan_of("algorithm.adv_estimator=test_valued")
        assert valued.critic and not valued.remax_baseline
        greedy = plan_of("algorithm.adv_estimator=test_greedy")
        assert greedy.remax_baseline and not greedy.critic
        assert not plan_of("algorithm.adv_estimator=test_grouped").critic
        with pytest.raises(Exception, match="algorithm.adv_estimator=test_grouped compares the responses"):
            plan_of("algorithm.adv_estimator=test_grouped", "actor_rollout_ref.rollout.n=1")
        # verl's one-argument form declares nothing: no critic, and one response per prompt is accepted
        register_adv_est("test_plain")(lambda **kw: None)
        assert not plan_of("algorithm.adv_estimator=test_plain", "actor_rollout_ref.rollout.n=1").critic
    finally:
        for name in (*names, "test_plain"):
            ADV_ESTIMATOR_REGISTRY.pop(name, None)
            ADV_ESTIMATOR_NEEDS.pop(name, None)


def test_actor_entropy_comes_from_the_rollout_only_when_the_samples_are_the_current_policys():
    plan = plan_of("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    assert plan.entropy_from_rollout and plan.loss_agg_mode == "seq-mean-token-mean"
    ahead = ("trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.num_warmup_batches=1")
    assert not plan_of(*ahead).entropy_from_rollout  # batches generated ahead: an older policy's entropies
    assert not plan_of("trainer.v1.trainer_mode=colocate_async").entropy_from_rollout
