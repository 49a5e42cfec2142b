"""On-policy distillation wired into the RL step: the student's side of the top-k loss from the scorer's head step
(against full logits by hand, gradients chunked and not), the actor's loss by hand (k3 of a known log-ratio, the
task loss kept, dropped, mixed), min / max metrics over mini-batches, the zero-advantage skip turned off, the step
plan and the advantage step's union, and the recipe's required teacher."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from _actor_update import ROWS, batch
from omegaconf import OmegaConf

from verl.algorithms.distillation import DistillationLossOptions
from verl.config import ConfigError, load_config
from verl.config.schema import ActorConfig
from verl.models import load_hf_model
from verl.protocol import DataProto
from verl.trainer.advantage import compute_advantages
from verl.trainer.plan import StepPlan
from verl.workers.actor import Actor, loss_context
from verl.workers.engine.optim import build_optimizer
from verl.workers.engine.scoring import PolicyScorer
from verl.workers.engine.update_loop import reduce_metric_shares
from verl.workers.teacher import TeacherScorer

LOG2 = math.log(2)
K3_PLUS = 0.5 + LOG2 - 1  # k3 = e^{-Δ} + Δ - 1 at Δ = log π - log ν = +log 2
K3_MINUS = 2 - LOG2 - 1  # ... at Δ = -log 2
ARR = "actor_rollout_ref"


def tensors(data: DataProto) -> tuple[torch.Tensor, ...]:
    b = data.batch
    return b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"], b["response_mask"]


@pytest.fixture
def model(tiny_model_dir, one_torch_thread):
    torch.manual_seed(0)
    return load_hf_model(tiny_model_dir, attn_implementation="eager")


# ------------------------------------------------------------------------------------------ the scorer's head


def by_hand(model, data: DataProto, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at the positions predicting each response token: [rows, T, V]."""
    input_ids, attention, positions, responses, _ = tensors(data)
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions).logits
    start = input_ids.shape[1] - responses.shape[1] - 1
    return torch.log_softmax(logits[:, start : start + responses.shape[1]].float() / temperature, dim=-1)


def test_the_head_step_gives_the_log_probs_at_given_ids_and_its_own_topk(model):
    data = batch(model.config.vocab_size, (), off_policy=False)
    mask = data.batch["response_mask"].bool()
    ids = torch.randint(
        0, model.config.vocab_size, (*mask.shape, 3), generator=torch.Generator().manual_seed(1)
    )
    full = by_hand(model, data, temperature=0.7)
    with torch.no_grad():
        _, _, head = PolicyScorer(model, chunk_size=5)(*tensors(data), temperature=0.7, at_ids=ids, topk=3)
    expected = full.gather(-1, ids) * mask[..., None]
    torch.testing.assert_close(head["at_ids_log_probs"], expected, atol=1e-5, rtol=0)
    top = full.topk(3, dim=-1)
    assert torch.equal(head["topk_ids"][mask], top.indices[mask])
    torch.testing.assert_close(head["topk_log_probs"][mask], top.values[mask], atol=1e-5, rtol=0)
    assert not head["topk_ids"][~mask].any() and not head["at_ids_log_probs"][~mask].any()


def test_the_gradient_at_the_given_ids_is_the_same_chunked_and_whole(model):
    """Chunks of 4 positions are recomputed in the backward pass (no chunk's logits kept): the same gradient."""
    data = batch(model.config.vocab_size, (), off_policy=False)
    ids = torch.randint(0, model.config.vocab_size, (ROWS, 6, 3), generator=torch.Generator().manual_seed(2))
    weights = torch.randn(ROWS, 6, 3, generator=torch.Generator().manual_seed(3))
    grads = []
    for chunk in (0, 4):
        model.zero_grad()
        _, _, head = PolicyScorer(model, chunk_size=chunk)(*tensors(data), at_ids=ids, topk=3)
        (head["at_ids_log_probs"] * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert any(g.abs().sum() > 0 for g in grads[0].values())


def test_the_teacher_scores_its_topk_through_the_same_head_step(model):
    data = batch(model.config.vocab_size, (), off_policy=False)
    mask = data.batch["response_mask"].bool()
    log_probs, ids, top = TeacherScorer(model, chunk_size=4).score_topk(*tensors(data), topk=4)
    full = by_hand(model, data, temperature=1.0).detach()
    assert torch.equal(ids[mask], full.topk(4, dim=-1).indices[mask])
    torch.testing.assert_close(top[mask], full.topk(4, dim=-1).values[mask], atol=1e-5, rtol=0)
    sampled = full.gather(-1, data.batch["responses"][..., None]).squeeze(-1) * mask
    torch.testing.assert_close(log_probs, sampled, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ the actor's loss


def make_actor(model, lr: float = 0.0, **distillation) -> Actor:
    keys = [
        "shuffle=false",
        f"optim.lr={lr}",
        "optim.lr_warmup_steps=0",
        "optim.weight_decay=0",
        "entropy_coeff=0.5",
    ]
    cfg = OmegaConf.merge(OmegaConf.structured(ActorConfig), OmegaConf.from_dotlist(keys))
    options = DistillationLossOptions.of(distillation)
    return Actor(model, cfg, build_optimizer(model.parameters(), cfg.optim), seed=0, distillation=options)


def with_teacher(actor: Actor, data: DataProto, offsets: torch.Tensor) -> DataProto:
    """``data`` whose teacher log-probs are the student's minus ``offsets`` (per row): Δ = offsets; π_old is the
    student as it is."""
    student, _ = actor.compute_log_prob(data, None, temperature=1.0)
    mask = data.batch["response_mask"]
    data.batch["old_log_probs"] = student
    data.batch["teacher_logprobs"] = (student - offsets[:, None]) * mask
    data.batch["teacher_ids"] = data.batch["responses"] * mask
    return data


def one_loss(actor: Actor, data: DataProto) -> tuple[float, dict[str, float]]:
    tokens = data.batch["response_mask"].sum().item()
    context = loss_context(actor.config, 1.0, tokens, len(data))
    metrics: dict[str, float] = defaultdict(float)
    with torch.no_grad():
        loss = actor.micro_batch_loss(data, context, metrics, temperature=1.0, use_entropy=True)
    return loss.item(), dict(metrics)


def test_k3_of_a_known_log_ratio_and_how_it_combines_with_the_task_loss(model):
    data = batch(model.config.vocab_size, (), off_policy=False)
    mask = data.batch["response_mask"].float()
    task_pg = -(data.batch["advantages"] * mask).sum().item() / mask.sum().item()  # vanilla at ratio 1
    _, entropy = make_actor(model).compute_log_prob(data, None, 1.0, with_entropy=True)
    mean_entropy = (entropy * mask).sum().item() / mask.sum().item()

    actor = make_actor(model, use_task_rewards=True, distillation_loss_coef=0.5)
    data = with_teacher(actor, data, torch.full((ROWS,), LOG2))
    loss, metrics = one_loss(actor, data)
    assert metrics["actor/distillation/loss"] == pytest.approx(K3_PLUS, rel=1e-5)
    assert metrics["actor/distillation/loss_min"] == pytest.approx(K3_PLUS, rel=1e-5)
    assert metrics["actor/distillation/loss_max"] == pytest.approx(K3_PLUS, rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(task_pg, abs=1e-6)
    assert loss == pytest.approx(task_pg - 0.5 * mean_entropy + 0.5 * K3_PLUS, rel=1e-5)

    # use_task_rewards=false: the distillation loss alone; GKD does not compute the task loss at all
    actor = make_actor(model, use_task_rewards=False)
    loss, metrics = one_loss(actor, data)
    assert loss == pytest.approx(K3_PLUS, rel=1e-5)
    assert "actor/pg_loss" not in metrics and metrics["actor/entropy"] == pytest.approx(
        mean_entropy, rel=1e-5
    )

    # as a reward (PG OPD): on-policy the PPO loss of advantages -L is mean L; the task loss is computed, dropped
    actor = make_actor(model, use_task_rewards=False, use_policy_gradient=True, loss_mode="k3")
    loss, metrics = one_loss(actor, data)
    assert loss == pytest.approx(K3_PLUS, rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(task_pg, abs=1e-6)
    assert metrics["actor/distillation/pg_clipfrac"] == 0.0


def test_a_teacher_equal_to_the_student_gives_zero_loss_and_zero_gradient(model):
    actor = make_actor(model, lr=1e-2, use_task_rewards=False)
    data = with_teacher(actor, batch(model.config.vocab_size, (), off_policy=False), torch.zeros(ROWS))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = actor.update_policy(data, mini_batch_size=ROWS, micro_batch_size=4, temperature=1.0)
    assert metrics["actor/distillation/loss"] == 0.0 and metrics["actor/distillation/loss_max"] == 0.0
    assert metrics["actor/grad_norm"] == 0.0  # k3's gradient 1 - e^{-Δ} is exactly 0 at Δ = 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_min_and_max_metrics_over_mini_batches_are_min_and_max_not_means(model):
    """Mini-batch 1's tokens all have Δ = log 2, mini-batch 2's Δ = -log 2 (lr 0: the student stays put)."""
    actor = make_actor(model, use_task_rewards=False)
    offsets = torch.tensor([LOG2] * 4 + [-LOG2] * 4)
    data = with_teacher(actor, batch(model.config.vocab_size, (0, 1), off_policy=False), offsets)
    metrics = actor.update_policy(data, mini_batch_size=4, micro_batch_size=2, temperature=1.0)
    assert metrics["actor/distillation/loss_min"] == pytest.approx(K3_PLUS, rel=1e-5)
    assert metrics["actor/distillation/loss_max"] == pytest.approx(K3_MINUS, rel=1e-5)
    assert metrics["actor/distillation/loss"] == pytest.approx((K3_PLUS + K3_MINUS) / 2, rel=1e-5)
    # every advantage is 0, yet no row is skipped: each carries the teacher's gradient
    assert "actor/skipped_backward_frac" not in metrics


def test_topk_loss_through_the_actor_matches_the_teachers_own_topk(model):
    """The teacher is the student: forward KL over its top-4 is 0 (clamped at 0), the masses agree."""
    actor = make_actor(model, use_task_rewards=False, loss_mode="forward_kl_topk", topk=4)
    data = batch(model.config.vocab_size, (), off_policy=False)
    _, ids, top = TeacherScorer(model).score_topk(*tensors(data), topk=4)
    data.batch["teacher_ids"], data.batch["teacher_logprobs"] = ids, top
    loss, metrics = one_loss(actor, data)
    assert loss == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/distillation/overlap_ratio"] == pytest.approx(1.0)
    assert metrics["actor/distillation/student_mass"] == pytest.approx(
        metrics["actor/distillation/teacher_mass"], rel=1e-5
    )


def test_the_update_refuses_a_batch_without_the_teachers_scores(model):
    with pytest.raises(ValueError, match="no teacher_logprobs"):
        make_actor(model).update_policy(batch(model.config.vocab_size, (), False), ROWS, None, 1.0)


def test_metric_shares_reduce_by_sum_min_and_max():
    shares = {"a": 1.5, "lo": 0.25, "hi": 0.75}
    assert reduce_metric_shares(shares, {"lo": "min", "hi": "max", "absent": "min"}) == shares


# ------------------------------------------------------------------------------------------ plan, step, config


def distill_config(*extra: str):
    return load_config(
        "grpo",
        [
            f"{ARR}.model.path=/m",
            "data.train_files=/t.parquet",
            "distillation.enabled=true",
            "distillation.teacher_models.teacher_model.model_path=/teacher",
            *extra,
        ],
    )


def test_the_plan_scores_with_the_teacher_and_says_so():
    cfg = distill_config("distillation.distillation_loss.loss_mode=forward_kl_topk")
    from verl.config import derive_sizes

    plan = StepPlan.from_config(cfg, derive_sizes(cfg), 10)
    assert plan.teacher and plan.teacher_topk == 32 and "teacher (top-32)" in plan.describe()
    plan = StepPlan.from_config(distill_config(), derive_sizes(cfg), 10)
    assert plan.teacher and plan.teacher_topk == 0 and ", teacher" in plan.describe()
    off = load_config("grpo", [f"{ARR}.model.path=/m", "data.train_files=/t.parquet"])
    assert not StepPlan.from_config(off, derive_sizes(off), 10).teacher


def test_the_advantage_step_unions_the_teachers_scores(model):
    data = batch(model.config.vocab_size, (), off_policy=False)
    data.batch["token_level_scores"] = torch.zeros(ROWS, 6)
    data.non_tensor_batch["uid"] = torch.arange(ROWS).div(4, rounding_mode="floor").numpy()
    teacher = DataProto.from_dict(
        {"teacher_logprobs": torch.ones(ROWS, 6), "teacher_ids": torch.ones(ROWS, 6)}
    )
    cfg = distill_config()
    from verl.config import derive_sizes

    plan = StepPlan.from_config(cfg, derive_sizes(cfg), 10)
    out = compute_advantages(data, teacher=teacher, plan=plan)["batch"]
    assert torch.equal(out.batch["teacher_logprobs"], torch.ones(ROWS, 6)) and "advantages" in out.batch


def test_the_distillation_recipe_needs_its_teacher_named():
    with pytest.raises(ConfigError, match="distillation.teacher_models.teacher_model.model_path must be set"):
        load_config("distill_arithmetic")
    cfg = load_config("distill_arithmetic", ["distillation.teacher_models.teacher_model.model_path=/teacher"])
    assert cfg.distillation.enabled and cfg.distillation.distillation_loss.loss_mode == "k3"
    assert cfg.distillation.distillation_loss.use_task_rewards is False and cfg[ARR].model.lora_rank == 0
    assert cfg.prepare.tiny_model == load_config("grpo").prepare.tiny_model  # the demo's own starting model


def test_the_smollm2_distillation_recipe_is_the_rl_recipes_student_and_batch():
    with pytest.raises(ConfigError, match="distillation.teacher_models.teacher_model.model_path must be set"):
        load_config("distill_smollm2")
    cfg = load_config("distill_smollm2", ["distillation.teacher_models.teacher_model.model_path=/teacher"])
    rl = load_config("smollm2_arithmetic")
    assert cfg.distillation.enabled and cfg.distillation.distillation_loss.use_task_rewards is False
    assert cfg.prepare == rl.prepare and cfg[ARR].model.lora_rank == rl[ARR].model.lora_rank == 16
    assert (cfg.data.train_batch_size, cfg[ARR].rollout.n) == (rl.data.train_batch_size, rl[ARR].rollout.n)
