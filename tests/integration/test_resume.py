"""Checkpoints resume exactly: a run killed with SIGKILL (mid-training, or in the middle of a save)
and restarted logs the same metrics, step by step, as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from _small_run import small_run, two_turns_overrides

from verl.models import load_tokenizer
from verl.trainer.checkpointing import CRASH_ENV, export_hf
from verl.trainer.metrics import WALL_CLOCK_PREFIXES
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

TOTAL_STEPS = 6

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Share of even digits in the response: random models differ in it, so groups have signal."""
    digits = [c for c in solution_str if c.isdigit()]
    return sum(int(c) % 2 == 0 for c in digits) / max(len(digits), 1)
'''


def overrides(model_dir, files, out_dir, reward_path, *extra):
    return [
        *small_run(model_dir, files),
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 optimizer steps: old log-probs, shuffling
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
        "actor_rollout_ref.rollout.n=4",
        f"trainer.total_training_steps={TOTAL_STEPS}",
        "trainer.test_freq=2",
        "trainer.save_freq=1",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out_dir}",
        f"custom_reward_function.path={reward_path}",
        "custom_reward_function.name=compute_score",
        "prepare.enable=false",
        *extra,
    ]


def metrics_by_step(out_dir):
    """Every logged metric except wall-clock ones, keyed by step."""
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    drop = WALL_CLOCK_PREFIXES
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(drop)} for r in rows}


def run_cli(args, env=None, kill_after_step=None, recipe="grpo"):
    """``verl run`` in a child process; with ``kill_after_step`` it is SIGKILLed once that step is logged."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl.cli", "run", "--config", recipe, *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if kill_after_step is not None:
        out_dir = next(a.split("=", 1)[1] for a in args if a.startswith("trainer.default_local_dir="))
        metrics = os.path.join(out_dir, "metrics.jsonl")
        deadline = time.time() + 600  # (a recipe may prepare its model first)
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(metrics) and any(
                json.loads(line)["step"] >= kill_after_step for line in open(metrics).read().splitlines()
            ):
                break
            time.sleep(0.02)
        time.sleep(0.05)  # somewhere in the next step (a step of this tiny run takes ~0.1 s)
        proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    return proc.returncode, stderr


@pytest.fixture(scope="module")
def reference(tiny_model_dir, arithmetic_files, tmp_path_factory):
    """An uninterrupted run, in this process."""
    out = tmp_path_factory.mktemp("uninterrupted")
    reward = out / "reward.py"
    reward.write_text(REWARD_FILE)
    from verl.config import load_config

    config = load_config("grpo", overrides(tiny_model_dir, arithmetic_files, out, reward))
    trainer = RLTrainer(config)
    try:
        trainer.fit()
        policy = (
            trainer.controller.group("actor_rollout").workers[0].actor_model
        )  # the trained policy, in memory
    finally:
        trainer.shutdown()
    return out, reward, metrics_by_step(out), policy


def test_sigkill_mid_training_then_resume_matches_uninterrupted(
    reference, tiny_model_dir, arithmetic_files, tmp_path
):
    _, reward, expected, _ = reference
    args = overrides(tiny_model_dir, arithmetic_files, tmp_path, reward)
    code, _ = run_cli(args, kill_after_step=2)
    assert code == -signal.SIGKILL
    done = int((tmp_path / "latest_checkpointed_iteration.txt").read_text())
    assert 1 <= done < TOTAL_STEPS
    code, stderr = run_cli(args)  # trainer.resume_mode=auto
    assert code == 0, stderr[-3000:]
    assert "resumed from" in stderr
    resumed = metrics_by_step(tmp_path)
    assert sorted(resumed) == sorted(expected) == list(range(TOTAL_STEPS + 1))
    for step in range(1, TOTAL_STEPS + 1):
        assert resumed[step] == expected[step], f"step {step} differs after resuming from step {done}"


def test_kill_during_a_save_resumes_from_the_previous_checkpoint(
    reference, tiny_model_dir, arithmetic_files, tmp_path
):
    _, reward, expected, _ = reference
    args = overrides(tiny_model_dir, arithmetic_files, tmp_path, reward)
    code, _ = run_cli(args, env={CRASH_ENV: "3"})  # SIGKILL after checkpoint 3's parts are written
    assert code == -signal.SIGKILL
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (tmp_path / "global_step_3.tmp").is_dir() and not (tmp_path / "global_step_3").exists()
    code, stderr = run_cli(args)
    assert code == 0, stderr[-3000:]
    assert not (tmp_path / "global_step_3.tmp").exists()
    resumed = metrics_by_step(tmp_path)
    for step in range(1, TOTAL_STEPS + 1):
        assert resumed[step] == expected[step], f"step {step} differs"


def test_export_round_trip_generates_the_same_greedy_text(reference, tmp_path):
    run_dir, _, _, policy = reference
    exported = export_hf(run_dir, tmp_path / "hf")  # a run directory: its latest checkpoint
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    trained = policy.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    tokenizer = load_tokenizer(exported)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4="}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    greedy = dict(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(model.generate(**prompt, **greedy), policy.eval().generate(**prompt, **greedy))
    final = torch.load(run_dir / f"global_step_{TOTAL_STEPS}" / "trainer_state.pt", weights_only=False)
    assert final["global_step"] == TOTAL_STEPS


def test_async_save_writes_the_same_checkpoints_without_changing_the_run(
    reference, tiny_model_dir, arithmetic_files, tmp_path
):
    from verl.config import load_config

    run_dir, reward, expected, _ = reference
    config = load_config(
        "grpo",
        overrides(
            tiny_model_dir,
            arithmetic_files,
            tmp_path,
            reward,
            "trainer.async_save=true",
            "trainer.max_actor_ckpt_to_keep=2",
        ),
    )
    trainer = RLTrainer(config)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    assert metrics_by_step(tmp_path) == expected
    kept = sorted(p.name for p in tmp_path.glob("global_step_*"))
    assert kept == [f"global_step_{TOTAL_STEPS - 1}", f"global_step_{TOTAL_STEPS}"]  # the cap of 2
    last = f"global_step_{TOTAL_STEPS}"
    assert all((tmp_path / last / "actor" / name).is_file() for name in ("optim.pt", "rng_rank0.pt"))
    weights = "actor/model.safetensors"  # the same weights as the synchronous run's, byte for byte
    assert (tmp_path / last / weights).read_bytes() == (run_dir / last / weights).read_bytes()


ASYNC_MODES = {
    "one_step_off": (
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=1",
    ),
    "streaming": ("trainer.v1.trainer_mode=separate_async", "async_training.staleness_threshold=0.5"),
    "colocate": ("trainer.v1.trainer_mode=colocate_async",),
    # the features that once refused the asynchronous modes, combined with them
    "one_step_off_lora_remax": (
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.model.lora_rank=8",
        "algorithm.adv_estimator=remax",
    ),
    "colocate_dapo": ("trainer.v1.trainer_mode=colocate_async", "algorithm.filter_groups.enable=true"),
}


@pytest.mark.parametrize("mode", list(ASYNC_MODES))
def test_one_step_off_sigkill_then_resume_matches_uninterrupted(
    tiny_model_dir, arithmetic_files, tmp_path, mode
):
    """trainer.v1.trainer_mode=separate_async: the batch generated ahead is in the checkpoint, so a resumed
    run trains exactly what the uninterrupted one did, staleness included. Streaming (fully async) and
    colocate_async: the pool of unfinished and unclaimed generations too."""
    expected = assert_sigkill_resumes_exactly(tiny_model_dir, arithmetic_files, tmp_path, *ASYNC_MODES[mode])
    staleness = [expected[step]["training/off_policy/trajectory_staleness/max"] for step in expected if step]
    assert max(staleness) >= 1.0, staleness  # stale samples trained


@pytest.mark.parametrize(
    "mode",
    [
        ("trainer.v1.trainer_mode=colocate_async",),
        ("trainer.v1.trainer_mode=separate_async", "async_training.staleness_threshold=0.5"),
    ],
    ids=["colocate", "streaming"],
)
def test_a_pool_of_multi_turn_trajectories_resumes_exactly(tiny_model_dir, arithmetic_files, tmp_path, mode):
    """Agent loops in the streaming pool: trajectories with an inserted turn, continued across weight updates
    and, after SIGKILL, replayed from the checkpoint's record of their turns to the same batches."""
    expected = assert_sigkill_resumes_exactly(
        tiny_model_dir, arithmetic_files, tmp_path, *mode, *two_turns_overrides(tmp_path)
    )
    assert all(expected[step]["num_turns/min"] == 4 for step in expected if step)
    # trajectories whose first and last tokens two policy versions drew: cut by a collect and continued, and
    # (after step 2) resumed part-way from the checkpoint
    spans = [expected[step]["fully_async/partial/max_partial_span"] for step in expected if step]
    assert max(spans) >= 1.0, spans


@pytest.mark.parametrize(
    "mode",
    [("trainer.v1.trainer_mode=separate_async",), ("trainer.v1.trainer_mode=colocate_async",)],
    ids=["one_step_off", "colocate"],
)
def test_the_tool_recipe_resumes_exactly_in_the_async_modes(tmp_path, mode):
    """``verl run --config arithmetic_tools`` (its model warm-started, briefly, to call the calculator) in
    separate_async and colocate_async: real tool calls in trajectories generated ahead or in the pool across
    weight updates, and the same run after SIGKILL and resume."""

    def args_for(out):
        return [
            *mode,
            "prepare.sft.total_training_steps=150",  # enough for about half the samples to call the calculator
            "prepare.task_kwargs.sft_size=128",
            "prepare.task_kwargs.tool_demos=64",
            "data.train_batch_size=4",
            "data.val_max_samples=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
            f"trainer.total_training_steps={TOTAL_STEPS}",
            "trainer.test_freq=3",
            "trainer.save_freq=1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out}",
        ]

    expected = assert_resumes(tmp_path, args_for, recipe="arithmetic_tools")
    calls = [expected[step]["tool_call_counts/mean"] for step in expected if step]
    assert min(calls) > 0, calls
    staleness = [expected[step]["training/off_policy/trajectory_staleness/max"] for step in expected if step]
    assert max(staleness) >= 1.0, staleness


def assert_sigkill_resumes_exactly(model_dir, files, tmp_path, *extra):
    """An uninterrupted run, then the same run SIGKILLed after step 2 and resumed: every non-timing metric of
    every step equal. Returns the uninterrupted run's metrics by step."""
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FILE)
    return assert_resumes(tmp_path, lambda out: overrides(model_dir, files, out, reward, *extra))


def assert_resumes(tmp_path, args_for, recipe="grpo"):
    """:func:`assert_sigkill_resumes_exactly` for any recipe: ``args_for(run_dir)`` gives a run's overrides."""
    reference_dir = tmp_path / "uninterrupted"
    code, stderr = run_cli(args_for(reference_dir), recipe=recipe)
    assert code == 0, stderr[-3000:]
    expected = metrics_by_step(reference_dir)
    out = tmp_path / "killed"
    args = args_for(out)
    code, _ = run_cli(args, kill_after_step=2, recipe=recipe)
    assert code == -signal.SIGKILL
    done = int((out / "latest_checkpointed_iteration.txt").read_text())
    assert 1 <= done < TOTAL_STEPS
    code, stderr = run_cli(args, recipe=recipe)
    assert code == 0, stderr[-3000:]
    resumed = metrics_by_step(out)
    assert sorted(resumed) == sorted(expected) == list(range(TOTAL_STEPS + 1))
    for step in range(1, TOTAL_STEPS + 1):
        assert resumed[step] == expected[step], f"step {step} differs after resuming from step {done}"
    return expected
