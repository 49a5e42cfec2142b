"""On-policy distillation: the losses by hand (k3, forward KL over the teacher's top-k), their gradient
direction, the policy-gradient form and its mixing with the task loss, teacher routing by data_source, and the
teacher's scoring on the tiny model (a teacher equal to the student gives the student's own log-probs: KL 0)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from verl.algorithms.distillation import (
    DistillationLossOptions,
    combine_with_policy_loss,
    compute_forward_kl_topk,
    distillation_advantages,
    distillation_loss,
    forward_kl_topk,
    get_distillation_loss_settings,
    needs_policy_loss,
    student_topk_log_probs,
)
from verl.config.errors import ConfigError
from verl.models import load_hf_model, make_tiny_model
from verl.models.loading import load_tokenizer
from verl.protocol import DataProto
from verl.workers.actor import compute_log_prob
from verl.workers.engine.scoring import PolicyScorer
from verl.workers.teacher import (
    Teacher,
    Teachers,
    TeacherScorer,
    TeacherSpec,
    check_same_tokenizer,
    compute_teacher_log_prob,
    resolve_teacher_models,
    route_to_teachers,
)

LOG = math.log
MASK = torch.tensor([[1, 1, 0]])


def options(**kw):
    return DistillationLossOptions.of(kw)


# ------------------------------------------------------------------------------------------ the math


def test_k3_by_hand_and_zero_when_equal():
    # Δ = log π − log ν: log 2, −log 2, 0 (the last one masked).
    student = torch.tensor([[LOG(0.5), LOG(0.25), LOG(0.3)]])
    teacher = torch.tensor([[LOG(0.25), LOG(0.5), LOG(0.3)]])
    data = {"teacher_logprobs": teacher.unsqueeze(-1), "response_mask": MASK}  # verl's (B, T, 1) works too
    loss, metrics = distillation_loss(options(loss_mode="k3"), {"log_probs": student}, data)
    k3 = [0.5 + LOG(2) - 1, 2 - LOG(2) - 1]  # e^{−Δ} + Δ − 1
    assert loss.item() == pytest.approx(sum(k3) / 2)  # token-mean over the 2 real tokens
    assert metrics["distillation/loss_min"] == pytest.approx(min(k3))
    assert metrics["distillation/loss_max"] == pytest.approx(max(k3))
    assert metrics["distillation/abs_loss"] == pytest.approx(sum(k3) / 2)
    same, _ = distillation_loss(options(), {"log_probs": teacher}, data)
    assert same.item() == 0.0


def test_k1_is_refused_as_a_direct_loss_and_an_unknown_mode_named():
    with pytest.raises(ValueError, match="k1"):
        options(loss_mode="k1")
    with pytest.raises(ConfigError, match="forward_kl_topk"):
        options(loss_mode="forward_kl_top")
    with pytest.raises(NotImplementedError, match="vanilla"):
        options(policy_loss_mode="gspo")
    assert get_distillation_loss_settings("low_var_kl").use_estimator
    assert get_distillation_loss_settings("forward_kl_topk").use_topk
    defaults = options()  # verl's YAML defaults
    assert (defaults.loss_mode, defaults.topk, defaults.use_policy_gradient, defaults.loss_max_clamp) == (
        "k3",
        32,
        False,
        None,
    )


def test_forward_kl_topk_by_hand_masses_and_clamp_at_zero():
    teacher = torch.tensor([[[LOG(0.5), LOG(0.25)], [LOG(0.5), LOG(0.25)], [0.0, 0.0]]])
    student = torch.tensor([[[LOG(0.25), LOG(0.25)], [LOG(0.6), LOG(0.3)], [0.0, 0.0]]])
    out = forward_kl_topk(student, teacher)
    # Σ_S ν (log ν − log π): 0.5·log 2 + 0; 0.75·log(0.5/0.6) < 0 (both cut to the teacher's top-k).
    assert out["distillation_losses"][0, 0].item() == pytest.approx(0.5 * LOG(2))
    assert out["distillation_losses"][0, 1].item() == pytest.approx(0.75 * LOG(0.5 / 0.6))
    assert out["teacher_mass"][0, 0].item() == pytest.approx(0.75)
    assert out["student_mass"][0, 1].item() == pytest.approx(0.9)
    losses, metrics = compute_forward_kl_topk(
        options(loss_mode="forward_kl_topk", topk=2), out, {"response_mask": MASK}
    )
    assert losses[0, :2].tolist() == pytest.approx([0.5 * LOG(2), 0.0])  # the negative one clamped
    assert metrics["distillation/teacher_mass"] == pytest.approx(0.75)
    assert metrics["distillation/student_mass_min"] == pytest.approx(0.5)
    assert metrics["distillation/student_mass_max"] == pytest.approx(0.9)


def test_log_prob_min_clamp_and_overlap_metrics():
    teacher = torch.tensor([[[LOG(0.5), LOG(1e-9)]]])
    student = torch.tensor([[[LOG(0.5), LOG(1e-12)]]])
    clamped = forward_kl_topk(student, teacher, log_prob_min_clamp=-10.0)["distillation_losses"]
    assert clamped.item() == pytest.approx(0.0)  # the second pair both at −10: no contribution
    out = forward_kl_topk(
        student, teacher, teacher_topk_ids=torch.tensor([[[4, 7]]]), student_topk_ids=torch.tensor([[[4, 9]]])
    )
    assert out["overlap_count"].item() == 1  # id 4 only
    assert out["overlap_token_advantage"].item() == pytest.approx(0.0)  # ν(4)(log ν − log π) = 0
    _, metrics = compute_forward_kl_topk(
        options(loss_mode="forward_kl_topk", topk=2), out, {"response_mask": MASK[:, :1]}
    )
    assert metrics["distillation/overlap_ratio"] == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["k3", "forward_kl_topk"])
def test_minimising_the_loss_moves_the_student_toward_the_teacher(mode):
    vocab = 6
    teacher = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -2.0]]), -1)
    logits = torch.zeros(1, vocab, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=0.5)
    cfg = options(loss_mode=mode, topk=vocab)
    mask = torch.ones(1, 1)

    def kl() -> float:  # the true reverse KL(π‖ν)
        p = torch.log_softmax(logits.detach(), -1)
        return (p.exp() * (p - teacher)).sum().item()

    before = kl()
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        log_probs = torch.log_softmax(logits, -1)
        if mode == "k3":  # the sampled token y ~ π, as on-policy
            y = torch.multinomial(log_probs.detach().exp(), 1, generator=generator)
            model_output = {"log_probs": log_probs.gather(-1, y)}
            data = {"teacher_logprobs": teacher.gather(-1, y), "response_mask": mask}
        else:
            ids = teacher.topk(vocab, -1).indices
            student, own = student_topk_log_probs(logits, ids)
            model_output = forward_kl_topk(
                student[:, None], teacher.gather(-1, ids)[:, None], ids[:, None], own[:, None]
            )
            data = {"response_mask": mask}
        loss, _ = distillation_loss(cfg, model_output, data)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert kl() < 0.1 * before


def test_k3_gradient_raises_a_token_the_teacher_prefers():
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    log_probs = torch.log_softmax(logits, -1)[..., 0]  # π(y) = 0.25
    data = {"teacher_logprobs": torch.full((1, 1), LOG(0.7)), "response_mask": torch.ones(1, 1)}
    loss, _ = distillation_loss(options(loss_mode="k3"), {"log_probs": log_probs}, data)
    loss.backward()
    assert logits.grad[0, 0, 0] < 0  # descending raises the logit of y


def test_policy_gradient_form_reward_sign_and_mixing_with_the_task_loss():
    # k1 as a reward (verl's recommended PG OPD): A = −(log π − log ν).
    student = torch.tensor([[LOG(0.5), LOG(0.25)]], requires_grad=True)
    teacher = torch.tensor([[LOG(0.25), LOG(0.5)]])
    cfg = options(loss_mode="k1", use_policy_gradient=True, distillation_loss_coef=0.5)
    losses = student.detach() - teacher
    assert distillation_advantages(losses)[0].tolist() == pytest.approx([-LOG(2), LOG(2)])
    data = {"teacher_logprobs": teacher, "response_mask": torch.ones(1, 2)}
    loss, metrics = distillation_loss(cfg, {"log_probs": student}, data)
    assert {"distillation/pg_clipfrac", "distillation/ppo_kl", "distillation/pg_clipfrac_lower"} <= set(
        metrics
    )
    # On-policy the ratio is 1: L = mean(−A) and ∂L/∂log π = −A/2: down where the student is above the teacher.
    assert loss.item() == pytest.approx(0.0)
    loss.backward()
    assert student.grad[0].tolist() == pytest.approx([LOG(2) / 2, -LOG(2) / 2])
    task = torch.tensor(3.0)
    assert combine_with_policy_loss(task, torch.tensor(2.0), cfg).item() == pytest.approx(4.0)  # 3 + 0.5·2
    alone = options(use_task_rewards=False, distillation_loss_coef=0.5)
    assert combine_with_policy_loss(task, torch.tensor(2.0), alone).item() == pytest.approx(2.0)
    assert not needs_policy_loss(alone) and needs_policy_loss(cfg)


def test_loss_max_clamp_and_topk_as_reward_warns(caplog):
    data = {"teacher_logprobs": torch.tensor([[-30.0]]), "response_mask": torch.ones(1, 1)}
    loss, metrics = distillation_loss(options(loss_max_clamp=2.0), {"log_probs": torch.tensor([[0.0]])}, data)
    assert loss.item() == 2.0 and metrics["distillation/loss_max"] == 10.0  # k3's own cap, then the clamp
    with caplog.at_level(logging.WARNING):
        options(loss_mode="forward_kl_topk", use_policy_gradient=True)
    assert "supervised" in caplog.text


# ------------------------------------------------------------------------------------------ routing


def batch_of(sources):
    return DataProto.from_dict(
        tensors={"x": torch.zeros(len(sources), 1)},
        non_tensors={"data_source": np.array(sources, dtype=object)},
    )


def test_routing_by_data_source():
    routed = route_to_teachers(batch_of(["gsm8k", "geo", "gsm8k"]), ["gsm8k", "geo"])
    assert {k: v.tolist() for k, v in routed.items()} == {"gsm8k": [0, 2], "geo": [1]}
    with pytest.raises(ValueError, match="no teacher configured for data_source='math'"):
        route_to_teachers(batch_of(["math"]), ["gsm8k", "geo"])
    with pytest.raises(ValueError, match="task"):
        route_to_teachers(batch_of(["gsm8k"]), ["gsm8k", "geo"], teacher_key="task")
    # One teacher takes every sample whatever its key (verl's single-teacher path).
    assert route_to_teachers(batch_of(["math", "geo"]), ["default"])["default"].tolist() == [0, 1]


def test_teacher_models_resolved_as_verl():
    single = resolve_teacher_models({"teacher_model": {"key": None, "model_path": "/t"}})
    assert list(single) == ["default"]
    many = resolve_teacher_models(
        {
            "teacher_model": {"key": None, "model_path": None},  # the YAML default entry: dropped
            "t1": {"key": "gsm8k", "model_path": "/a"},
            "t2": {"key": "geo", "model_path": "/b"},
        }
    )
    assert {k: v.model_path for k, v in many.items()} == {"gsm8k": "/a", "geo": "/b"}
    with pytest.raises(ValueError, match="duplicate"):
        resolve_teacher_models(
            {"t1": {"key": "a", "model_path": "/a"}, "t2": {"key": "a", "model_path": "/b"}}
        )
    with pytest.raises(ValueError, match=r"t2\.key"):
        resolve_teacher_models({"t1": {"key": "a", "model_path": "/a"}, "t2": {"model_path": "/b"}})


# ------------------------------------------------------------------------------------------ the teacher


def rollout_batch(vocab_size, sources=None):
    """Left-padded prompts and right-padded responses (one response empty)."""
    generator = torch.Generator().manual_seed(0)
    prompt_lengths, response_lengths = [5, 2, 4, 3], [6, 3, 0, 5]
    pw, rw = 5, 6
    input_ids = torch.randint(3, vocab_size, (4, pw + rw), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        attention_mask[row, : pw - p] = 0
        attention_mask[row, pw + r :] = 0
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, pw:],
        "response_mask": attention_mask[:, pw:],
    }
    non_tensors = {"data_source": np.array(sources, dtype=object)} if sources else None
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def test_teacher_equal_to_student_scores_the_students_log_probs(tiny_model_dir, one_torch_thread):
    tokenizer = load_tokenizer(tiny_model_dir)
    teacher = Teacher(
        TeacherSpec("teacher_model", "default", str(tiny_model_dir)), tokenizer
    )  # the actor's scoring options
    student = load_hf_model(tiny_model_dir)
    data = rollout_batch(student.config.vocab_size)
    mask = data.batch["response_mask"]
    actor, _ = compute_log_prob(PolicyScorer(student), data, micro_batch_size=None, temperature=1.0)
    plain = teacher.score(data)
    assert torch.equal(plain.log_probs, actor)
    top = teacher.score(data, topk=5, micro_batch_size=3)
    torch.testing.assert_close(top.log_probs, actor, atol=1e-6, rtol=0)
    assert top.topk_ids.shape == (4, 6, 5) and (top.topk_ids[mask == 0] == 0).all()
    assert (top.topk_log_probs.diff(dim=-1)[mask.bool()] <= 0).all()  # descending
    # KL = 0: k3 on the sampled tokens, and the forward KL over the teacher's top-k with the student's logits.
    k3, _ = distillation_loss(
        options(), {"log_probs": actor}, {"teacher_logprobs": top.log_probs, "response_mask": mask}
    )
    assert abs(k3.item()) < 1e-6
    with torch.no_grad():
        logits = student(
            input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"]
        ).logits
    logits = logits[:, 4:-1]  # the positions that predict each response token
    at_teacher_ids, own = student_topk_log_probs(logits, top.topk_ids)
    out = forward_kl_topk(at_teacher_ids, top.topk_log_probs, top.topk_ids, own)
    assert out["distillation_losses"][mask.bool()].abs().max() < 1e-5
    assert (out["overlap_count"][mask.bool()] == 5).all()


def test_topk_scoring_is_the_same_packed_and_chunked(tiny_model_dir, one_torch_thread):
    from verl.workers.engine.packing import packed_attention_implementation

    data = rollout_batch(load_hf_model(tiny_model_dir).config.vocab_size)
    plain = compute_teacher_log_prob(TeacherScorer(load_hf_model(tiny_model_dir)), data, None, topk=3)
    packed_model = load_hf_model(tiny_model_dir, attn_implementation=packed_attention_implementation("sdpa"))
    packed = compute_teacher_log_prob(TeacherScorer(packed_model, True, 2), data, None, topk=3, max_tokens=16)
    torch.testing.assert_close(packed.topk_log_probs, plain.topk_log_probs, atol=1e-5, rtol=1e-5)
    assert torch.equal(packed.topk_ids, plain.topk_ids)


def test_two_teachers_each_score_their_own_rows(tiny_model_dir, tmp_path, one_torch_thread):
    other_dir = make_tiny_model(
        tmp_path / "other", seed=1, hidden_size=64, num_hidden_layers=2, intermediate_size=128
    )
    tokenizer = load_tokenizer(tiny_model_dir)
    a = Teacher(TeacherSpec("t1", "gsm8k", str(tiny_model_dir)), tokenizer)
    b = Teacher(TeacherSpec("t2", "geo", str(other_dir)), tokenizer)
    data = rollout_batch(a.model.config.vocab_size, sources=["gsm8k", "geo", "geo", "gsm8k"])
    fields = Teachers({"gsm8k": a, "geo": b}).score(data).batch
    own_a, own_b = a.score(data).log_probs, b.score(data).log_probs
    assert not torch.allclose(own_a, own_b)
    torch.testing.assert_close(fields["teacher_logprobs"][[0, 3]], own_a[[0, 3]], atol=1e-6, rtol=0)
    torch.testing.assert_close(fields["teacher_logprobs"][[1, 2]], own_b[[1, 2]], atol=1e-6, rtol=0)
    mask = data.batch["response_mask"].bool()
    assert torch.equal(fields["teacher_ids"][mask], data.batch["responses"][mask])


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    other = make_tiny_model(
        tmp_path / "other-vocab", vocab_size=300, hidden_size=32, num_hidden_layers=1, intermediate_size=64
    )
    with pytest.raises(ValueError, match="share one tokenizer"):
        Teacher(TeacherSpec("t", "default", str(other)), load_tokenizer(tiny_model_dir))
    tok = load_tokenizer(tiny_model_dir)
    check_same_tokenizer(tok, load_tokenizer(tiny_model_dir), "same")  # the same vocabulary passes
