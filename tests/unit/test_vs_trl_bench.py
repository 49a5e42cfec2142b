"""benchmarks/vs_trl.py without TRL: the shared reward, argument parsing, token counting, the medians, and
that verl's side overrides only what it must (no speed claims, nothing slow: TRL's import alone takes
seconds, so no test imports it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

vs_trl = pytest.importorskip("benchmarks.vs_trl")
reward = pytest.importorskip("benchmarks.vs_trl_reward")


def test_partial_credit_reads_the_last_integer():
    assert reward.partial_credit("12+30=42", "42") == 1.0
    assert reward.partial_credit("The answer is 42.", 42) == 1.0
    assert reward.partial_credit("42, no wait, 41", "42") == pytest.approx(0.1 + 0.4 * (1 - 1 / 42))
    assert reward.partial_credit("no number here", "42") == 0.0
    assert reward.partial_credit("", "0") == 0.0
    assert reward.partial_credit("1000", "42") == pytest.approx(
        0.1
    )  # far off: the "gave a number" credit only
    assert reward.partial_credit("-3", "-3") == 1.0
    assert reward.partial_credit("1", "0") == pytest.approx(0.1)  # closeness uses max(|answer|, 1)


def test_both_conventions_score_the_same():
    texts, answers = ["7+8=15", "15?", "sixteen", "16"], ["15", "15", "15", "15"]
    ours = [reward.compute_score("arithmetic", t, a, None) for t, a in zip(texts, answers, strict=True)]
    conversational = [[{"role": "assistant", "content": t}] for t in texts]
    assert reward.trl_reward(conversational, answers) == ours
    assert reward.trl_reward(texts, ground_truth=answers, prompts=None, completion_ids=None) == ours


def test_parse_kv_values():
    parsed = vs_trl.parse_kv(
        ["bf16=false", "gradient_checkpointing=False", "learning_rate=1e-5", "optim=adamw_torch",
         'model_init_kwargs={"attn_implementation": "eager"}', "x=None"],
        "--trl-arg",
    )  # fmt: skip
    assert parsed == {
        "bf16": False,
        "gradient_checkpointing": False,
        "learning_rate": 1e-5,
        "optim": "adamw_torch",
        "model_init_kwargs": {"attn_implementation": "eager"},
        "x": None,
    }
    with pytest.raises(SystemExit, match="key=value"):
        vs_trl.parse_kv(["bf16"], "--trl-arg")


def test_completion_tokens_counts_rows_as_trl_cut_them():
    # TRL cuts each row after its first EOS (kept) and drops the padding: the count is the row lengths' sum
    assert vs_trl.completion_tokens([[5, 6, 2], [7], []]) == 4


def test_summarize_skips_warmup_and_takes_medians():
    steps = [
        {"step_s": 10.0, "gen_s": 9.0, "completion_tokens": 100},  # warm-up: slow, ignored
        {"step_s": 1.0, "gen_s": 0.5, "completion_tokens": 100},
        {"step_s": 2.0, "gen_s": 0.6, "completion_tokens": 100},
        {"step_s": 4.0, "gen_s": 0.7, "completion_tokens": 400},
    ]
    s = vs_trl.summarize(steps, warmup=1)
    assert s["timed_steps"] == 3
    assert s["step_s"] == 2.0 and s["gen_s"] == 0.6 and s["completion_tokens"] == 100
    assert s["tokens_per_s"] == 100.0  # per step: 100, 50, 100 -> median 100
    assert s["spread_pct"] == pytest.approx(150.0)
    assert s["mean_reward"] is None
    with pytest.raises(ValueError, match="no timed steps"):
        vs_trl.summarize(steps[:1], warmup=1)


def test_plan_sides():
    plan = vs_trl.plan_sides("ours,trl", "default,fp32-nogc")
    assert [(side, label) for side, label, _ in plan] == [
        ("ours", "verl"),
        ("trl", "trl default"),
        ("trl", "trl fp32-nogc"),
    ]
    assert plan[2][2] == {"bf16": False, "gradient_checkpointing": False}
    with pytest.raises(SystemExit, match="unknown"):
        vs_trl.plan_sides("ours", "nope")
    with pytest.raises(SystemExit, match="unknown side"):
        vs_trl.plan_sides("theirs", "default")


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    return tmp_path


def test_ours_overrides_only_model_data_sizes_and_reward(model_dir, tmp_path):
    settings = vs_trl.Settings(prompts=8, samples=8, response_length=32, warmup=2, steps=8)
    overrides = vs_trl.ours_overrides(str(model_dir), str(tmp_path), settings, str(tmp_path / "out"))
    keys = {o.split("=", 1)[0] for o in overrides}
    assert not any(k.startswith("trainer.torch_threads") for k in keys)  # verl's own thread choice
    assert not any("rollout.name" in k or "attn_implementation" in k or "mixed_precision" in k for k in keys)
    config = vs_trl.ours_config(str(model_dir), str(tmp_path), settings, str(tmp_path / "out"))
    assert config.data.train_batch_size == 8 and config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == 8  # one optimizer step per RL step
    assert config.data.max_response_length == 32 and config.data.train_max_samples == 80
    assert config.data.shuffle is False
    assert Path(config.custom_reward_function.path) == Path(reward.__file__).resolve()
    assert (
        config.trainer.torch_threads
        == vs_trl.ours_config(
            str(model_dir), str(tmp_path), settings, str(tmp_path / "o"), ["trainer.seed=3"]
        ).trainer.torch_threads
    )


def test_trl_args_follow_verls_config(model_dir, tmp_path):
    settings = vs_trl.Settings(prompts=8, samples=8, response_length=64)
    config = vs_trl.ours_config(str(model_dir), str(tmp_path), settings, str(tmp_path / "out"))
    args = vs_trl.trl_shared_args(config, settings)
    actor = config.actor_rollout_ref.actor
    assert args["per_device_train_batch_size"] == 64 and args["num_generations"] == 8
    assert args["gradient_accumulation_steps"] == args["num_iterations"] == args["steps_per_generation"] == 1
    assert args["beta"] == 0.0 and args["use_cpu"] and args["report_to"] == "none" and not args["use_vllm"]
    assert args["max_completion_length"] == 64 and args["max_steps"] == settings.total_steps
    assert args["learning_rate"] == actor.optim.lr and args["weight_decay"] == actor.optim.weight_decay
    assert args["max_grad_norm"] == actor.grad_clip and args["epsilon"] == actor.clip_ratio
    assert args["loss_type"] == vs_trl.LOSS_TYPES[actor.loss_agg_mode]
    assert args["temperature"] == config.actor_rollout_ref.rollout.temperature
    assert "bf16" not in args and "gradient_checkpointing" not in args  # TRL's defaults, unless a row says


def test_trl_lr_schedule_is_verls():
    """The GRPOConfig schedule fields give transformers' scheduler verl's multipliers after warm-up (cosine down
    to min_lr_ratio, not to 0)."""
    import torch
    from omegaconf import OmegaConf
    from transformers import get_scheduler

    from verl.workers.engine.optim import lr_multiplier

    assert vs_trl.lr_schedule_args(
        OmegaConf.create({"lr_scheduler_type": "constant", "min_lr_ratio": 0.0})
    ) == {"lr_scheduler_type": "constant_with_warmup"}
    optim = OmegaConf.create({"lr_scheduler_type": "cosine", "min_lr_ratio": 0.1})
    fields = vs_trl.lr_schedule_args(optim)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = get_scheduler(
        fields["lr_scheduler_type"],
        opt,
        num_warmup_steps=5,
        num_training_steps=50,
        scheduler_specific_kwargs=fields.get("lr_scheduler_kwargs"),
    )
    for step in range(50):
        if step >= 5:
            assert opt.param_groups[0]["lr"] == pytest.approx(
                lr_multiplier(step, 5, 50, "cosine", 0.1), abs=1e-9
            )
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1, abs=1e-3)


def test_least_disturbed_attempt_is_kept():
    attempts = [
        {"status": "ok", "others_pct": 30.0, "n": 1},
        {"status": "error", "others_pct": None, "n": 2},
        {"status": "ok", "others_pct": 4.0, "n": 3},
    ]
    assert vs_trl.least_disturbed(attempts)["n"] == 3
    assert vs_trl.least_disturbed(attempts[1:2])["n"] == 2  # none succeeded: the last says why


def test_every_option_parses():
    args = vs_trl.build_parser().parse_args(
        ["--models", "4m", "--retries", "1", "--ours-override", "a=1", "--trl-arg", "bf16=false"]
    )
    assert args.retries == 1 and args.steps == 8 and args.warmup == 2 and args.prompts == args.samples == 8
    assert args.response_length is None and args.trl_rows == "default" and args.sides == "ours,trl"
